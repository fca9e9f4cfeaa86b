"""RPC: a model split over two ``python -m llama_cpp rpc-server`` processes and the local CPU gives the
local run's greedy output and embeddings; endpoints are probed before llama.cpp connects."""

from __future__ import annotations

import logging
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama, LlamaEmbedding, backends
from llama_cpp._errors import ModelLoadError
from llama_cpp._placement import rpc

from .conftest import REPO, free_port


def test_split_over_two_servers_and_the_cpu_equals_local(moe_path, rpc_pair, caplog):
    with Llama(str(moe_path), n_ctx=256, verbose=False) as llm:
        local = llm("The capital of", max_tokens=24, temperature=0.0)["choices"][0]["text"]
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"):
        # 4 layers and the output: layers 0-1 stay on the CPU, 2-3 and the output go to the servers
        with Llama(str(moe_path), n_ctx=256, verbose=False, rpc_servers=",".join(rpc_pair), n_gpu_layers=3,
                   tensor_split=[1, 1]) as llm:
            remote = llm("The capital of", max_tokens=24, temperature=0.0)["choices"][0]["text"]
    assert remote == local
    log = "\n".join(r.getMessage() for r in caplog.records)
    assigned = dict(re.findall(r"layer +(\d+) assigned to device (\S+),", log))
    assert {assigned["0"], assigned["1"]} == {"CPU"}
    # the model runs in a worker process, which names the two servers' devices RPC0 and RPC1
    assert {assigned["2"], assigned["3"], assigned["4"]} == {"RPC0", "RPC1"}
    assert len({assigned["2"], assigned["4"]}) == 2  # both servers hold layers
    for ep in rpc_pair:
        assert re.search(rf"RPC\d\[{re.escape(ep)}\] model buffer size", log)


def test_embeddings_over_rpc_equal_local(rpc_pair):
    path = fixture_path("embedding_model", pooling="mean", arch="llama")
    texts = ["a first sentence", "another one, longer than the first", "x"]
    with LlamaEmbedding(path) as emb:
        local = emb.embed(texts)
    with LlamaEmbedding(path, rpc_servers=rpc_pair, n_gpu_layers=-1) as emb:
        remote = emb.embed(texts)
    np.testing.assert_allclose(remote, local, rtol=1e-5, atol=1e-6)


def test_backends_list_both_remote_devices_with_memory(rpc_pair):
    rpc.add_servers(rpc_pair)
    remote = {b.name: b for b in backends() if b.name.startswith("RPC[")}
    for ep in rpc_pair:
        b = remote[f"RPC[{ep}]"]
        assert b.loaded and len(b.devices) == 1
        dev = b.devices[0]
        assert dev.name.startswith("RPC") and dev.description == ep
        assert dev.memory_total > 0 and 0 < dev.memory_free <= dev.memory_total


def test_a_model_uses_only_the_servers_it_names(moe_path, rpc_pair, caplog):
    rpc.add_servers(rpc_pair)
    with caplog.at_level(logging.INFO, logger="llama_cpp.native"):
        with Llama(str(moe_path), n_ctx=64, verbose=False, n_gpu_layers=-1):
            pass
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "RPC" not in "".join(re.findall(r"using device .*", log))
    assert not re.search(r"RPC\d\[\S+\] model buffer", log)


def test_unreachable_endpoint_is_model_load_error_naming_it(moe_path):
    ep = f"127.0.0.1:{free_port()}"
    with pytest.raises(ModelLoadError, match=re.escape(f"RPC server {ep} is unreachable")):
        Llama(str(moe_path), n_ctx=64, verbose=False, rpc_servers=ep, n_gpu_layers=-1)


def _fake_server(answer: bytes | None) -> tuple[str, threading.Thread, socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            if answer is not None:
                conn.sendall(answer)
                conn.recv(1)
            else:
                conn.recv(1)  # silent until the client gives up

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", t, srv


def test_version_mismatch_is_refused_with_both_versions(moe_path):
    rsp = struct.pack("<BBBB24s", 6, 3, 1, 0, bytes(24))
    ep, t, srv = _fake_server(struct.pack("<Q", len(rsp)) + rsp)
    with srv, pytest.raises(ModelLoadError) as err:
        Llama(str(moe_path), n_ctx=64, verbose=False, rpc_servers=ep, n_gpu_layers=-1)
    assert f"RPC server {ep} speaks RPC protocol 6.3.1" in str(err.value)
    assert "this build's client speaks 7.0.0" in str(err.value)
    t.join(5)


def test_silent_endpoint_times_out_naming_it():
    ep, t, srv = _fake_server(None)
    with srv, pytest.raises(ModelLoadError, match=re.escape(f"RPC server {ep} accepted the connection but did "
                                                            "not answer HELLO within 0.5 s")):
        rpc.probe(ep, timeout=0.5)
    t.join(5)


def test_rpc_server_refuses_an_unknown_device():
    proc = subprocess.run([sys.executable, "-m", "llama_cpp", "rpc-server", "--port", str(free_port()),
                           "--device", "NoSuchDev"], check=False, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown device 'NoSuchDev'; this machine has: CPU"


def test_rpc_server_binds_loopback_and_warns(start_rpc_server):
    ep, proc = start_rpc_server("--device", "CPU")
    assert ep.startswith("127.0.0.1:")
    proc.terminate()
    _out, err = proc.communicate(timeout=30)
    assert "the RPC server is unauthenticated and unencrypted" in err
    assert "never expose it to an open network" in err


def test_mtp_model_drafts_on_a_remote_device(rpc_pair, caplog):
    from llama_cpp import SpecConfig

    path = fixture_path("qwen35_mtp", form="echo")
    kw = {"n_ctx": 256, "verbose": False}
    with Llama(path, **kw) as llm:
        plain = llm("hello world", max_tokens=24, temperature=0.0)["choices"][0]["text"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"):
        with Llama(path, speculative=SpecConfig("draft-mtp", draft_n_max=3), rpc_servers=rpc_pair[:1],
                   n_gpu_layers=-1, **kw) as llm:
            spec = llm("hello world", max_tokens=24, temperature=0.0)["choices"][0]["text"]
            stats = llm.last_speculative_stats
    assert spec == plain
    assert stats is not None and stats.accepted > 0
    log = "\n".join(r.getMessage() for r in caplog.records)
    # every layer, the NextN (MTP) block included, is on the remote device; the target and the MTP
    # draft context each reserve their compute buffer there
    # (the model runs in a worker process, which names the server's device RPC0)
    assigned = set(re.findall(r"layer +\d+ assigned to device (\S+),", log))
    assert assigned == {"RPC0"}
    assert re.search(rf"RPC0\[{re.escape(rpc_pair[0])}\] model buffer size", log)
    assert len(re.findall(rf"RPC\d\[{re.escape(rpc_pair[0])}\] compute buffer size =", log)) >= 2


def test_worker_reports_a_killed_server_by_name_and_reloads(moe_path, start_rpc_server):
    from llama_cpp import LlamaWorker, WorkerLostError

    eps = [start_rpc_server(), start_rpc_server()]
    endpoints = ",".join(ep for ep, _ in eps)
    with Llama(str(moe_path), n_ctx=256, verbose=False) as llm:
        local = llm("hello world", max_tokens=24, temperature=0.0)["choices"][0]["text"]
    kw = {"n_ctx": 256, "verbose": False, "rpc_servers": endpoints, "n_gpu_layers": -1}
    with LlamaWorker(moe_path, **kw) as w:
        assert w("hello world", max_tokens=24, temperature=0.0)["choices"][0]["text"] == local
        stream = w("hello world", max_tokens=200, temperature=0.0, stream=True)
        next(stream)
        victim, proc = eps[1]
        proc.kill()
        t = time.monotonic()
        with pytest.raises(WorkerLostError) as err:
            for _ in stream:
                pass
        assert time.monotonic() - t < 10
        assert f"RPC server {victim} is unreachable" in str(err.value)
        assert eps[0][0] not in str(err.value)
        with pytest.raises(WorkerLostError):
            w.tokenize(b"hello")
    # the interpreter lives on: reload over a fresh server
    fresh = start_rpc_server()[0]
    with LlamaWorker(moe_path, **{**kw, "rpc_servers": f"{eps[0][0]},{fresh}"}) as w:
        assert w("hello world", max_tokens=24, temperature=0.0)["choices"][0]["text"] == local

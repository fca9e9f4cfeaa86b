"""``Llama(..., rpc_servers=...)`` holds its model in a worker process: the same outputs as a local
run through the public API, and a killed or restarted ``rpc-server`` is an exception naming it within
seconds, with the interpreter alive and ``reload()`` working; ``rpc_isolation=False`` loads in-process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from llama_cpp import Llama, LlamaError, LlamaWorker, NotInProcessError, WorkerLostError
from llama_cpp._errors import BusyError, ClosedError, ModelLoadError

from .conftest import REPO, _wait_ready

KW = {"n_ctx": 256, "verbose": False, "n_gpu_layers": -1, "chat_format": "chatml"}
PROMPT = "hello world"
# a generation that lasts far longer than the 50 ms after which the interruption tests press Ctrl-C
LONG = {**KW, "n_ctx": 16384}
MESSAGES = [{"role": "user", "content": "hello"}]


def _outputs(llm: Llama) -> dict:
    out = {
        "text": llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"],
        "stream": "".join(c["choices"][0]["text"] for c in llm.create_completion(PROMPT, max_tokens=16,
                                                                                 temperature=0.0, stream=True)),
        "chat": llm.create_chat_completion(MESSAGES, max_tokens=12, temperature=0.0)["choices"][0]["message"],
        "chat_stream": [c["choices"][0]["delta"] for c in llm.create_chat_completion(
            MESSAGES, max_tokens=12, temperature=0.0, stream=True)],
        "tokens": llm.tokenize(b"hello world"),
        "n_ctx": llm.n_ctx(), "n_vocab": llm.n_vocab(), "bos": llm.token_bos(), "eos": llm.token_eos(),
        "metadata": llm.metadata,
    }
    out["detok"] = llm.detokenize(out["tokens"])
    llm.reset()
    llm.eval(out["tokens"])
    out["n_tokens"] = llm.n_tokens
    state = llm.save_state()
    llm.n_tokens = 2  # a rewind
    out["rewound"] = list(llm.input_ids)
    llm.load_state(state)
    out["restored"] = llm.n_tokens
    return out


@pytest.fixture(scope="module")
def local(moe_path) -> dict:
    with Llama(str(moe_path), **KW) as llm:
        return _outputs(llm)


@contextlib.contextmanager
def _fake_server(endpoint: str, hello: bytes) -> Iterator[None]:
    """A listener on ``endpoint`` that answers one HELLO with ``hello`` (another protocol version)."""
    host, _, port = endpoint.rpartition(":")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            conn.sendall(struct.pack("<Q", len(hello)) + hello)
            conn.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        t.join(5)
        srv.close()


def _restart(endpoint: str) -> subprocess.Popen:
    """``python -m llama_cpp rpc-server`` again on ``endpoint``'s port (the caller stops it)."""
    port = endpoint.rpartition(":")[2]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp", "rpc-server", "--port", port, "--threads", "1"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_ready(endpoint, proc)
    return proc


def test_rpc_llama_runs_in_a_worker_and_equals_local(moe_path, start_rpc_server, local, caplog):
    eps = [start_rpc_server()[0], start_rpc_server()[0]]
    with caplog.at_level(logging.DEBUG, logger="llama_cpp.native"):
        llm = Llama(str(moe_path), rpc_servers=",".join(eps), **KW)
    with llm:
        assert type(llm) is LlamaWorker and isinstance(llm, Llama)
        assert llm.worker_pid != os.getpid()
        assert llm.sampling_convention == "upstream" and llm.n_threads >= 1  # plain attributes, read there
        assert _outputs(llm) == local
        assert re.fullmatch(rf"LlamaWorker\('{re.escape(str(moe_path))}', rpc_servers='{re.escape(','.join(eps))}', "
                            r"worker pid \d+\)", repr(llm))
        # llama.cpp's load log of the worker reaches this process's loggers
        log = "\n".join(r.getMessage() for r in caplog.records)
        for ep in eps:
            assert re.search(rf"RPC\d\[{re.escape(ep)}\] model buffer size", log)
        # in-process handles are refused by name, with the opt-out
        for get in (lambda: llm.model, lambda: llm.ctx, llm.native_model, llm.native_context, lambda: llm._ctx,
                    lambda: llm.sequence, llm.chat_formatter):
            with pytest.raises(NotInProcessError, match="runs its model in a worker process.*rpc_isolation=False"):
                get()
        assert not hasattr(llm, "ctx")  # an AttributeError too, for duck typing
        with pytest.raises(NotInProcessError, match=r"^llm\.model \(the native llama_model pointer\) is not available"):
            llm.model
        with pytest.raises(TypeError, match=r"cannot be sent to the worker process.*Llama\(\.\.\., rpc_isolation=False\)"):
            llm(PROMPT, max_tokens=2, logits_processor=[lambda ids, scores: scores])
        assert llm.tokenize(b"hello") == local["tokens"][:len(llm.tokenize(b"hello"))]  # still usable
        # one call at a time: an open stream makes other calls busy but tokenize/detokenize, as in-process
        stream = llm(PROMPT, max_tokens=8, temperature=0.0, stream=True)
        first = next(stream)["choices"][0]["text"]
        with pytest.raises(BusyError):
            llm.n_ctx()
        assert llm.tokenize(b"hello world") == local["tokens"]
        assert llm.detokenize(local["tokens"]) == local["detok"]
        rest = "".join(c["choices"][0]["text"] for c in stream)
        assert first + rest == local["stream"][:len(first + rest)] and rest
        assert llm.n_ctx() == local["n_ctx"]
        data, pid = pickle.dumps(llm), llm.worker_pid
    assert "closed" in repr(llm)
    with pytest.raises(ClosedError):
        llm.n_ctx()
    # pickling re-creates it from its arguments: a new worker, same model (once the first let the
    # servers go: ggml's RPC server serves one client at a time)
    with pickle.loads(data) as clone:
        assert type(clone) is LlamaWorker and clone.worker_pid not in (None, pid)
        assert clone(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]


def test_killed_server_mid_generation_is_an_error_naming_it_then_reload(moe_path, start_rpc_server, local):
    (ep0, _p0), (ep1, p1) = start_rpc_server(), start_rpc_server()
    llm = Llama(str(moe_path), rpc_servers=[ep0, ep1], **KW)
    restarted = None
    try:
        stream = llm(PROMPT, max_tokens=200, temperature=0.0, stream=True)
        next(stream)
        p1.kill()
        p1.wait(10)
        t = time.monotonic()
        with pytest.raises(WorkerLostError) as err:
            for _ in stream:
                pass
        assert time.monotonic() - t < 10
        msg = str(err.value)
        assert f"RPC server {ep1} is unreachable" in msg and ep0 not in msg.partition("unreachable")[0]
        assert "killed by SIGABRT" in msg and "reload()" in msg  # llama.cpp's abort, in the worker
        assert isinstance(err.value, LlamaError)
        with pytest.raises(WorkerLostError):
            llm.tokenize(b"hello")
        assert "worker lost: call reload()" in repr(llm)
        # reload probes every endpoint again: the lost one is still gone, by name, before any worker starts
        with pytest.raises(ModelLoadError, match=re.escape(f"RPC server {ep1} is unreachable")):
            llm.reload()
        # a server of another protocol version there now: refused with its version, before llama.cpp connects
        with _fake_server(ep1, struct.pack("<BBBB24s", 6, 3, 1, 0, bytes(24))):
            with pytest.raises(ModelLoadError, match=re.escape(f"RPC server {ep1} speaks RPC protocol 6.3.1")):
                llm.reload()
        # the same endpoint restarted: reload finds it and gives the local run's output again
        restarted = _restart(ep1)
        llm.reload()
        assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
    finally:
        llm.close()
        if restarted is not None:
            restarted.kill()
            restarted.wait(10)


def test_server_restarted_between_calls_is_noticed(moe_path, start_rpc_server, local):
    ep, proc = start_rpc_server()
    restarted = None
    with Llama(str(moe_path), rpc_servers=ep, **KW) as llm:
        try:
            assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
            proc.kill()
            proc.wait(10)
            restarted = _restart(ep)
            # the worker's connection went with the old server: llama.cpp aborts the worker, not us
            with pytest.raises(WorkerLostError, match=rf"every RPC server \({re.escape(ep)}\) answers now: one may "
                                                      r"have restarted.*call reload\(\)"):
                llm(PROMPT, max_tokens=16, temperature=0.0)
            llm.reload()
            assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
        finally:
            if restarted is not None:
                restarted.kill()
                restarted.wait(10)


def test_rpc_isolation_false_loads_in_process(moe_path, start_rpc_server, local):
    ep = start_rpc_server()[0]
    with Llama(str(moe_path), rpc_servers=ep, rpc_isolation=False, **KW) as llm:
        assert type(llm) is Llama
        assert llm.model and llm.native_model().n_vocab == local["n_vocab"]
        assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
    with pytest.raises(TypeError, match="rpc_isolation must be a bool"):
        Llama(str(moe_path), rpc_isolation="no", **KW)


def test_worker_arguments_that_do_not_pickle_are_refused_by_name(moe_path, start_rpc_server):
    ep = start_rpc_server()[0]
    with pytest.raises(TypeError, match=r"progress_callback=.*cannot be sent to the worker process.*"
                                        r"rpc_isolation=False"):
        Llama(str(moe_path), rpc_servers=ep, progress_callback=lambda p: True, **KW)
    with pytest.raises(TypeError, match="rpc_isolation must be True for LlamaWorker"):
        LlamaWorker(moe_path, rpc_isolation=False, **KW)


def test_a_script_without_a_main_guard_works(moe_path, start_rpc_server, local, tmp_path):
    # the worker is a fresh interpreter, not multiprocessing's spawn (which would run this script
    # again in the child and fail on its unguarded top level)
    ep = start_rpc_server()[0]
    script = tmp_path / "plain.py"
    script.write_text("import json\nfrom llama_cpp import Llama\n"
                      f"llm = Llama({str(moe_path)!r}, rpc_servers={ep!r}, **{KW!r})\n"
                      f"print(json.dumps([type(llm).__name__, llm({PROMPT!r}, max_tokens=16, temperature=0.0)"
                      "['choices'][0]['text']]))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f'["LlamaWorker", {json.dumps(local["text"])}]'


def test_embedding_over_rpc_runs_in_a_worker(start_rpc_server):
    import numpy as np

    from build_tools.fixtures import fixture_path
    from llama_cpp import LlamaEmbedding, LlamaEmbeddingWorker

    path = fixture_path("embedding_model", pooling="mean", arch="llama")
    texts = ["a first sentence", "another one, longer than the first"]
    with LlamaEmbedding(path) as emb:
        local, n_ctx = emb.embed(texts), emb.n_ctx()
    ep, proc = start_rpc_server()
    restarted = None
    emb = LlamaEmbedding(path, rpc_servers=ep, n_gpu_layers=-1)
    try:
        assert type(emb) is LlamaEmbeddingWorker and isinstance(emb, LlamaEmbedding)
        np.testing.assert_allclose(emb.embed(texts), local, rtol=1e-5, atol=1e-6)
        assert emb.n_ctx() == n_ctx and emb.n_embd_out == len(local[0])
        with pytest.raises(NotInProcessError, match=r"LlamaEmbedding\(\.\.\., rpc_isolation=False\)"):
            emb._parts()
        proc.kill()
        proc.wait(10)
        with pytest.raises(WorkerLostError, match=rf"RPC server {re.escape(ep)} is unreachable"):
            emb.embed(texts)
        restarted = _restart(ep)
        emb.reload()
        np.testing.assert_allclose(emb.embed(texts), local, rtol=1e-5, atol=1e-6)
    finally:
        emb.close()
        if restarted is not None:
            restarted.kill()
            restarted.wait(10)


@pytest.fixture
def default_sigint():
    """Ctrl-C raises KeyboardInterrupt here whatever handler an earlier test or plugin left installed."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupted_call_leaves_the_worker_usable(moe_path, local, default_sigint):
    import signal

    # no RPC server needed: LlamaWorker holds any model in a worker process
    with LlamaWorker(moe_path, **LONG) as llm:
        # Ctrl-C mid-call, sent to the process as a terminal sends it (raise_signal from this thread would
        # reach only the timer's thread, and the main thread would see it only after the reply)
        timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                llm(PROMPT, max_tokens=LONG["n_ctx"] - 8, temperature=0.0, stop=[])
        finally:
            timer.cancel()  # a call that ended first must not leave the signal to hit the test session
            timer.join()
        # the interrupted call's reply is read and dropped; the next call gets its own answer
        assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]


def test_an_interrupted_stream_leaves_the_worker_usable(moe_path, local, default_sigint):
    import signal

    with LlamaWorker(moe_path, **LONG) as llm:
        stream = llm(PROMPT, max_tokens=LONG["n_ctx"] - 8, temperature=0.0, stream=True, stop=[])
        next(stream)
        timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                for _ in stream:
                    pass
        finally:
            timer.cancel()
            timer.join()
        assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
        # a stream left after its end and one closed early both leave it usable
        assert "".join(c["choices"][0]["text"] for c in llm(PROMPT, max_tokens=16, temperature=0.0,
                                                            stream=True)) == local["text"]
        early = llm(PROMPT, max_tokens=16, temperature=0.0, stream=True)
        next(early)
        early.close()
        assert llm.tokenize(b"hello world") == local["tokens"]


def test_in_process_loads_probe_a_registered_endpoint_again(moe_path, start_rpc_server, local):
    ep, proc = start_rpc_server()
    kw = {**KW, "rpc_servers": ep, "rpc_isolation": False}
    restarted = None
    try:
        with Llama(str(moe_path), **kw) as llm:
            # a second model while the first holds the server's one connection: the re-probe is not answered
            # (the server is busy with this process) and the load shares that connection
            with Llama(str(moe_path), **kw) as other:
                assert other(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
            assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
        proc.kill()
        proc.wait(10)
        # gone, then another version there: refused by name before llama.cpp connects (it would abort)
        with pytest.raises(ModelLoadError, match=re.escape(f"RPC server {ep} is unreachable")):
            Llama(str(moe_path), **kw)
        with _fake_server(ep, struct.pack("<BBBB24s", 6, 3, 1, 0, bytes(24))):
            with pytest.raises(ModelLoadError, match=re.escape(f"RPC server {ep} speaks RPC protocol 6.3.1")):
                Llama(str(moe_path), **kw)
        restarted = _restart(ep)
        with Llama(str(moe_path), **kw) as llm:
            assert llm(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"] == local["text"]
    finally:
        if restarted is not None:
            restarted.kill()
            restarted.wait(10)


def test_tokenize_from_another_thread_during_a_stream(moe_path, local):
    with LlamaWorker(moe_path, **KW) as llm:
        results, errors = [], []

        def tokenize_many() -> None:
            try:
                for _ in range(40):
                    results.append(llm.tokenize(b"hello world"))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        stream = llm(PROMPT, max_tokens=16, temperature=0.0, stream=True)
        text = [next(stream)["choices"][0]["text"]]
        t = threading.Thread(target=tokenize_many)
        t.start()
        text += [c["choices"][0]["text"] for c in stream]
        t.join(60)
        assert not errors and results == [local["tokens"]] * 40
        assert "".join(text) == local["stream"]

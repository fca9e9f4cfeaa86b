"""The placement options through the CLI (``python -m llama_cpp complete``, llama.cpp's option names)
and the server's model settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from llama_cpp.server.__main__ import parse_settings
from llama_cpp.server.models import ServedModel

from .conftest import REPO


def _complete(model, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "llama_cpp", "complete", str(model), "hello world", "-n", "12",
                           "--temp", "0", "-q", *extra], check=False, capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)


def test_cli_complete_over_rpc_with_experts_on_the_cpu(moe_path, start_rpc_server):
    # servers of its own: ggml's RPC server serves one client at a time, and this process holds rpc_pair's
    eps = [start_rpc_server()[0], start_rpc_server()[0]]
    local = _complete(moe_path)
    assert local.returncode == 0, local.stderr
    remote = _complete(moe_path, "--rpc", ",".join(eps), "-ngl", "-1", "-ts", "1,1", "-cmoe", "-ot",
                       r"blk\.0\.attn_q=CPU")
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stdout.strip()


def test_cli_refuses_bad_placement_by_name(moe_path):
    proc = _complete(moe_path, "-dev", "NoSuchGPU0")
    assert proc.returncode != 0 and "unknown device 'NoSuchGPU0'" in proc.stderr
    proc = _complete(moe_path, "-ot", "exps=NOPE")
    assert proc.returncode != 0 and "unknown buffer type 'NOPE'" in proc.stderr


def test_server_settings_reach_llama(moe_path):
    _server, models = parse_settings(["--model", str(moe_path), "--rpc_servers", "127.0.0.1:50052",
                                      "--devices", "RPC0", "--cpu_moe", "true", "--n_cpu_moe", "2",
                                      "--override_tensor", "a=CPU", "b=CPU", "--fit", "true", "--fit_target",
                                      "512,2048", "--fit_ctx", "1024"])
    kw = ServedModel(models[0])._llama_kwargs(serial=True)
    assert kw["rpc_servers"] == "127.0.0.1:50052" and kw["devices"] == ["RPC0"]
    assert kw["rpc_isolation"] is True and models[0].serial  # a worker process, served one request at a time
    assert kw["cpu_moe"] is True and kw["n_cpu_moe"] == 2 and kw["fit"] is True
    assert kw["fit_target"] == "512,2048" and kw["fit_ctx"] == 1024
    assert kw["override_tensor"] == ["a=CPU", "b=CPU"]
    _server, models = parse_settings(["--model", str(moe_path), "--rpc_servers", "127.0.0.1:50052",
                                      "--rpc_isolation", "false"])
    kw = ServedModel(models[0])._llama_kwargs(serial=False)
    assert kw["rpc_isolation"] is False and not models[0].serial  # slots in the server's process


def test_cli_fit_on_fits_the_context(moe_path):
    proc = _complete(moe_path, "--fit", "on", "-c", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["choices"][0]["text"]
    proc = _complete(moe_path, "--fit", "on", "-c", "0", "-fitt", "lots")
    assert proc.returncode != 0 and "fit_target must be MiB per device" in proc.stderr


def test_server_refuses_a_bad_fit_target(moe_path):
    import pytest

    with pytest.raises(SystemExit):
        parse_settings(["--model", str(moe_path), "--fit", "true", "--fit_target", "1G"])


def test_cli_complete_over_rpc_shows_load_progress(moe_path, start_rpc_server):
    ep = start_rpc_server()[0]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "llama_cpp", "complete", str(moe_path), "hello world", "-n", "4",
                           "--temp", "0", "--rpc", ep, "-ngl", "-1"], check=False, capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "loading model: 100%" in proc.stderr  # the progress callback ran in the model's worker process

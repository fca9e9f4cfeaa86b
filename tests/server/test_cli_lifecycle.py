"""Settings from flags, environment and config files; the process's start and SIGTERM shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from llama_cpp.server.__main__ import parse_settings
from llama_cpp.server.settings import ConfigFileSettings, ModelSettings, ServerSettings

from .conftest import free_port


def test_flags(spm_path):
    server, models = parse_settings(["--model", str(spm_path), "--n_ctx", "128", "--embedding", "true",
                                     "--tensor_split", "0.5", "0.5", "--api_key", "k", "--n_parallel", "4",
                                     "--kv_overrides", "a=int:1", "b=bool:true"])
    assert server.host == "127.0.0.1" and server.port == 8000 and server.api_key == "k"
    (m,) = models
    assert (m.model, m.n_ctx, m.embedding, m.tensor_split, m.n_parallel) == (str(spm_path), 128, True, [0.5, 0.5], 4)
    assert m.kv_overrides == ["a=int:1", "b=bool:true"]


def test_bad_flags_exit_with_usage(spm_path, capsys):
    with pytest.raises(SystemExit) as info:
        parse_settings(["--model", str(spm_path), "--embedding", "maybe"])
    assert info.value.code == 2 and "not a boolean" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_settings(["--model", str(spm_path), "--hf_model_repo_id", "x/y"])
    assert "hf_model_repo_id" in capsys.readouterr().err


def test_environment_variables(monkeypatch, spm_path):
    monkeypatch.setenv("MODEL", str(spm_path))
    monkeypatch.setenv("N_CTX", "333")
    monkeypatch.setenv("API_KEY", "from-env")
    assert ModelSettings().n_ctx == 333
    assert ServerSettings().api_key == "from-env"
    server, (m,) = parse_settings(["--n_ctx", "64"])  # a flag wins over the environment
    assert m.n_ctx == 64 and m.model == str(spm_path) and server.api_key == "from-env"


def test_config_files(tmp_path, spm_path, embed_path):
    cfg = {"host": "127.0.0.1", "port": 9000, "models": [
        {"model": str(spm_path), "model_alias": "chat", "n_parallel": 2},
        {"model": str(embed_path), "model_alias": "embed", "embedding": True}]}
    j = tmp_path / "c.json"
    j.write_text(json.dumps(cfg))
    server, models = parse_settings(["--config_file", str(j)])
    assert server.port == 9000 and [m.alias for m in models] == ["chat", "embed"]
    y = tmp_path / "c.yaml"
    y.write_text("port: 9001\nmodels:\n"
                 f"  - model: {spm_path}\n    model_alias: a\n  - model: {spm_path}\n    model_alias: b\n")
    server, models = parse_settings(["--config_file", str(y)])
    assert server.port == 9001 and [m.alias for m in models] == ["a", "b"]
    with pytest.raises(ValueError, match="share the name"):
        ConfigFileSettings.model_validate({"models": [{"model": "x"}, {"model": "x"}]})
    with pytest.raises(ValueError, match="no models"):
        ConfigFileSettings.model_validate({"models": []})
    with pytest.raises(SystemExit):
        parse_settings(["--config_file", str(tmp_path / "missing.json")])


def _start(spm_path, *flags: str):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(spm_path), "--model_alias", "m",
                             "--port", str(port), "--n_threads", "1", "--n_threads_batch", "1", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.stdout.read().decode(errors="replace")[-3000:])
        time.sleep(0.1)


def _stream_in_thread(url: str, max_tokens: int, first: threading.Event, out: dict) -> threading.Thread:
    def run() -> None:
        lines = []
        try:
            with httpx.stream("POST", url + "/v1/completions", timeout=120,
                              json={"model": "m", "prompt": "a", "max_tokens": max_tokens, "temperature": 0,
                                    "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line[5:].strip())
                        first.set()
        except httpx.HTTPError as exc:
            out["error"] = exc
        out["lines"] = lines
        first.set()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_sigterm_lets_a_running_request_finish(spm_path):
    proc, url = _start(spm_path, "--n_ctx", "4096", "--max_tokens_limit", "4000", "--shutdown_timeout", "60")
    first, out = threading.Event(), {}
    t = _stream_in_thread(url, 3000, first, out)
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert proc.wait(120) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its shutdown
    log = proc.stdout.read().decode(errors="replace")
    assert out["lines"][-1] == "[DONE]"
    final = json.loads(out["lines"][-2])
    assert final["usage"]["completion_tokens"] == 3000 and final["choices"][0]["finish_reason"] == "length"
    assert "loading m:" in log and "models freed" in log


def test_sigterm_cancels_what_outlasts_the_timeout(spm_path):
    proc, url = _start(spm_path, "--n_ctx", "60000", "--max_tokens_limit", "59000", "--shutdown_timeout", "0")
    first, out = threading.Event(), {}
    t = _stream_in_thread(url, 59000, first, out)
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) in (0, -signal.SIGTERM)  # within uvicorn's grace period (shutdown_timeout + 1 s), not after 59000 tokens
    t.join(60)
    assert "[DONE]" not in out["lines"]
    assert "models freed" in proc.stdout.read().decode(errors="replace")

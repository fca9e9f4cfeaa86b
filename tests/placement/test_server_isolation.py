"""The server's model over RPC servers runs in a worker process: a killed ``rpc-server`` fails the
request it was computing (an OpenAI error naming it: a 503, or an error event on a stream that
started), the server stays up, its other models answer, and the model loads again on the next
request (a restarted server is found); ``rpc_isolation: false`` serves it in slots in-process."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("pydantic_settings")
httpx = pytest.importorskip("httpx")

from tests.server.conftest import RunningServer, free_port  # noqa: E402

from .test_isolation import _restart  # noqa: E402

MODEL = {"n_ctx": 4096, "n_gpu_layers": -1, "chat_format": "chatml", "n_threads": 1, "n_threads_batch": 1}
PROMPT = "hello world"


@contextlib.contextmanager
def _serving(models: list[dict[str, Any]]) -> Iterator[RunningServer]:
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    port = free_port()
    app = create_app(server_settings=ServerSettings(port=port, max_tokens_limit=4000),
                     model_settings=[ModelSettings(**m) for m in models])
    srv = RunningServer(app, port).start()
    try:
        yield srv
    finally:
        srv.stop()


def _complete(url: str, model: str, max_tokens: int = 16) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                                     "temperature": 0.0}, timeout=120)


def _text(url: str, model: str) -> str:
    r = _complete(url, model)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_killed_rpc_server_fails_its_request_and_the_model_reloads(moe_path, start_rpc_server):
    (ep0, _p0), (ep1, p1) = start_rpc_server(), start_rpc_server()
    models = [{"model": str(moe_path), "model_alias": "rpc", "rpc_servers": f"{ep0},{ep1}", **MODEL},
              {"model": str(moe_path), "model_alias": "local", "n_parallel": 2, **MODEL}]
    restarted = None
    with _serving(models) as srv:
        try:
            engine = srv.engine("rpc")
            assert type(engine).__name__ == "WorkerEngine" and engine.llama.alive
            first_pid = engine.llama.worker_pid
            local = _text(srv.url, "local")
            assert _text(srv.url, "rpc") == local  # greedy output over two RPC servers equals the local one
            chat = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={
                "model": "rpc", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] is not None

            # a stream the server is computing when one RPC server is killed ends with an error event
            body = {"model": "rpc", "prompt": PROMPT, "max_tokens": 4000, "temperature": 0.0, "stream": True}
            events: list[dict] = []
            with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=120) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
                        break
                # the server's other endpoints answer while the worker computes (no call into it)
                metrics = httpx.get(f"{srv.url}/metrics", timeout=10)
                assert metrics.status_code == 200 and "kv_cache_tokens" in metrics.text
                p1.kill()
                p1.wait(10)
                t = time.monotonic()
                for line in lines:
                    if line.startswith("data: "):
                        events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                elapsed = time.monotonic() - t
            assert elapsed < 10
            assert "[DONE]" not in events and "error" in events[-1], events[-3:]
            err = events[-1]["error"]
            assert f"RPC server {ep1} is unreachable" in err["message"] and err["type"] == "server_error"
            assert err["code"] == "model_unavailable"
            assert not any("error" in e for e in events[:-1]) and len(events) < 4000

            # the server is alive: its other model answers; the lost one's next request reloads, and
            # fails by name (a 503 in OpenAI's shape) while the server is still gone
            assert _text(srv.url, "local") == local
            r = _complete(srv.url, "rpc")
            assert r.status_code == 503 and r.headers.get("retry-after")
            err = r.json()["error"]
            assert f"RPC server {ep1} is unreachable" in err["message"] and "loading it again failed" in err["message"]

            # restarted on the same port: the next request loads the model again and answers as before
            restarted = _restart(ep1)
            assert _text(srv.url, "rpc") == local
            assert engine.llama.alive and engine.llama.worker_pid != first_pid
            # restarted again while the model is idle: the worker learns it at its next computation, and
            # the request, which had produced nothing yet, runs again in a reloaded worker
            second_pid = engine.llama.worker_pid
            restarted.kill()
            restarted.wait(10)
            restarted = _restart(ep1)
            assert _text(srv.url, "rpc") == local
            assert engine.llama.worker_pid != second_pid
            assert httpx.get(f"{srv.url}/v1/models", timeout=30).status_code == 200
        finally:
            if restarted is not None:
                restarted.kill()
                restarted.wait(10)


def test_killed_rpc_server_fails_a_whole_response_with_503(moe_path, start_rpc_server):
    (ep0, p0), = [start_rpc_server()]
    models = [{"model": str(moe_path), "model_alias": "rpc", "rpc_servers": ep0, **MODEL}]
    restarted = None
    with _serving(models) as srv:
        try:
            engine = srv.engine("rpc")
            # killed while the request waits for its whole response
            with httpx.Client(timeout=120) as client:
                pending = client.build_request("POST", f"{srv.url}/v1/completions", json={
                    "model": "rpc", "prompt": PROMPT, "max_tokens": 4000, "temperature": 0.0})
                out: dict[str, httpx.Response] = {}
                th = threading.Thread(target=lambda: out.setdefault("r", client.send(pending)))
                th.start()
                deadline = time.monotonic() + 60
                while engine.busy == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.2)
                p0.kill()
                p0.wait(10)
                th.join(30)
            r = out["r"]
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert f"RPC server {ep0} is unreachable" in err["message"] and err["type"] == "server_error"
            restarted = _restart(ep0)
            assert _complete(srv.url, "rpc").status_code == 200
        finally:
            if restarted is not None:
                restarted.kill()
                restarted.wait(10)


def test_in_worker_settings(moe_path):
    from llama_cpp.server.settings import ModelSettings

    s = ModelSettings(model=str(moe_path), rpc_servers="127.0.0.1:1")
    assert s.in_worker and s.serial
    off = ModelSettings(model=str(moe_path), rpc_servers="127.0.0.1:1", rpc_isolation=False)
    assert not off.in_worker and not off.serial
    with pytest.raises(ValueError, match="embedding with rpc_servers needs the model in the server process: set "
                                         "rpc_isolation to false"):
        ModelSettings(model=str(moe_path), rpc_servers="127.0.0.1:1", embedding=True)


def test_rpc_isolation_false_serves_in_slots(moe_path, start_rpc_server):
    ep = start_rpc_server()[0]
    models = [{"model": str(moe_path), "model_alias": "rpc", "rpc_servers": ep, "rpc_isolation": False,
               "n_parallel": 2, **MODEL},
              {"model": str(moe_path), "model_alias": "local", "n_parallel": 2, **MODEL}]
    with _serving(models) as srv:
        assert type(srv.engine("rpc")).__name__ == "SlotEngine"
        assert _text(srv.url, "rpc") == _text(srv.url, "local")


def test_chat_constrained_by_the_chat_layer_in_a_worker_equals_local(start_rpc_server, tmp_path_factory):
    """A chat answer constrained by llama.cpp's chat layer (a JSON schema, the model's own template):
    its constraint travels to the worker and gives the in-process slots' answer."""
    from tests.server.conftest import _with_template

    path = _with_template(tmp_path_factory, "qwen25", "Qwen-Qwen2.5-7B-Instruct.jinja")
    ep = start_rpc_server()[0]
    # model-wide chat-layer options: every chat goes through llama.cpp's chat layer (a ChatConstraint)
    common = {**MODEL, "chat_format": None, "chat_template_kwargs": {"enable_thinking": False}}
    models = [{"model": str(path), "model_alias": "rpc", "rpc_servers": ep, **common},
              {"model": str(path), "model_alias": "local", "n_parallel": 2, **common}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with _serving(models) as srv:
        answers = []
        for model in ("rpc", "local"):
            r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={
                "model": model, "messages": [{"role": "user", "content": "weather in Paris?"}], "max_tokens": 24,
                "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
                "temperature": 0})
            assert r.status_code == 200, r.text
            answers.append(r.json()["choices"][0])
        assert answers[0] == answers[1]
        assert answers[0]["message"]["content"].startswith('{"city":"')

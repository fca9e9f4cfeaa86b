"""A real server on 127.0.0.1 (a free port), in a thread of the test process, driven over HTTP.

The module is skipped only when the ``[server]`` libraries or the ``openai`` client are missing
(``requirements/server.txt``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("pydantic_settings")
pytest.importorskip("openai")

from build_tools.fixtures import fixture_path  # noqa: E402

# one thread: the fixtures are tiny and the test machine is shared
THREADS = {"n_threads": 1, "n_threads_batch": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, app: Any, port: int) -> None:
        import uvicorn

        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def client(self, api_key: str = "none", **kw: Any):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def engine(self, alias: str):
        return self.app.state.registry.get(alias).engine


@pytest.fixture(scope="session")
def spm_path() -> Path:
    return fixture_path("llama_spm")


@pytest.fixture(scope="session")
def embed_path() -> Path:
    return fixture_path("embedding_model")


@pytest.fixture(scope="session")
def start_server() -> Iterator[Callable[..., RunningServer]]:
    """``start_server(models=[{...ModelSettings...}], **server_settings)``; stopped at session end."""
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    running: list[RunningServer] = []

    def start(models: list[dict[str, Any]], **server: Any) -> RunningServer:
        port = free_port()
        app = create_app(server_settings=ServerSettings(port=port, **server),
                         model_settings=[ModelSettings(**{**THREADS, **m}) for m in models])
        srv = RunningServer(app, port).start()
        running.append(srv)
        return srv

    yield start
    for srv in running:
        with contextlib.suppress(Exception):
            srv.stop()


@pytest.fixture(scope="module")
def server(start_server, spm_path, embed_path) -> RunningServer:
    """Two models: ``spm`` (4 slots) and ``embed`` (an embedding model)."""
    return start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 4, "n_ctx": 256,
                          "max_queue": 8},
                         {"model": str(embed_path), "model_alias": "embed", "embedding": True, "n_ctx": 256}],
                        max_tokens_limit=200, max_n=4, max_body_bytes=64 * 1024)


TEMPLATES = Path(__file__).resolve().parents[2] / "vendor" / "llama.cpp" / "models" / "templates"


def _with_template(tmp_path_factory, name: str, template: str) -> Path:
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("templated") / f"tiny-bpe-{name}.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(fixture_path("llama_bpe")), str(out),
                    "--chat-template-file", str(TEMPLATES / template), "--force"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def tools_path(tmp_path_factory) -> Path:
    """The tiny BPE llama with Qwen 2.5's chat template (tools; calls as ``<tool_call>`` JSON), so that
    requests with tools go through llama.cpp's chat layer as they would on a real model."""
    return _with_template(tmp_path_factory, "qwen25", "Qwen-Qwen2.5-7B-Instruct.jinja")


@pytest.fixture(scope="session")
def thinking_path(tmp_path_factory) -> Path:
    """The same with Qwen 3's template: reasoning in ``<think>`` before the answer or the calls."""
    return _with_template(tmp_path_factory, "qwen3", "Qwen-Qwen3-0.6B.jinja")


@pytest.fixture
def script(monkeypatch):
    """``script(server, alias, text)``: the model's next answers are ``text`` then end of generation.

    A stand-in for a trained model's output where a test needs one (a tool call, reasoning): the tiny
    model's own output is random. Everything after the sampler runs for real: the slots, text and stop
    handling, llama.cpp's chat parser, and each API's translation."""

    def apply(srv: RunningServer, alias: str, text: str) -> None:
        engine = srv.engine(alias)
        model = engine.model
        tokens = model.tokenize(text.encode("utf-8"), add_special=False, parse_special=True) + [model.token_eos()]
        real = engine._start

        def start(s: Any) -> None:
            real(s)
            if s.pick is not None:
                it = iter(tokens)
                s.pick = lambda ctx, i: (next(it), None)

        monkeypatch.setattr(engine, "_start", start)

    return apply

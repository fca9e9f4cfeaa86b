"""Fixtures of the placement tests: the tiny MoE model, and ``python -m llama_cpp rpc-server`` processes
on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ._moe import moe_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def moe_path(tmp_path_factory) -> Path:
    return moe_model(tmp_path_factory.mktemp("moe") / "moe.gguf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(endpoint: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    from llama_cpp._errors import ModelLoadError
    from llama_cpp._placement import rpc

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"rpc-server {endpoint} exited with {proc.returncode}: {proc.stderr.read()[-2000:]!r}")
        try:
            rpc.probe(endpoint, timeout=2.0)
            return
        except ModelLoadError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="session")
def start_rpc_server() -> Iterator[Callable[..., tuple[str, subprocess.Popen]]]:
    """Start ``python -m llama_cpp rpc-server`` on a free 127.0.0.1 port; every one started is
    stopped at the end of the session."""
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    def start(*extra: str) -> tuple[str, subprocess.Popen]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "llama_cpp", "rpc-server", "--port", str(port),
                                 "--threads", "1", *extra], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        endpoint = f"127.0.0.1:{port}"
        _wait_ready(endpoint, proc)
        return endpoint, proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def rpc_pair(start_rpc_server) -> list[str]:
    """Two RPC servers, for the tests that load over them (registered once in this process)."""
    return [start_rpc_server()[0], start_rpc_server()[0]]

"""The worker process's interpreter: in a Windows virtual environment the base interpreter itself (the
venv's ``python.exe`` is a launcher whose process id is not the interpreter's), told the venv."""

from __future__ import annotations

import sys

from llama_cpp._safety import worker


def test_a_windows_venv_starts_the_base_interpreter_told_the_venv(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "executable", r"C:\proj\.venv\Scripts\python.exe")
    monkeypatch.setattr(sys, "_base_executable", r"C:\Python312\python.exe", raising=False)
    monkeypatch.setattr(worker.multiprocessing.spawn, "get_executable", lambda: sys.executable)
    exe, env = worker.child_interpreter()
    assert exe == r"C:\Python312\python.exe"
    assert env["__PYVENV_LAUNCHER__"] == r"C:\proj\.venv\Scripts\python.exe" and env["GGML_NO_BACKTRACE"] == "1"


def test_outside_a_venv_or_off_windows_the_interpreter_is_ours(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "executable", r"C:\Python312\python.exe")
    monkeypatch.setattr(sys, "_base_executable", r"C:\Python312\python.exe", raising=False)
    monkeypatch.setattr(worker.multiprocessing.spawn, "get_executable", lambda: sys.executable)
    monkeypatch.delenv("__PYVENV_LAUNCHER__", raising=False)
    exe, env = worker.child_interpreter()
    assert exe == r"C:\Python312\python.exe" and "__PYVENV_LAUNCHER__" not in env
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(sys, "executable", "/proj/.venv/bin/python")
    monkeypatch.setattr(sys, "_base_executable", "/usr/bin/python3", raising=False)
    assert worker.child_interpreter()[0] == "/proj/.venv/bin/python"  # a venv's python is the interpreter here

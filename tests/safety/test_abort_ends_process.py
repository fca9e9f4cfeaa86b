"""An unavoidable native abort ends the process with SIGABRT instead of hanging in ggml's backtrace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

_ABORT = """
import os, sys
from llama_cpp._native import loader as _loader
_loader.load()
print(os.environ.get("GGML_NO_BACKTRACE"), flush=True)
_loader.library_handle("ggml_base").ggml_abort(b"hostile.c", 1, b"deliberate abort")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGABRT exit status is POSIX")
@pytest.mark.parametrize("user_value", [None, "yes"])
def test_abort_is_sigabrt_and_user_setting_kept(user_value: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GGML_NO_BACKTRACE"}
    if user_value is not None:
        env["GGML_NO_BACKTRACE"] = user_value
    proc = subprocess.run([sys.executable, "-c", _ABORT], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
    assert proc.returncode == -signal.SIGABRT, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == (user_value or "1")
    assert "deliberate abort" in proc.stderr

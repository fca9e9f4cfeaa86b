"""Run a tool: the one place build_tools starts a subprocess and words its failure.

A missing executable raises :class:`~build_tools.errors.ToolNotFoundError`, a timeout
:class:`~build_tools.errors.ToolTimeoutError`; with ``check`` a non-zero exit raises the
caller's error class naming ``what`` with the tail of the output.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path

from ..errors import BuildToolsError, ToolNotFoundError, ToolTimeoutError

TAIL_CHARS = 2000


def tail(proc: subprocess.CompletedProcess[str], limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of what the process printed (stdout, then stderr)."""
    return ((proc.stdout or "") + (proc.stderr or "")).strip()[-limit:]


def run(cmd: Sequence[str | PathLike[str]], *, what: str | None = None,
        error: type[BuildToolsError] = BuildToolsError, check: bool = True, capture: bool = True,
        timeout: float | None = None, env: Mapping[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (text mode, output captured unless ``capture`` is false) and return its result."""
    argv = [str(a) for a in cmd]
    what = what or f"`{' '.join(argv)}`"
    try:
        proc = subprocess.run(argv, capture_output=capture, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None, cwd=cwd, check=False)
    except FileNotFoundError as exc:
        if cwd is not None and not Path(cwd).is_dir():
            raise
        raise ToolNotFoundError(f"{argv[0]} is not installed (or not on PATH): needed for {what}") from exc
    except subprocess.TimeoutExpired:
        raise ToolTimeoutError(f"{what} timed out after {timeout:g} s") from None
    if check and proc.returncode != 0:
        raise error(f"{what} failed (exit {proc.returncode}):\n{tail(proc)}")
    return proc

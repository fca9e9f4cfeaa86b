"""Load and decode a model file once in a child process before the interpreter trusts it.

llama.cpp answers many legal-looking but hostile GGUF files with ``GGML_ASSERT`` (SIGABRT), a
segfault at the first matmul, a division by zero or an endless loop. A guard that mirrors those
asserts one by one always trails them, so :func:`verify_model_file` runs the risky part (load,
tokenize a few probes, decode them) in a fresh ``python -m llama_cpp.cli._load_probe``
child: a child that dies by a signal, exits abnormally or runs past its time limit becomes a
:class:`ModelLoadError` naming the signal and the file; a clean Python error in the child is
left for the in-process load to raise again.

The verdict is cached under ``<cache root>/load-verdicts/`` by a content key (see
:func:`content_key`), so the child runs once per file, overrides and library build. The key
samples the file (size, mtime, the first MiB, 32 blocks spread over it and the last block);
``LLAMA_CPP_ISOLATE_HASH=full`` hashes every byte instead.

Where it is on: ``Llama(isolate_load=None)`` (the default) follows ``LLAMA_CPP_ISOLATE_LOAD``
(``1``: on, otherwise off); the server and the CLI pass ``isolate_load=True`` because they load
files named by others. A library caller who loads files it did not make should pass True.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ModelLoadError
from .._version import __version__
from .paths import cache_root

log = logging.getLogger("llama_cpp")

ENV_ON = "LLAMA_CPP_ISOLATE_LOAD"
ENV_TIMEOUT = "LLAMA_CPP_ISOLATE_TIMEOUT"
ENV_HASH = "LLAMA_CPP_ISOLATE_HASH"
#: the child's time limit: this base plus PER_GIB seconds for each GiB of the file
BASE_TIMEOUT_S = 60.0
PER_GIB_TIMEOUT_S = 30.0
_HEAD = 1 << 20
_BLOCK = 1 << 16
_SAMPLES = 32
CHILD_OK = "ISOLATED-LOAD-OK"


@dataclass(frozen=True)
class Verdict:
    """What the child found: ``ok`` False means the file must not be loaded in-process."""

    ok: bool
    reason: str
    seconds: float
    cached: bool = False


def enabled(explicit: bool | None) -> bool:
    """``explicit`` if given, else ``LLAMA_CPP_ISOLATE_LOAD`` (``1``/``true``/``yes``: on)."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(ENV_ON, "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """``<cache root>/load-verdicts`` (``LLAMA_CPP_ISOLATE_CACHE`` names the folder itself)."""
    own = os.environ.get("LLAMA_CPP_ISOLATE_CACHE")
    return Path(own).expanduser() if own else cache_root() / "load-verdicts"


def _library_identity() -> str:
    try:
        from .._native import loader as _loader
        path = _loader.lib_dir()
        parts = []
        for p in sorted(path.glob("*llama*")) + sorted(path.glob("*ggml*")):
            st = p.stat()
            parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
        return ";".join(parts)
    except Exception:  # noqa: BLE001 - no library yet: the load itself will say so
        return "unknown"


def content_key(path: str | os.PathLike[str], params: Mapping[str, Any] | None = None) -> str:
    """A key for ``path``'s bytes (sampled, or all with ``LLAMA_CPP_ISOLATE_HASH=full``), the load
    parameters that change what llama.cpp does (``params``) and this package's build."""
    name = os.fspath(path)
    h = hashlib.sha256()
    with open(name, "rb") as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        h.update(f"{size}:{st.st_mtime_ns}:{__version__}:{_library_identity()}".encode())
        h.update(json.dumps(dict(params or {}), sort_keys=True, default=repr).encode())
        if os.environ.get(ENV_HASH, "").lower() == "full":
            while chunk := f.read(1 << 24):
                h.update(chunk)
        else:
            h.update(f.read(_HEAD))
            if size > _HEAD:
                for i in range(_SAMPLES + 1):
                    f.seek(_HEAD + (size - _HEAD - _BLOCK) * i // _SAMPLES if size > _HEAD + _BLOCK else _HEAD)
                    h.update(f.read(_BLOCK))
    return h.hexdigest()[:40]


def _timeout(path: str) -> float:
    explicit = os.environ.get(ENV_TIMEOUT)
    if explicit:
        return float(explicit)
    return BASE_TIMEOUT_S + PER_GIB_TIMEOUT_S * os.path.getsize(path) / (1 << 30)


def _read_cached(file: Path) -> Verdict | None:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return Verdict(ok=bool(data["ok"]), reason=str(data["reason"]), seconds=float(data["seconds"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached(file: Path, verdict: Verdict) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"ok": verdict.ok, "reason": verdict.reason, "seconds": verdict.seconds}, f)
        os.replace(tmp, file)
    except OSError as exc:  # an unwritable cache costs a child per load, nothing else
        log.debug("could not cache the load verdict in %s: %s", file.parent, exc)


def _stderr_reason(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(m in ln for m in ("GGML_ASSERT", "error", "terminate", "what()", "Assertion", "abort")):
            return ln[-300:]
    return lines[-1][-300:] if lines else ""


def run_child(path: str, params: Mapping[str, Any], timeout: float) -> Verdict:
    """Run the load-and-decode probe on ``path`` in a child; never raises for what the child does."""
    env = {**os.environ, ENV_ON: "0", "GGML_NO_BACKTRACE": "1"}
    cmd = [sys.executable, "-m", "llama_cpp.cli._load_probe", path, json.dumps(dict(params))]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Verdict(False, f"loading and decoding it did not finish within {timeout:.0f} s (a hang in llama.cpp)",
                       time.monotonic() - start)
    seconds = time.monotonic() - start
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        detail = _stderr_reason(proc.stderr)
        return Verdict(False, f"llama.cpp died with {sig} loading or decoding it" + (f" ({detail})" if detail else ""),
                       seconds)
    if proc.returncode != 0 or CHILD_OK not in proc.stdout:
        detail = _stderr_reason(proc.stderr)
        return Verdict(False, f"the isolated load exited with status {proc.returncode}"
                       + (f" ({detail})" if detail else ""), seconds)
    note = proc.stdout.split(CHILD_OK, 1)[1].strip()
    return Verdict(True, note or "loaded and decoded", seconds)


def verify_model_file(path: str | os.PathLike[str], params: Mapping[str, Any] | None = None, *,
                      timeout: float | None = None, use_cache: bool = True) -> Verdict:
    """Raise :class:`ModelLoadError` unless ``path`` loads and decodes in a child process without a
    signal, an abnormal exit or a hang; the verdict is cached by :func:`content_key`."""
    name = os.fspath(path)
    params = dict(params or {})
    key = content_key(name, params)
    file = cache_dir() / f"{key}.json"
    verdict = _read_cached(file) if use_cache else None
    if verdict is None:
        verdict = run_child(name, params, _timeout(name) if timeout is None else timeout)
        log.info("isolated load of %s: %s in %.2f s", name, "passed" if verdict.ok else "refused", verdict.seconds)
        if use_cache:
            _write_cached(file, verdict)
    if not verdict.ok:
        raise ModelLoadError(f"refusing to load {name}: {verdict.reason}; the file is malformed or hostile "
                             "(re-convert it with llama.cpp's convert_hf_to_gguf.py, or report it if it is "
                             "a real model)" + (" [cached verdict]" if verdict.cached else ""))
    return verdict

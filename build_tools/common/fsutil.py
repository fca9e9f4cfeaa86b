"""Atomic file-system operations: a failed step never leaves a half-written result."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import BuildToolsError, MissingInputError


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh sibling temp directory; on success it replaces ``final`` in one rename.

    On any exception the temp directory is removed and ``final`` is left as it was.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(src: Path, final: Path) -> None:
    """Move directory ``src`` to ``final``, replacing any existing ``final`` as atomically as POSIX allows."""
    old: Path | None = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    try:
        os.replace(src, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_json(path: Path, *, missing: str, invalid: type[BuildToolsError],
              missing_error: type[BuildToolsError] = MissingInputError) -> Any:
    """The JSON document at ``path``; ``missing_error(missing)`` if there is none, ``invalid`` if it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise missing_error(missing) from None
    except ValueError as exc:
        raise invalid(f"{path}: invalid JSON ({exc})") from None

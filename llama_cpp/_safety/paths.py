"""Where the package keeps what it learns about files (load verdicts, the state key)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$LLAMA_CPP_PYTHON_CACHE``, else ``$XDG_CACHE_HOME/llama-cpp-python``, else
    ``~/.cache/llama-cpp-python`` (the build tools' cache root)."""
    explicit = os.environ.get("LLAMA_CPP_PYTHON_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "llama-cpp-python"

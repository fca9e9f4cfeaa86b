"""Well-known locations: the repository, its inputs, and the cache outside the clone."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS_DIR = REPO_ROOT / "manifests"
LOCK_FILE = MANIFESTS_DIR / "llama.cpp.lock.json"
CONFIGS_FILE = MANIFESTS_DIR / "configs.toml"
VENDOR_DIR = REPO_ROOT / "vendor" / "llama.cpp"
VENDOR_STAMP = REPO_ROOT / "vendor" / ".llama.cpp.stamp.json"

CACHE_ENV = "LLAMA_CPP_PYTHON_CACHE"


def cache_root() -> Path:
    """The cache for downloads, native builds and toolkits (``$LLAMA_CPP_PYTHON_CACHE``,
    else ``$XDG_CACHE_HOME/llama-cpp-python``, else ``~/.cache/llama-cpp-python``)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "llama-cpp-python").resolve()


def downloads_dir() -> Path:
    return cache_root() / "downloads"


def native_cache_dir() -> Path:
    return cache_root() / "native"

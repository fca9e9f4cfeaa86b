"""Content hashes shared by every step (files, trees, canonical JSON)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of the canonical JSON form (sorted keys, no whitespace)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def iter_tree(root: Path, exclude: Iterable[str] = (".git",)) -> Iterable[tuple[str, os.stat_result]]:
    """Relative POSIX paths of every entry under ``root`` in sorted order, skipping ``exclude`` names."""
    skip = set(exclude)
    stack = [""]
    out: list[tuple[str, os.stat_result]] = []
    while stack:
        rel = stack.pop()
        base = root / rel if rel else root
        for entry in os.scandir(base):
            if entry.name in skip:
                continue
            child = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                stack.append(child)
            else:
                out.append((child, st))
    out.sort()
    return out


def tree_hash(root: Path, exclude: Iterable[str] = (".git",)) -> str:
    """Hash of a directory tree: each file's path, executable bit and content (symlinks by target)."""
    h = hashlib.sha256()
    for rel, st in iter_tree(root, exclude):
        path = root / rel
        if stat.S_ISLNK(st.st_mode):
            h.update(f"L {rel}\0{os.readlink(path)}\0".encode())
        elif stat.S_ISREG(st.st_mode):
            mode = "x" if st.st_mode & 0o111 else "-"
            h.update(f"F {rel}\0{mode}\0{sha256_file(path)}\0".encode())
    return h.hexdigest()

"""Content hashes shared by every step (files, trees, canonical JSON)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Sequence
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


def tree_listing(root: Path, exclude: Iterable[str] = (".git",)) -> list[tuple[str, str, str]]:
    """Every file under ``root`` as (path, kind, digest): kind ``x``/``-`` (executable bit) with the
    content's sha256, or ``L`` with a symlink's target. :func:`listing_hash` of it is :func:`tree_hash`."""
    out = []
    for rel, st in iter_tree(root, exclude):
        path = root / rel
        if stat.S_ISLNK(st.st_mode):
            out.append((rel, "L", os.readlink(path)))
        elif stat.S_ISREG(st.st_mode):
            out.append((rel, "x" if st.st_mode & 0o111 else "-", sha256_file(path)))
    return out


def listing_hash(listing: Iterable[Sequence[str]]) -> str:
    """The tree hash of a :func:`tree_listing` (so a listing can be checked against a pinned tree hash)."""
    h = hashlib.sha256()
    for rel, kind, digest in sorted((tuple(e) for e in listing), key=lambda e: e[0]):
        h.update(f"L {rel}\0{digest}\0".encode() if kind == "L" else f"F {rel}\0{kind}\0{digest}\0".encode())
    return h.hexdigest()


def tree_hash(root: Path, exclude: Iterable[str] = (".git",)) -> str:
    """Hash of a directory tree: each file's path, executable bit and content (symlinks by target)."""
    return listing_hash(tree_listing(root, exclude))

"""A local Hugging Face hub cache in the layout ``huggingface_hub`` reads offline.

``<root>/hub/models--ORG--NAME/blobs/<sha256>``, ``refs/main`` (the revision), and
``snapshots/<revision>/<filename>`` (a relative symlink to the blob). With ``HF_HOME=<root>``
and ``HF_HUB_OFFLINE=1``, ``hf_hub_download(repo_id, filename)`` returns the snapshot path
without any network access.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..common.hashing import sha256_file


@dataclass(frozen=True)
class HubFile:
    """One file of one model repo: where it comes from on disk."""

    repo_id: str
    filename: str
    source: Path


def repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def revision_of(files: Iterable[HubFile]) -> str:
    """A stable 40-hex revision for a repo's files (changes when any content changes)."""
    h = hashlib.sha1()
    for f in sorted(files, key=lambda f: f.filename):
        h.update(f.filename.encode() + b"\0" + sha256_file(f.source).encode() + b"\0")
    return h.hexdigest()


def build_hub(root: Path, files: Iterable[HubFile]) -> Path:
    """Write the cache under ``root / "hub"`` and return ``root`` (the value for ``HF_HOME``)."""
    by_repo: dict[str, list[HubFile]] = {}
    for f in files:
        by_repo.setdefault(f.repo_id, []).append(f)
    hub = root / "hub"
    for repo_id, repo_files in by_repo.items():
        base = hub / repo_folder(repo_id)
        rev = revision_of(repo_files)
        (base / "blobs").mkdir(parents=True, exist_ok=True)
        (base / "refs").mkdir(parents=True, exist_ok=True)
        for f in repo_files:
            digest = sha256_file(f.source)
            blob = base / "blobs" / digest
            if not blob.exists():
                tmp = blob.with_name(f".{digest}.{os.getpid()}.tmp")
                shutil.copyfile(f.source, tmp)
                os.replace(tmp, blob)
            link = base / "snapshots" / rev / f.filename
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            try:
                link.symlink_to(os.path.relpath(blob, link.parent))
            except OSError:  # no symlinks (Windows without developer mode): huggingface_hub copies too
                shutil.copyfile(blob, link)
        (base / "refs" / "main").write_text(rev)
    return root

"""validate's sdist half: every member explained by the lock or the project's tracked files.

Checks, by name (a failing sdist's report lists each):

    archive         a readable .tar.gz with everything under ``llama_cpp_python-<version>/``
    name            a member name that is not a normalized relative path, or a duplicate
    member-type     a link, device or anything but a regular file or folder
    reproducible    an mtime other than the release's SOURCE_DATE_EPOCH, an owner, or a mode other
                    than 0644/0755
    pkg-info        PKG-INFO is not what pyproject.toml and llama_cpp/_version.py make
    lock            the sdist's lock is not the project's, or its llama.cpp listing does not hash to
                    the tree the lock pins
    llama-cpp       a llama.cpp file whose sha256 or mode differs from the locked tree's, or a file
                    the build needs that is missing
    project         a project file that differs from the tracked one, or a tracked one that is missing
    unexpected-file a file neither the lock nor the project's tracked build files explain
    size-budget     the sdist is over SDIST_BUDGET_MB, or over PyPI's per-file limit
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common.file_report import PYPI_FILE_LIMIT_MB, FileReport
from ...common.fsutil import write_json_atomic
from ...common.hashing import listing_hash, sha256_file
from ...common.paths import REPO_ROOT
from ..wheels.inwheel import source_date_epoch
from .build import LLAMA_CPP_FILES, SOURCES_LISTING, VENDOR_PREFIX, pkg_info, sdist_name, selected, tracked_files

SDIST_BUDGET_MB = 20  # measured 7.3 MB (README); a jump means the selection took something it should not
@dataclass
class SdistReport(FileReport):
    """What :func:`check` found in the sdist, with its sha256 (publish takes only the bytes that passed)."""

    sha256: str = field(default="", kw_only=True)

    def to_json(self) -> dict[str, Any]:
        return {"filename": self.filename, "sha256": self.sha256, "size": self.size, "ok": self.ok,
                "failures": [{"check": c, "message": m} for c, m in self.failures]}


REPORT_FILE = "sdist-validation.json"  # beside the sdist; publish takes only the bytes it passed


def save_report(report: SdistReport, folder: Path) -> Path:
    path = folder / REPORT_FILE
    write_json_atomic(path, report.to_json())
    return path


def _name_problem(name: str) -> str | None:
    from ..validate import _name_problem as problem  # one rule for wheel and sdist entry names

    return problem(name)


def _read(tf: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    f = tf.extractfile(info)
    return f.read() if f is not None else b""


def check(path: Path, *, repo: Path = REPO_ROOT, version: str, epoch: int | None = None) -> SdistReport:
    """Validate the sdist at ``path`` against the project checkout ``repo`` and its lock."""
    rep = SdistReport(path.name, path.stat().st_size, sha256=sha256_file(path))
    if path.name != sdist_name(version):
        rep.fail("archive", f"the file name is not {sdist_name(version)}")
    mb = rep.size / 1e6
    if mb > min(SDIST_BUDGET_MB, PYPI_FILE_LIMIT_MB):
        rep.fail("size-budget", f"{mb:.1f} MB is over the {SDIST_BUDGET_MB} MB budget (PyPI's limit is "
                 f"{PYPI_FILE_LIMIT_MB} MB): check LLAMA_CPP_FILES")
    top = sdist_name(version).removesuffix(".tar.gz")
    epoch = source_date_epoch(epoch)
    try:
        with tarfile.open(path, "r:gz") as tf:
            infos = tf.getmembers()
            files: dict[str, bytes] = {}
            modes: dict[str, int] = {}
            for info in infos:
                name = info.name
                if name != top and not name.startswith(top + "/"):
                    rep.fail("archive", f"{name!r} is outside {top}/")
                    continue
                rel = name[len(top) + 1:]
                if info.isdir():
                    continue
                if not info.isfile():
                    rep.fail("member-type", f"{rel}: not a regular file (type {info.type!r})")
                    continue
                if (problem := _name_problem(rel)) is not None:
                    rep.fail("name", f"{rel!r}: {problem}")
                    continue
                if rel in files:
                    rep.fail("name", f"{rel} appears twice")
                if info.mtime != epoch or info.uid or info.gid or info.uname or info.gname \
                        or info.mode not in (0o644, 0o755):
                    rep.fail("reproducible", f"{rel}: mtime {info.mtime}, owner {info.uid}:{info.gid} "
                             f"{info.uname!r}:{info.gname!r}, mode {info.mode:o} (expected mtime {epoch}, "
                             "owner 0:0 unnamed, 0644/0755)")
                files[rel] = _read(tf, info)
                modes[rel] = info.mode
    except (OSError, tarfile.TarError, EOFError) as exc:
        rep.fail("archive", f"not a readable .tar.gz ({exc})")
        return rep
    _check_contents(rep, files, modes, repo)
    return rep


def _check_contents(rep: SdistReport, files: dict[str, bytes], modes: dict[str, int], repo: Path) -> None:
    explained: set[str] = set()
    if files.get("PKG-INFO") != pkg_info(repo):
        rep.fail("pkg-info", "PKG-INFO is missing or not what pyproject.toml and llama_cpp/_version.py make")
    explained.add("PKG-INFO")

    # The project's part: the tracked build files, byte for byte.
    for name in tracked_files(repo):
        explained.add(name)
        if name not in files:
            rep.fail("project", f"{name} (tracked, needed by the build) is missing")
        elif files[name] != (repo / name).read_bytes():
            rep.fail("project", f"{name} differs from the tracked file")

    # llama.cpp's part: the listing must hash to the pinned tree; each file must match its entry.
    lock_name = "manifests/llama.cpp.lock.json"
    listed: dict[str, tuple[str, str]] = {}
    explained.add(SOURCES_LISTING)
    try:
        lock = json.loads(files.get(lock_name, b"{}"))
        pinned = {s.get("tree_sha256") for s in lock.get("sources", {}).values() if isinstance(s, dict)} - {None}
        listing = json.loads(files[SOURCES_LISTING])
        entries = [tuple(e) for e in listing["files"]]
        if any(len(e) != 3 or not all(isinstance(x, str) for x in e) for e in entries):
            raise ValueError("files must be [path, kind, digest] strings")
        if listing_hash(entries) not in pinned:
            rep.fail("lock", f"{SOURCES_LISTING} hashes to {listing_hash(entries)[:16]}, not a tree the lock pins")
        if listing.get("tree_sha256") not in pinned:
            rep.fail("lock", f"{SOURCES_LISTING} names tree {str(listing.get('tree_sha256'))[:16]}, not a pinned one")
        listed = {e[0]: (e[1], e[2]) for e in entries}
    except KeyError:
        rep.fail("lock", f"{SOURCES_LISTING} is missing")
    except (ValueError, TypeError, AttributeError) as exc:
        rep.fail("lock", f"{SOURCES_LISTING} or {lock_name} is unreadable ({exc})")
    for rel, (kind, digest) in listed.items():
        if selected(rel, LLAMA_CPP_FILES) and kind != "L":
            name = VENDOR_PREFIX + rel
            explained.add(name)
            if name not in files:
                rep.fail("llama-cpp", f"{name} (needed by the build) is missing")
            elif hashlib.sha256(files[name]).hexdigest() != digest or (modes[name] == 0o755) != (kind == "x"):
                rep.fail("llama-cpp", f"{name} differs from the locked tree's file (sha256 or executable bit)")

    for name in sorted(set(files) - explained):
        why = "a llama.cpp file the build does not need" if name[len(VENDOR_PREFIX):] in listed \
            else "not in the locked llama.cpp tree" if name.startswith(VENDOR_PREFIX) \
            else "not a tracked build file of the project"
        rep.fail("unexpected-file", f"{name}: {why}")

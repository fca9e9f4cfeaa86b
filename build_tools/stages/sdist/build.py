"""Write the sdist: the project's tracked build files, PKG-INFO, and the locked llama.cpp subset.

The archive is a pure function of its inputs: members sorted by name, one mtime
(``SOURCE_DATE_EPOCH``, as the wheels use), uid/gid 0 with no names, modes 0644/0755, a gzip header
with no name or time. Beside the llama.cpp files it carries :data:`SOURCES_LISTING`, every file of
the locked tree with its sha256: its tree hash is the lock's ``tree_sha256``, so each llama.cpp file
in the sdist can be proven to be the pinned one without the rest of the tree.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...common import proc
from ...common.hashing import listing_hash, sha256_file, tree_listing
from ...common.paths import REPO_ROOT, VENDOR_DIR
from ...errors import HashMismatchError, MissingInputError, WheelBuildError
from ...inputs.lock import SourceLock
from ..wheels.build import read_project, render_metadata
from ..wheels.inwheel import source_date_epoch

log = logging.getLogger(__name__)

# The project's tracked files that `pip install <sdist>` needs (a trailing "/" takes a folder).
PROJECT_FILES = ("pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md", "manifests/llama.cpp.lock.json",
                 "cmake/", "llama_cpp/")
# The part of the locked llama.cpp tree that CMakeLists.txt compiles, with every ggml backend.
LLAMA_CPP_FILES = ("CMakeLists.txt", "LICENSE", "AUTHORS", "cmake/", "ggml/", "src/", "include/", "common/",
                   "vendor/", "licenses/", "tools/mtmd/")
VENDOR_PREFIX = "vendor/llama.cpp/"
SOURCES_LISTING = "vendor/llama.cpp.sources.json"  # the locked tree's files, by sha256
LICENSE_FILES = ("LICENSE",)  # pyproject.toml's license-files, as PKG-INFO names them


def selected(rel: str, table: Sequence[str]) -> bool:
    """Whether ``rel`` is named by ``table`` (a file, or a folder with a trailing slash)."""
    return any(rel == t or (t.endswith("/") and rel.startswith(t)) for t in table)


def sdist_name(version: str) -> str:
    return f"llama_cpp_python-{version}.tar.gz"


@dataclass(frozen=True)
class Sdist:
    path: Path
    version: str
    sha256: str
    size: int
    members: int
    vendor_files: int
    epoch: int

    @property
    def filename(self) -> str:
        return self.path.name


def tracked_files(repo: Path = REPO_ROOT) -> list[str]:
    """The project's git-tracked files that the sdist takes (:data:`PROJECT_FILES`)."""
    if not (repo / ".git").exists():
        raise MissingInputError(f"{repo} is not a git checkout: the sdist takes the project's tracked files")
    out = proc.run(["git", "-C", str(repo), "ls-files", "-z"], what="git ls-files", error=WheelBuildError)
    names = sorted(n for n in out.stdout.split("\0") if n and selected(n, PROJECT_FILES))
    missing = [n for n in names if not (repo / n).is_file()]
    if missing:
        raise WheelBuildError(f"tracked files missing from the checkout: {', '.join(missing[:5])}; "
                              "restore them (git checkout -- FILE) before building the sdist")
    return names


def locked_listing(lock: SourceLock, tree: Path = VENDOR_DIR) -> dict[str, object]:
    """The vendored tree's listing, refused unless its tree hash is one the lock pins."""
    listing = tree_listing(tree)
    digest = listing_hash(listing)
    pinned = {s.tree_sha256: name for name, s in lock.sources.items() if s.tree_sha256}
    if digest not in pinned:
        raise HashMismatchError(f"{tree} has tree hash {digest}, which {lock.path.name} does not pin "
                                f"({', '.join(sorted(pinned)) or 'no tree_sha256 set'}); run `nox -s vendor`")
    return {"schema_version": 1, "commit": lock.commit, "build_number": lock.build_number,
            "source": pinned[digest], "tree_sha256": digest, "files": [list(e) for e in listing]}


def pkg_info(repo: Path = REPO_ROOT) -> bytes:
    meta = read_project(repo)
    return render_metadata(meta, meta.version, list(meta.dependencies), LICENSE_FILES)


def _listing_bytes(listing: dict[str, object]) -> bytes:
    return (json.dumps(listing, indent=0, sort_keys=True) + "\n").encode()


def members(lock: SourceLock, repo: Path = REPO_ROOT, tree: Path = VENDOR_DIR) -> list[tuple[str, Path | bytes, bool]]:
    """(name inside the top folder, source file or bytes, executable) for every member, sorted."""
    listing = locked_listing(lock, tree)
    out: list[tuple[str, Path | bytes, bool]] = [("PKG-INFO", pkg_info(repo), False),
                                                 (SOURCES_LISTING, _listing_bytes(listing), False)]
    for name in tracked_files(repo):
        out.append((name, repo / name, bool((repo / name).stat().st_mode & 0o111)))
    for rel, kind, _digest in listing["files"]:  # type: ignore[union-attr]
        if not selected(rel, LLAMA_CPP_FILES):
            continue
        if kind == "L":
            raise WheelBuildError(f"{tree / rel} is a symlink; an sdist holds regular files only")
        out.append((VENDOR_PREFIX + rel, tree / rel, kind == "x"))
    return sorted(out, key=lambda m: m[0])


def write_tar(path: Path, top: str, entries: Iterable[tuple[str, Path | bytes, bool]], epoch: int) -> int:
    """Write the reproducible .tar.gz; returns the number of members."""
    n = 0
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, src, executable in entries:
            data = src if isinstance(src, bytes) else src.read_bytes()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), epoch, 0o755 if executable else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
            n += 1
    return n


def build(lock: SourceLock, out_dir: Path, *, repo: Path = REPO_ROOT, tree: Path = VENDOR_DIR,
          epoch: int | None = None, version: str | None = None) -> Sdist:
    """Write ``out_dir/llama_cpp_python-<version>.tar.gz`` (replacing an older one of that name)."""
    version = version or read_project(repo).version
    epoch = source_date_epoch(epoch)
    entries = members(lock, repo, tree)
    name = sdist_name(version)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=out_dir)
    os.close(fd)
    try:
        n = write_tar(Path(tmp_name), name.removesuffix(".tar.gz"), entries, epoch)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    vendor_files = sum(1 for e in entries if e[0].startswith(VENDOR_PREFIX))
    sd = Sdist(path, version, sha256_file(path), path.stat().st_size, n, vendor_files, epoch)
    log.info("sdist %s: %d files (%d from llama.cpp), %.1f MB", name, n, vendor_files, sd.size / 1e6)
    return sd

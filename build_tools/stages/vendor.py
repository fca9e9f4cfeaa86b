"""Step 1: fetch the pinned llama.cpp source, verify it, and unpack it into ``vendor/llama.cpp``."""

from __future__ import annotations

import logging
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..common import pip, proc
from ..common.fsutil import replace_dir, write_json_atomic
from ..common.hashing import sha256_file, tree_hash
from ..common.paths import VENDOR_DIR, downloads_dir
from ..errors import HashMismatchError, MissingInputError, VendorError
from ..inputs.lock import GitSource, PathSource, PypiSdistSource, Source, SourceLock

log = logging.getLogger(__name__)

STAMP_NAME = ".llama.cpp.stamp.json"


@dataclass(frozen=True)
class VendoredTree:
    """A verified llama.cpp source tree on disk."""

    path: Path
    tree_sha256: str
    source: str
    commit: str
    build_number: int

    def to_json(self) -> dict[str, object]:
        return {
            "tree_sha256": self.tree_sha256,
            "source": self.source,
            "commit": self.commit,
            "build_number": self.build_number,
        }


def _stamp_path(dest: Path) -> Path:
    return dest.parent / STAMP_NAME


def _pip_download(src: PypiSdistSource, into: Path) -> Path:
    """Download the sdist through pip, so the user's index, mirror and proxy settings apply."""
    # pip prepares the sdist's metadata (in an isolated build environment) before saving it;
    # nothing of the sdist runs in this process, and the sha256 check below decides.
    log.info("downloading %s==%s (sdist) with pip", src.package, src.version)
    done = proc.run(pip.download_sdist(f"{src.package}=={src.version}", into), check=False)
    candidate = into / src.filename
    # pip may fail after saving the file (metadata preparation); the hash check decides.
    if not candidate.exists():
        raise VendorError(
            f"pip could not download {src.package}=={src.version}: {proc.tail(done)}\n"
            "Check network access to the package index, or vendor from a local archive "
            "(nox -s vendor -- --archive FILE) or directory (--from-path DIR)."
        )
    return candidate


def fetch_archive(src: PypiSdistSource, archive: Path | None = None) -> Path:
    """Return a verified local copy of the sdist, from ``archive``, the download cache, or pip."""
    if archive is not None:
        if not archive.is_file():
            raise MissingInputError(f"archive not found: {archive}")
        candidates = [archive]
    else:
        cached = downloads_dir() / src.filename
        candidates = [cached] if cached.is_file() else []
    for path in candidates:
        digest = sha256_file(path)
        if digest == src.sha256:
            return path
        if archive is not None:
            raise HashMismatchError(
                f"{path}: sha256 {digest} does not match the lock's {src.sha256} "
                f"for {src.package}=={src.version}; the archive is not the pinned source"
            )
        log.warning("cached %s has sha256 %s, expected %s: downloading again", path, digest, src.sha256)
    downloads_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads_dir(), prefix=".dl-") as tmp:
        got = _pip_download(src, Path(tmp))
        digest = sha256_file(got)
        if digest != src.sha256:
            raise HashMismatchError(
                f"downloaded {src.filename} has sha256 {digest}, but the lock pins {src.sha256}. "
                "The index served a different file: do not build from it. "
                "If the pin is wrong, fix manifests/llama.cpp.lock.json."
            )
        final = downloads_dir() / src.filename
        got.replace(final)
        return final


def _safe_extract(archive: Path, into: Path) -> None:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise VendorError(f"{archive}: unsafe member path {name!r}")
            zf.extractall(into)
        return
    with tarfile.open(archive) as tf:
        if sys.version_info >= (3, 12):
            tf.extractall(into, filter="data")
            return
        for member in tf.getmembers():
            p = Path(member.name)
            if p.is_absolute() or ".." in p.parts or member.issym() and (
                Path(member.linkname).is_absolute() or ".." in Path(member.linkname).parts
            ):
                raise VendorError(f"{archive}: unsafe member {member.name!r}")
            if member.isdev():
                raise VendorError(f"{archive}: device file {member.name!r} in archive")
        tf.extractall(into)


def _materialize(src: Source, lock: SourceLock, work: Path, archive: Path | None) -> Path:
    """Put the source tree somewhere under ``work`` and return its root."""
    if isinstance(src, PypiSdistSource):
        tarball = fetch_archive(src, archive)
        _safe_extract(tarball, work / "x")
        root = work / "x" / src.subdir
        if not (root / "CMakeLists.txt").is_file():
            raise VendorError(f"{tarball}: {src.subdir}/CMakeLists.txt not found; is subdir right?")
        # The sdist carries a gitlink to a repository that is not there; CMake would ask git about it.
        stale_git = root / ".git"
        if stale_git.is_file() or stale_git.is_symlink():
            stale_git.unlink()
        return root
    if isinstance(src, GitSource):
        root = work / "git"
        root.mkdir()
        for args in (
            ["init", "-q"],
            ["fetch", "-q", "--depth", "1", src.url, src.commit],
            ["checkout", "-q", "FETCH_HEAD"],
        ):
            proc.run(["git", *args], what=f"git {' '.join(args)}", error=VendorError, cwd=root)
        head = proc.run(["git", "rev-parse", "HEAD"], check=False, cwd=root)
        if head.stdout.strip() != lock.commit:
            raise HashMismatchError(f"{src.url} gave commit {head.stdout.strip()}, lock pins {lock.commit}")
        shutil.rmtree(root / ".git")
        return root
    if isinstance(src, PathSource):
        if not (src.path / "CMakeLists.txt").is_file():
            raise MissingInputError(f"{src.path} is not a llama.cpp source tree (no CMakeLists.txt)")
        root = work / "copy"
        shutil.copytree(src.path, root, symlinks=True, ignore=shutil.ignore_patterns(".git", "build*"))
        return root
    raise VendorError(f"unsupported source {src!r}")


def read_stamp(dest: Path = VENDOR_DIR) -> dict[str, object] | None:
    import json

    try:
        return json.loads(_stamp_path(dest).read_text())
    except (FileNotFoundError, ValueError):
        return None


def run(
    lock: SourceLock,
    source_name: str | None = None,
    *,
    from_path: Path | None = None,
    archive: Path | None = None,
    dest: Path = VENDOR_DIR,
    force: bool = False,
) -> VendoredTree:
    """Make ``dest`` hold the locked llama.cpp tree and return it verified.

    The tree is unpacked beside ``dest`` and renamed into place only after every hash
    check passed, so a mismatch leaves an existing tree untouched.
    """
    src: Source = PathSource("path", from_path.resolve()) if from_path else lock.source(source_name)
    stamp = read_stamp(dest)
    if not force and stamp and stamp.get("source") == src.identity and dest.is_dir():
        current = tree_hash(dest)
        if current == stamp.get("tree_sha256"):
            log.info("vendor/llama.cpp is up to date (%s)", current[:16])
            return VendoredTree(dest, current, src.identity, lock.commit, lock.build_number)
        log.warning("vendor/llama.cpp was modified since it was vendored: unpacking it again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vendor-", dir=dest.parent) as tmp:
        root = _materialize(src, lock, Path(tmp), archive)
        digest = tree_hash(root)
        if src.tree_sha256 and digest != src.tree_sha256:
            raise HashMismatchError(
                f"unpacked tree from {src.identity} has tree hash {digest}, the lock pins "
                f"{src.tree_sha256}; {dest} was left untouched"
            )
        replace_dir(root, dest)
    tree = VendoredTree(dest, digest, src.identity, lock.commit, lock.build_number)
    write_json_atomic(_stamp_path(dest), tree.to_json())
    log.info("vendored llama.cpp %s into %s (tree %s)", lock.short_commit, dest, digest[:16])
    return tree


def current_tree(lock: SourceLock, dest: Path = VENDOR_DIR) -> VendoredTree:
    """The vendored tree as it is now, rehashed; an error if it is missing."""
    if not (dest / "CMakeLists.txt").is_file():
        raise MissingInputError(f"{dest} has no llama.cpp source; run `nox -s vendor` first")
    stamp = read_stamp(dest) or {}
    return VendoredTree(
        dest, tree_hash(dest), str(stamp.get("source", "unknown")), lock.commit, lock.build_number
    )

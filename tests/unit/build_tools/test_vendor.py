"""Vendoring: hashes are checked before anything replaces vendor/llama.cpp."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from build_tools.common.hashing import sha256_file, tree_hash
from build_tools.errors import HashMismatchError, MissingInputError
from build_tools.inputs.lock import parse_lock
from build_tools.stages.vendor import read_stamp
from build_tools.stages.vendor import run as vendor

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def _make_sdist(path: Path, content: str = "project(x)\n") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in {
            "pkg-1.0/vendor/llama.cpp/CMakeLists.txt": content.encode(),
            "pkg-1.0/vendor/llama.cpp/src/a.c": b"int a;\n",
            "pkg-1.0/vendor/llama.cpp/.git": b"gitdir: ../../.git/modules/x\n",
            "pkg-1.0/setup.py": b"",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _lock(sha: str, tree: str | None = None):
    src = {
        "kind": "pypi-sdist", "package": "pkg", "version": "1.0", "filename": "pkg-1.0.tar.gz",
        "sha256": sha, "subdir": "pkg-1.0/vendor/llama.cpp",
    }
    if tree:
        src["tree_sha256"] = tree
    return parse_lock({
        "schema_version": 1, "llama_cpp": {"commit": COMMIT, "build_number": 1},
        "default_source": "sdist", "sources": {"sdist": src},
    })


@pytest.fixture()
def sdist(tmp_path) -> Path:
    return _make_sdist(tmp_path / "pkg-1.0.tar.gz")


def test_vendor_unpacks_and_records_tree_hash(tmp_path, sdist):
    dest = tmp_path / "vendor" / "llama.cpp"
    tree = vendor(_lock(sha256_file(sdist)), archive=sdist, dest=dest)
    assert (dest / "CMakeLists.txt").read_text() == "project(x)\n"
    assert not (dest / ".git").exists()  # the dangling gitlink is dropped
    assert tree.tree_sha256 == tree_hash(dest)
    assert read_stamp(dest)["tree_sha256"] == tree.tree_sha256


def test_archive_hash_mismatch_leaves_existing_tree_untouched(tmp_path, sdist):
    dest = tmp_path / "vendor" / "llama.cpp"
    good = vendor(_lock(sha256_file(sdist)), archive=sdist, dest=dest)
    before = tree_hash(dest)
    (tmp_path / "evil").mkdir()
    evil = _make_sdist(tmp_path / "evil" / "pkg-1.0.tar.gz", content="project(evil)\n")
    with pytest.raises(HashMismatchError, match="does not match the lock"):
        vendor(_lock(sha256_file(sdist)), archive=evil, dest=dest, force=True)
    assert tree_hash(dest) == before == good.tree_sha256
    assert sorted(p.name for p in dest.parent.iterdir()) == [".llama.cpp.stamp.json", "llama.cpp"]


def test_tree_hash_mismatch_is_refused(tmp_path, sdist):
    dest = tmp_path / "vendor" / "llama.cpp"
    with pytest.raises(HashMismatchError, match="tree hash"):
        vendor(_lock(sha256_file(sdist), tree="0" * 64), archive=sdist, dest=dest)
    assert not dest.exists()


def test_up_to_date_tree_is_kept_and_edits_are_undone(tmp_path, sdist):
    dest = tmp_path / "vendor" / "llama.cpp"
    lock = _lock(sha256_file(sdist))
    first = vendor(lock, archive=sdist, dest=dest)
    marker = dest / "src" / "a.c"
    inode = marker.stat().st_ino
    assert vendor(lock, archive=sdist, dest=dest).tree_sha256 == first.tree_sha256
    assert marker.stat().st_ino == inode  # not unpacked again
    marker.write_text("int tampered;\n")
    again = vendor(lock, archive=sdist, dest=dest)
    assert again.tree_sha256 == first.tree_sha256 and marker.read_text() == "int a;\n"


def test_vendor_from_local_directory(tmp_path, sdist):
    src = tmp_path / "checkout"
    (src / "sub").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(y)\n")
    (src / "sub" / "f.c").write_text("int f;\n")
    (src / ".git").mkdir()
    dest = tmp_path / "vendor" / "llama.cpp"
    tree = vendor(_lock(sha256_file(sdist)), from_path=src, dest=dest)
    assert (dest / "sub" / "f.c").is_file() and not (dest / ".git").exists()
    assert tree.source == f"path:{src.resolve()}"


def test_missing_archive_and_missing_checkout(tmp_path, sdist):
    lock = _lock(sha256_file(sdist))
    with pytest.raises(MissingInputError, match="archive not found"):
        vendor(lock, archive=tmp_path / "nope.tar.gz", dest=tmp_path / "v" / "llama.cpp")
    with pytest.raises(MissingInputError, match="not a llama.cpp source tree"):
        vendor(lock, from_path=tmp_path, dest=tmp_path / "v" / "llama.cpp")


def test_archive_with_escaping_member_is_refused(tmp_path):
    bad = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        for name in ("pkg-1.0/vendor/llama.cpp/CMakeLists.txt", "pkg-1.0/../../escape.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "v" / "llama.cpp"
    with pytest.raises(Exception, match="(?i)unsafe|outside|path"):
        vendor(_lock(sha256_file(bad)), archive=bad, dest=dest)
    assert not (tmp_path / "escape.txt").exists() and not dest.exists()

"""The sdist: reproducible, only the build's files, and validate refuses what the lock and the project do not explain."""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from build_tools.common.hashing import tree_hash
from build_tools.common.paths import LOCK_FILE, REPO_ROOT, VENDOR_DIR
from build_tools.errors import HashMismatchError
from build_tools.inputs.lock import load_lock, parse_lock
from build_tools.stages import sdist
from build_tools.stages.sdist.build import write_tar

VERSION = sdist.build_module.read_project(REPO_ROOT).version

# name -> (content, executable)
TREE = {
    "CMakeLists.txt": (b"project(llama.cpp)\n", False),
    "LICENSE": (b"MIT\n", False),
    "ggml/src/ggml.c": (b"int ggml;\n", False),
    "ggml/src/gen.sh": (b"#!/bin/sh\n", True),
    "src/llama.cpp": (b"int llama;\n", False),
    "tools/mtmd/mtmd.cpp": (b"int mtmd;\n", False),
    "tools/server/server.cpp": (b"int server;\n", False),
    "docs/build.md": (b"# build\n", False),
    "models/ggml-vocab.gguf": (b"GGUF" + bytes(64), False),
}
PROJECT = {
    "pyproject.toml": (REPO_ROOT / "pyproject.toml").read_bytes(),
    "README.md": b"# readme\n",
    "LICENSE": b"MIT\n",
    "CMakeLists.txt": b"cmake_minimum_required(VERSION 3.21)\n",
    "cmake/stage_libs.cmake": b"# stage\n",
    "llama_cpp/__init__.py": b"",
    "llama_cpp/_version.py": (REPO_ROOT / "llama_cpp/_version.py").read_bytes(),
    "tests/test_x.py": b"def test(): pass\n",  # tracked, but not a build file
}


@pytest.fixture
def project(tmp_path):
    """A git checkout of a small project, its llama.cpp tree and a lock pinning that tree."""
    tree = tmp_path / "vendor" / "llama.cpp"
    for name, (data, exe) in TREE.items():
        p = tree / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(0o755 if exe else 0o644)
    repo = tmp_path
    for name, data in PROJECT.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    lock_data = json.loads(LOCK_FILE.read_text())
    for src in lock_data["sources"].values():
        src.pop("tree_sha256", None)
    lock_data["sources"][lock_data["default_source"]]["tree_sha256"] = tree_hash(tree)
    lock_path = repo / "manifests" / "llama.cpp.lock.json"
    lock_path.parent.mkdir()
    lock_path.write_text(json.dumps(lock_data))
    (repo / ".gitignore").write_text("/vendor/\n/dist/\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    return repo, tree, parse_lock(lock_data, lock_path)


def _members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return {m.name.split("/", 1)[1]: m for m in tf.getmembers()}


def _rewrite(path: Path, edit) -> None:
    """Rewrite the sdist with ``edit(entries)`` applied to its [name, bytes, executable] list."""
    top = f"llama_cpp_python-{VERSION}"
    with tarfile.open(path) as tf:
        entries = [[m.name.split("/", 1)[1], tf.extractfile(m).read(), m.mode == 0o755] for m in tf.getmembers()]
    edit(entries)
    write_tar(path, top, [tuple(e) for e in entries], sdist.build_module.source_date_epoch(None))


def test_reproducible_and_only_the_build_files(project, tmp_path):
    repo, tree, lock = project
    a = sdist.build(lock, tmp_path / "a", repo=repo, tree=tree)
    b = sdist.build(lock, tmp_path / "b", repo=repo, tree=tree)
    assert a.filename == f"llama_cpp_python-{VERSION}.tar.gz"
    assert a.path.read_bytes() == b.path.read_bytes()
    m = _members(a.path)
    assert sorted(m) == sorted([
        "PKG-INFO", "vendor/llama.cpp.sources.json", "CMakeLists.txt", "LICENSE", "README.md", "pyproject.toml",
        "cmake/stage_libs.cmake", "llama_cpp/__init__.py", "llama_cpp/_version.py", "manifests/llama.cpp.lock.json",
        "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/LICENSE", "vendor/llama.cpp/ggml/src/ggml.c",
        "vendor/llama.cpp/ggml/src/gen.sh", "vendor/llama.cpp/src/llama.cpp", "vendor/llama.cpp/tools/mtmd/mtmd.cpp",
    ])
    assert m["vendor/llama.cpp/ggml/src/gen.sh"].mode == 0o755 and m["LICENSE"].mode == 0o644
    assert {i.mtime for i in m.values()} == {a.epoch} and {(i.uid, i.gid, i.uname) for i in m.values()} == {(0, 0, "")}
    with gzip.open(a.path) as g:
        g.read(1)
    assert a.path.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header: no timestamp
    report = sdist.check(a.path, repo=repo, version=VERSION)
    assert report.ok, report.render()
    with tarfile.open(a.path) as tf:
        info = tf.extractfile(f"llama_cpp_python-{VERSION}/PKG-INFO").read().decode()
    assert f"Version: {VERSION}\n" in info and "Requires-Dist: numpy" in info


@pytest.mark.parametrize("edit, check, words", [
    (lambda e: e.append(["vendor/llama.cpp/docs/build.md", b"# build\n", False]), "unexpected-file",
     "does not need"),
    (lambda e: e.append(["vendor/llama.cpp/ggml/src/extra.c", b"int x;\n", False]), "unexpected-file",
     "not in the locked llama.cpp tree"),
    (lambda e: e.append(["setup.py", b"import os\n", False]), "unexpected-file", "not a tracked build file"),
    (lambda e: e.append(["tests/test_x.py", b"def test(): pass\n", False]), "unexpected-file",
     "not a tracked build file"),
    (lambda e: [x.__setitem__(1, b"int ggml = 1;\n") for x in e if x[0].endswith("ggml.c")], "llama-cpp",
     "differs from the locked"),
    (lambda e: [x.__setitem__(2, False) for x in e if x[0].endswith("gen.sh")], "llama-cpp", "executable bit"),
    (lambda e: e.remove(next(x for x in e if x[0].endswith("src/llama.cpp"))), "llama-cpp", "missing"),
    (lambda e: [x.__setitem__(1, x[1] + b"#\n") for x in e if x[0] == "CMakeLists.txt"], "project",
     "differs from the tracked"),
    (lambda e: [x.__setitem__(1, x[1].replace(b"Version: ", b"Version: 9")) for x in e if x[0] == "PKG-INFO"],
     "pkg-info", "PKG-INFO"),
])
def test_check_refuses(project, tmp_path, edit, check, words):
    repo, tree, lock = project
    sd = sdist.build(lock, tmp_path / "out", repo=repo, tree=tree)
    _rewrite(sd.path, edit)
    report = sdist.check(sd.path, repo=repo, version=VERSION)
    assert not report.ok
    assert any(c == check and words in m for c, m in report.failures), report.render()


def test_check_refuses_a_forged_listing(project, tmp_path):
    """A listing that vouches for an edited file no longer hashes to the tree the lock pins."""
    repo, tree, lock = project
    sd = sdist.build(lock, tmp_path / "out", repo=repo, tree=tree)

    def forge(entries):
        import hashlib
        for x in entries:
            if x[0].endswith("ggml.c"):
                x[1] = b"int evil;\n"
        listing = next(x for x in entries if x[0] == sdist.SOURCES_LISTING)
        data = json.loads(listing[1])
        for f in data["files"]:
            if f[0] == "ggml/src/ggml.c":
                f[2] = hashlib.sha256(b"int evil;\n").hexdigest()
        listing[1] = json.dumps(data).encode()

    _rewrite(sd.path, forge)
    report = sdist.check(sd.path, repo=repo, version=VERSION)
    assert [c for c, _m in report.failures] == ["lock"], report.render()


def test_check_refuses_other_metadata_and_links(project, tmp_path):
    repo, tree, lock = project
    sd = sdist.build(lock, tmp_path / "out", repo=repo, tree=tree)
    with tarfile.open(sd.path) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for m, data in members:
            if m.name.endswith("README.md"):
                m.mtime = 1700000000
            tf.addfile(m, io.BytesIO(data))
        link = tarfile.TarInfo(f"llama_cpp_python-{VERSION}/vendor/llama.cpp/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    sd.path.write_bytes(gzip.compress(buf.getvalue()))
    report = sdist.check(sd.path, repo=repo, version=VERSION)
    checks = {c for c, _m in report.failures}
    assert {"reproducible", "member-type"} <= checks, report.render()


def test_build_refuses_a_tree_the_lock_does_not_pin(project, tmp_path):
    repo, tree, lock = project
    (tree / "src" / "llama.cpp").write_bytes(b"int patched;\n")
    with pytest.raises(HashMismatchError, match="does not pin"):
        sdist.build(lock, tmp_path / "out", repo=repo, tree=tree)


@pytest.mark.skipif(not (VENDOR_DIR / "CMakeLists.txt").is_file(), reason="vendor/llama.cpp not fetched")
def test_the_project_sdist_validates(tmp_path):
    """This checkout's sdist: the locked llama.cpp's build files, under the size budget."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    sd = sdist.build(load_lock(), tmp_path, repo=REPO_ROOT, tree=VENDOR_DIR)
    report = sdist.check(sd.path, version=VERSION)
    assert report.ok, report.render()
    names = _members(sd.path)
    assert "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu" in names  # CMAKE_ARGS=-DGGML_CUDA=on builds
    assert "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp" in names
    assert not [n for n in names if n.startswith(("vendor/llama.cpp/models/", "vendor/llama.cpp/docs/", "tests/"))]
    shutil.rmtree(tmp_path, ignore_errors=True)


def _configure(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmake, make = shutil.which("cmake"), shutil.which("make")
    if cmake is None or make is None:
        pytest.skip("cmake or make is not installed")
    return subprocess.run([cmake, "-S", str(REPO_ROOT), "-B", str(tmp_path / "b"), "-G", "Unix Makefiles",
                           f"-DCMAKE_MAKE_PROGRAM={make}", *args], capture_output=True, text=True, timeout=300,
                          env=env, check=False)


def test_a_source_build_names_a_missing_compiler(tmp_path):
    """What `pip install <sdist>` shows on a machine without a C compiler (CMake itself comes from pip)."""
    done = _configure(tmp_path, env={"HOME": str(tmp_path), "PATH": str(tmp_path / "empty")})
    assert done.returncode != 0
    text = " ".join((done.stdout + done.stderr).split())
    assert "building from source needs a C compiler and CMake found none" in text
    assert "apt install build-essential" in text and "--only-binary llama-cpp-python" in text


def test_a_source_build_names_a_missing_vulkan_sdk(tmp_path):
    # where the SDK is installed, CMake is told not to find it: the same configure as on a machine without
    done = _configure(tmp_path, "-DGGML_VULKAN=on", "-DCMAKE_DISABLE_FIND_PACKAGE_Vulkan=ON")
    assert done.returncode != 0
    text = " ".join((done.stdout + done.stderr).split())
    assert "-DGGML_VULKAN=on but the Vulkan headers/loader" in text and "apt install libvulkan-dev glslc" in text


def test_a_source_build_names_vulkan_headers_too_old(tmp_path):
    """Debian 12's libvulkan-dev (1.3.239) lacks VK_EXT_layer_settings: named at configure, with the fix."""
    core = Path("/usr/include/vulkan/vulkan_core.h")
    found = re.search(r"#define VK_HEADER_VERSION (\d+)", core.read_text()) if core.is_file() else None
    if found is None or not shutil.which("glslc"):
        pytest.skip("needs the system's Vulkan headers and glslc: apt-get install libvulkan-dev glslc")
    if int(found.group(1)) >= 261:
        pytest.skip(f"the system's Vulkan headers are new enough (1.3.{found.group(1)})")
    done = _configure(tmp_path, "-DGGML_VULKAN=on")
    assert done.returncode != 0
    text = " ".join((done.stdout + done.stderr).split())
    assert f"needs Vulkan headers 1.3.261 or newer (VK_EXT_layer_settings); /usr/include has 1.3.{found.group(1)}" in text
    assert "-DVulkan_INCLUDE_DIR=" in text and 'pip install "llama-cpp-python[vulkan]"' in text

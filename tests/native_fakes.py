"""What the release-pipeline tests of every platform build their wheels from: a snapshot of the
package sources, and a stand-in native build made of given library files."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from build_tools.stages.native.build import NativeBuild
from build_tools.stages.native.manifest import NativeManifest, describe_library
from build_tools.stages.wheels import build as wheels


def snapshot_sources(root: Path) -> Path:
    """Copy the package sources into ``root``, so wheels built during a session stay comparable
    while the working tree is being edited."""
    src = Path(wheels.REPO_ROOT)
    shutil.copytree(src / "llama_cpp", root / "llama_cpp", ignore=shutil.ignore_patterns("__pycache__", "lib"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "CMakeLists.txt", "manifests/llama.cpp.lock.json"):
        if (src / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, root / name)
    shutil.copytree(src / "cmake", root / "cmake", ignore=shutil.ignore_patterns("__pycache__"))
    # a git checkout of its own: the sdist takes the project's tracked files
    (root / ".gitignore").write_text("__pycache__/\nllama_cpp/lib/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    return root


def fake_native_build(root: Path, config, libraries: Mapping[str, bytes], backends: Sequence[str]) -> NativeBuild:
    """A finished native build in ``root`` holding ``libraries`` (name -> bytes), described as the
    native stage describes real ones (so PE and Mach-O fields come from the files)."""
    (root / "lib").mkdir(parents=True)
    for name, data in libraries.items():
        (root / "lib" / name).write_bytes(data)
    libs = tuple(describe_library(root, f"lib/{name}") for name in libraries)
    key = hashlib.sha256(b"".join(lib.sha256.encode() for lib in libs)).hexdigest()
    manifest = NativeManifest(
        config=config.to_json(), key=key, key_inputs={}, source={"commit": "0" * 40, "build_number": 1},
        toolchain={"versions": {"cc": "fake"}}, cmake={"configure": [], "build": []}, libraries=libs,
        backends=tuple(backends))
    manifest.write(root)
    return NativeBuild(config, key, root, manifest, reused=True)

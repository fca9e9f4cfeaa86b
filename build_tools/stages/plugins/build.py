"""Write a backend plugin wheel from a GPU configuration's native build.

The wheel holds the backend's module library (``lib/libggml-vulkan.so``) and nothing the core wheel
already has: the module links ``libggml-base`` (and the CUDA module NVIDIA's runtime, from the
wheels its Requires-Dist names), which the loader has loaded from the core wheel before it probes
plugins. ``plugin.json`` records the sha256 of the base libraries the module was built against;
validate compares them with the core wheel's (:mod:`.check`).

    llama_cpp_backend_<key>/__init__.py
    llama_cpp_backend_<key>/lib/<backend module>
    llama_cpp_backend_<key>/plugin.json
    llama_cpp_python_<key>-<version>.dist-info/{METADATA, WHEEL, entry_points.txt, RECORD}
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common.hashing import sha256_file
from ...common.paths import REPO_ROOT
from ...errors import WheelBuildError
from ...inputs.configs import BuildConfig
from ..native.manifest import NativeManifest
from ..wheels.build import read_project, render_wheel_file
from ..wheels.inwheel import Entry, source_date_epoch, write_wheel

ENTRY_POINT_GROUP = "llama_cpp.backends"  # llama_cpp._native.plugins reads this group
PLUGIN_RECORD = "plugin.json"
# The libraries every backend module links and the core wheel ships: they must be the core's bytes.
BASE_LIBRARY = re.compile(r"^(lib)?(ggml-base|ggml|llama)(\.\d+)*\.(so|dylib|dll)(\.\d+)*$")
REQUIRED_BASE = ("ggml-base", "llama")


def backend_family(config: BuildConfig) -> str | None:
    """ggml's name of the configuration's GPU backend (``cuda``, ``vulkan``), None for a CPU build."""
    return "cuda" if config.cuda is not None else "vulkan" if config.vulkan is not None else None


def plugin_key(config: BuildConfig) -> str | None:
    """The extra and name suffix: ``cuda12``/``cuda13`` by CUDA major version, ``vulkan``."""
    if config.cuda is not None:
        return f"cuda{config.cuda.major}"
    return "vulkan" if config.vulkan is not None else None


def plugin_name(key: str) -> str:
    return f"llama-cpp-python-{key}"


def plugin_package(key: str) -> str:
    return f"llama_cpp_backend_{key}"


def module_files(manifest: NativeManifest, family: str) -> list[str]:
    """The backend's module libraries in a native build (``libggml-cuda.so``, ``ggml-vulkan.dll``)."""
    pat = re.compile(rf"^(lib)?ggml-{re.escape(family)}([.-]|$)")
    return sorted(lib.name for lib in manifest.libraries if pat.match(lib.name))


def base_libraries(manifest: NativeManifest) -> dict[str, str]:
    return {lib.name: lib.sha256 for lib in manifest.libraries if BASE_LIBRARY.match(lib.name)}


@dataclass(frozen=True)
class BuiltPlugin:
    path: Path
    name: str
    key: str
    family: str
    version: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return self.path.name


def _metadata(name: str, version: str, family: str, requires: Sequence[str], requires_python: str | None) -> bytes:
    lines = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}",
             f"Summary: The {family} backend of llama-cpp-python {version} (pip install \"llama-cpp-python[...]\")",
             "License-Expression: MIT"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n").encode()


def build(config: BuildConfig, manifest: NativeManifest, root: Path, out_dir: Path, *, platform_tag: str,
          repo: Path = REPO_ROOT, epoch: int | None = None) -> BuiltPlugin:
    """The plugin wheel of ``config``'s GPU backend from its native build in ``root``."""
    family, key = backend_family(config), plugin_key(config)
    if family is None or key is None:
        raise WheelBuildError(f"{config.name} builds no GPU backend: it has no plugin wheel")
    modules = module_files(manifest, family)
    if not modules:
        raise WheelBuildError(f"the native build of {config.name} has no {family} backend module "
                              f"(libraries: {', '.join(lib.name for lib in manifest.libraries)})")
    base = base_libraries(manifest)
    for want in REQUIRED_BASE:
        if not any(re.match(rf"^(lib)?{want}[.]", n) for n in base):
            raise WheelBuildError(f"the native build of {config.name} has no {want} library to record")
    meta = read_project(repo)
    version = meta.version
    name, pkg = plugin_name(key), plugin_package(key)
    dist_name = name.replace("-", "_")
    dist_info = f"{dist_name}-{version}.dist-info"
    module_data = {}
    for m in modules:
        lib = manifest.library(m)
        data = (root / lib.path).read_bytes()
        if sha256_file(root / lib.path) != lib.sha256:
            raise WheelBuildError(f"{root / lib.path} changed since the native build; rebuild {config.name}")
        module_data[m] = data
    record: dict[str, Any] = {
        "schema_version": 1, "plugin": name, "family": family, "version": version, "config": config.name,
        "native_key": manifest.key, "base_libraries": base,
        "modules": {m: manifest.library(m).sha256 for m in modules},
    }
    requires = [f"{meta.name}=={version}", *(config.cuda.runtime_requires if config.cuda else ())]
    entries = [
        Entry(f"{pkg}/__init__.py", f'"""The {family} backend module of llama-cpp-python {version}; llama_cpp loads '
              f'it from lib/ (entry point group {ENTRY_POINT_GROUP})."""\n'.encode()),
        Entry(f"{pkg}/{PLUGIN_RECORD}", (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()),
        *(Entry(f"{pkg}/lib/{m}", data, executable=True) for m, data in module_data.items()),
        Entry(f"{dist_info}/METADATA", _metadata(name, version, family, requires, meta.requires_python)),
        Entry(f"{dist_info}/entry_points.txt", f"[{ENTRY_POINT_GROUP}]\n{family} = {pkg}\n".encode()),
        Entry(f"{dist_info}/WHEEL", render_wheel_file([f"py3-none-{platform_tag}"])),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist_name}-{version}-py3-none-{platform_tag}.whl"
    write_wheel(path, entries, dist_info, source_date_epoch(epoch))
    return BuiltPlugin(path, name, key, family, version, sha256_file(path), path.stat().st_size)

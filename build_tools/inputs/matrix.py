"""The CI matrices, read from the build matrix and the one Python-version list (never written in YAML).

``python -m build_tools matrix --json`` prints :func:`ci_matrices`; the release workflow's first
job hands each entry to the others through ``fromJSON(needs.matrix.outputs.<name>)``, so a
release configuration added to ``manifests/configs.toml`` gets its jobs without a YAML edit.
"""

from __future__ import annotations

from typing import Any

from ..common.interpreters import VERSIONS
from ..errors import ConfigError
from .configs import BuildConfig, BuildMatrix, load_matrix

# Where a configuration's jobs run, by its target (system, machine): GitHub's runner, and the
# manylinux image whose glibc 2.28 the libraries link against (so auditwheel can tag them
# manylinux_2_28; on the runner's own distro the tag would follow its newer glibc). The arm64
# image's GCC (gcc-toolset 14) knows armv9.2-a+sme, which every aarch64 CPU variant needs.
# Windows and macOS run on the runner itself: "" is no container (an expression that evaluates
# to an empty string runs the job on the host, actions/runner#265).
RUNNERS: dict[tuple[str, str], tuple[str, str]] = {
    ("Linux", "x86_64"): ("ubuntu-24.04", "quay.io/pypa/manylinux_2_28_x86_64"),
    ("Linux", "aarch64"): ("ubuntu-24.04-arm", "quay.io/pypa/manylinux_2_28_aarch64"),
    ("Windows", "x86_64"): ("windows-2022", ""),
    ("Darwin", "arm64"): ("macos-14", ""),
}
# The compilers a target's native job names in CC/CXX ("": the first one on PATH). Windows: the
# MSVC toolchain (headers, C++ runtime, linker, from vcvars64) driven by LLVM's GNU-style clang, as
# llama.cpp's own Windows releases do: ggml builds no AMX or BF16 CPU variant when MSVC is set (cl
# or clang-cl). nvcc's host compiler stays cl, the only one it accepts on Windows.
COMPILERS: dict[tuple[str, str], tuple[str, str]] = {("Windows", "x86_64"): ("clang", "clang++")}
# A Windows system CUDA comes from NVIDIA's redistributable archives (hash-checked against their
# redistrib_<release>.json): the release per CUDA line, and the components nvcc needs to build ggml.
# (CUDA 13's nvcc is on PyPI for Windows too: only CUDA 12 needs this.)
WINDOWS_CUDA: dict[str, str] = {"12.8": "12.8.1"}
WINDOWS_CUDA_COMPONENTS: dict[int, tuple[str, ...]] = {12: ("cuda_nvcc", "cuda_cudart", "cuda_cccl", "libcublas")}
# The interpreter the release tool itself runs on, where setup-python provides it (no container).
TOOL_PYTHON = "3.12"


def target(config: BuildConfig) -> tuple[str, str]:
    """(system, machine) the configuration's libraries are built for."""
    return config.target


def runner(config: BuildConfig) -> tuple[str, str]:
    """(runs-on, container) of the configuration's native, wheels and smoke jobs."""
    where = target(config)
    if where not in RUNNERS:
        raise ConfigError(f"{config.name}: the release workflow has no runner for {where[0]} {where[1]} "
                          f"(build_tools/inputs/matrix.py RUNNERS); set release = false or add one")
    return RUNNERS[where]


def windows_cuda(config: BuildConfig) -> dict[str, str]:
    """The Windows system CUDA's release and components, or empty strings."""
    cuda = config.cuda
    if cuda is None or cuda.toolkit != "system" or target(config)[0] != "Windows":
        return {"windows_cuda": "", "windows_cuda_components": ""}
    if cuda.version not in WINDOWS_CUDA or cuda.major not in WINDOWS_CUDA_COMPONENTS:
        raise ConfigError(f"{config.name}: no Windows CUDA {cuda.version} release is named in "
                          "build_tools/inputs/matrix.py WINDOWS_CUDA; add it")
    return {"windows_cuda": WINDOWS_CUDA[cuda.version],
            "windows_cuda_components": " ".join(WINDOWS_CUDA_COMPONENTS[cuda.major])}


def _entry(config: BuildConfig) -> dict[str, str]:
    """One configuration as a matrix row. ``system_cuda``: the CUDA version to install from the
    distro, or ""; ``tool_python``: the release tool's interpreter for setup-python where the job runs
    on the runner itself, else "" (the manylinux image's python3.12); ``cc``/``cxx``: the compilers."""
    cuda = config.cuda
    runs_on, container = runner(config)
    cc, cxx = COMPILERS.get(target(config), ("", ""))
    return {"config": config.name, "backend": config.backend, "runner": runs_on, "container": container,
            "system_cuda": cuda.version if cuda is not None and cuda.toolkit == "system" else "",
            "tool_python": "" if container else TOOL_PYTHON, "cc": cc, "cxx": cxx, **windows_cuda(config)}


def ci_matrices(matrix: BuildMatrix | None = None) -> dict[str, Any]:
    """``configs`` (native, wheels), ``smoke`` (configuration × Python, with the configuration's
    runner), ``names``, ``python``: release configs only."""
    matrix = matrix or load_matrix()
    release = [c for c in matrix.configs.values() if c.release]
    return {
        "configs": {"include": [_entry(c) for c in release]},
        "smoke": {"include": [{"config": c.name, "python": v, "runner": runner(c)[0]}
                              for c in release for v in VERSIONS]},
        "names": " ".join(c.name for c in release),
        "python": list(VERSIONS),
    }

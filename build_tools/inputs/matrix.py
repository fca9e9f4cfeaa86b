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
RUNNERS: dict[tuple[str, str], tuple[str, str]] = {
    ("Linux", "x86_64"): ("ubuntu-24.04", "quay.io/pypa/manylinux_2_28_x86_64"),
    ("Linux", "aarch64"): ("ubuntu-24.04-arm", "quay.io/pypa/manylinux_2_28_aarch64"),
}


def target(config: BuildConfig) -> tuple[str, str]:
    """(system, machine) the configuration's libraries are built for."""
    if config.cross is not None:
        return config.cross.system_name, config.cross.system_processor
    return "Linux", "x86_64"


def runner(config: BuildConfig) -> tuple[str, str]:
    """(runs-on, container) of the configuration's native, wheels and smoke jobs."""
    where = target(config)
    if where not in RUNNERS:
        raise ConfigError(f"{config.name}: the release workflow has no runner for {where[0]} {where[1]} "
                          f"(build_tools/inputs/matrix.py RUNNERS); set release = false or add one")
    return RUNNERS[where]


def _entry(config: BuildConfig) -> dict[str, str]:
    """One configuration as a matrix row; ``system_cuda``: the CUDA version to install from the distro, or ""."""
    cuda = config.cuda
    runs_on, container = runner(config)
    return {"config": config.name, "backend": config.backend, "runner": runs_on, "container": container,
            "system_cuda": cuda.version if cuda is not None and cuda.toolkit == "system" else ""}


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

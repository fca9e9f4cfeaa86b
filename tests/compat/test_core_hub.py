"""``Llama.from_pretrained`` through ``huggingface_hub`` (here a stand-in module with its API)."""

from __future__ import annotations

import shutil
import sys
import types

import pytest

from llama_cpp import Llama


@pytest.fixture
def fake_hub(tmp_path, monkeypatch, spm_model):
    """A huggingface_hub whose repository ``org/tiny`` holds the spm fixture under two names."""
    snapshot = tmp_path / "snapshot"
    (snapshot / "sub").mkdir(parents=True)
    shutil.copy(spm_model, snapshot / "tiny-Q8_0.gguf")
    shutil.copy(spm_model, snapshot / "sub" / "tiny-F16.gguf")
    files = ["README.md", "tiny-Q8_0.gguf", "sub/tiny-F16.gguf"]
    hub = types.ModuleType("huggingface_hub")
    hub.online = True
    hub.downloads = []

    def validate_repo_id(repo_id):
        if repo_id.count("/") != 1:
            raise ValueError(f"bad repo id {repo_id!r}")

    def list_repo_files(repo_id):
        if not hub.online:
            raise OSError("offline")
        return files

    def snapshot_download(repo_id, cache_dir=None, local_files_only=False):
        assert local_files_only
        return str(snapshot)

    def hf_hub_download(repo_id, filename, subfolder=None, cache_dir=None, local_dir=None):
        hub.downloads.append((repo_id, subfolder, filename))
        return str(snapshot / (subfolder or "") / filename)

    hub.utils = types.SimpleNamespace(validate_repo_id=validate_repo_id)
    hub.list_repo_files, hub.snapshot_download, hub.hf_hub_download = list_repo_files, snapshot_download, hf_hub_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    return hub


def test_plain_filename(fake_hub):
    with Llama.from_pretrained("org/tiny", "tiny-Q8_0.gguf", n_ctx=64, n_threads=1, verbose=False) as m:
        assert m.model_path.endswith("tiny-Q8_0.gguf") and m.n_ctx() >= 64
    assert fake_hub.downloads == [("org/tiny", None, "tiny-Q8_0.gguf")]


def test_glob_pattern_in_a_subfolder(fake_hub):
    with Llama.from_pretrained("org/tiny", "*F16.gguf", vocab_only=True, verbose=False) as m:
        assert m.model_path.endswith("sub/tiny-F16.gguf")
    assert fake_hub.downloads == [("org/tiny", "sub", "tiny-F16.gguf")]


def test_glob_offline_uses_the_cached_snapshot(fake_hub):
    fake_hub.online = False
    with Llama.from_pretrained("org/tiny", "*Q8_0.gguf", vocab_only=True, verbose=False) as m:
        assert m.model_path.endswith("tiny-Q8_0.gguf")


def test_additional_files_come_first(fake_hub):
    with Llama.from_pretrained("org/tiny", "*Q8_0.gguf", additional_files=["README.md"], vocab_only=True,
                               verbose=False):
        pass
    assert [d[2] for d in fake_hub.downloads] == ["README.md", "tiny-Q8_0.gguf"]


@pytest.mark.parametrize(("pattern", "message"), [("*.gguf", "2 files"), ("*Q2_K*", "No file")])
def test_pattern_must_match_one_file(fake_hub, pattern, message):
    with pytest.raises(ValueError, match=message):
        Llama.from_pretrained("org/tiny", pattern)


def test_bad_repo_id_and_missing_filename(fake_hub):
    with pytest.raises(ValueError, match="bad repo id"):
        Llama.from_pretrained("not-a-repo-id", "x.gguf")
    with pytest.raises(ValueError, match="needs filename"):
        Llama.from_pretrained("org/tiny", None)


def test_without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        Llama.from_pretrained("org/tiny", "tiny-Q8_0.gguf")

"""Issue 29, part 1: no model file takes the interpreter down.

Every file here aborts, crashes or hangs llama.cpp (or is refused by the header checks before
that); ``Llama(isolate_load=True)`` must raise ModelLoadError naming the file, in this very
process: a failure of the boundary kills the test run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from build_tools.fixtures.cache import fixture_path
from llama_cpp import Llama
from llama_cpp._errors import ModelLoadError
from llama_cpp._safety import isolated_load

from ._hostile_models import CASES, hostile_model

#: cases llama.cpp itself kills (SIGABRT) or hangs in, rather than the header checks refusing
NATIVE_DEATHS = {"token_duplicate": "SIGABRT", "token_empty": "SIGABRT", "token_invalid_utf8": "SIGABRT",
                 "tokenizer_none": "SIGABRT", "tokenizer_no_vocab": "SIGABRT", "tokenizer_bert": "SIGABRT",
                 "tokenizer_rwkv": "did not finish", "qwen35_ssm_inner_0": "SIGABRT",
                 "qwen35_ssm_inner_7": "SIGABRT"}


@pytest.fixture(autouse=True)
def _verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLAMA_CPP_ISOLATE_CACHE", str(tmp_path / "verdicts"))
    monkeypatch.setenv(isolated_load.ENV_TIMEOUT, "20")
    return tmp_path / "verdicts"


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_model_file_is_refused(tmp_path: Path, case: str) -> None:
    path = hostile_model(tmp_path, case)
    with pytest.raises(ModelLoadError) as info:
        Llama(str(path), n_ctx=64, verbose=False, isolate_load=True)
    message = str(info.value)
    assert str(path) in message
    if case in NATIVE_DEATHS:
        assert NATIVE_DEATHS[case] in message


def test_verdict_is_cached_per_file(tmp_path: Path) -> None:
    path = hostile_model(tmp_path, "tokenizer_bert")
    with pytest.raises(ModelLoadError, match="SIGABRT"):
        isolated_load.verify_model_file(path)
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="cached verdict"):
        isolated_load.verify_model_file(path)
    assert time.monotonic() - start < 0.5


def test_good_file_passes_once_then_from_cache() -> None:
    path = fixture_path("llama_spm")
    first = isolated_load.verify_model_file(path)
    assert first.ok and not first.cached
    again = isolated_load.verify_model_file(path)
    assert again.ok and again.cached
    with Llama(str(path), n_ctx=64, verbose=False, isolate_load=True) as llm:
        assert llm.tokenize(b"hi")


def test_kv_overrides_go_through_the_header_guard() -> None:
    with pytest.raises(ModelLoadError, match="block_count"):
        Llama(str(fixture_path("llama_spm")), kv_overrides={"llama.block_count": 10**9}, verbose=False)


def test_kv_overrides_are_applied_in_the_child() -> None:
    """A string override that makes llama.cpp abort is caught by the child, not by the header guard."""
    with pytest.raises(ModelLoadError, match="SIGABRT"):
        Llama(str(fixture_path("llama_spm")), kv_overrides={"tokenizer.ggml.model": "bert"}, verbose=False,
              isolate_load=True)


def test_where_the_boundary_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from llama_cpp.server.settings import ModelSettings

    monkeypatch.delenv(isolated_load.ENV_ON, raising=False)
    assert not isolated_load.enabled(None)
    assert isolated_load.enabled(True)
    monkeypatch.setenv(isolated_load.ENV_ON, "1")
    assert isolated_load.enabled(None)
    assert ModelSettings(model="x.gguf").isolate_load


def test_content_key_changes_with_bytes_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(b"GGUF" + bytes(3 << 20))
    k1 = isolated_load.content_key(path)
    assert isolated_load.content_key(path, {"kv_overrides": {"a": 1}}) != k1
    with open(path, "r+b") as f:
        f.seek(2 << 20)
        f.write(b"x" * 70000)
    assert isolated_load.content_key(path) != k1

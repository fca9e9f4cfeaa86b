"""A decode cut short (Ctrl-C, an exception from a hook) leaves the context usable: the next call finds
memory and its record apart and evaluates what it needs, with the same output as a fresh context."""

from __future__ import annotations

import pytest

from llama_cpp import Llama

KW = {"n_ctx": 256, "n_threads": 1, "n_threads_batch": 1, "verbose": False}


@pytest.fixture(scope="module")
def reference(spm_model) -> str:
    with Llama(str(spm_model), **KW) as llm:
        return llm("hello world", max_tokens=12, temperature=0.0)["choices"][0]["text"]


def _cut_after_decoding(llm: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next prompt evaluation reaches memory, then stops before it is recorded (as a Ctrl-C between
    the two would)."""
    decode = llm.sequence.decode

    def cut(*args, **kwargs):
        decode(*args, **kwargs)
        monkeypatch.undo()
        raise KeyboardInterrupt

    monkeypatch.setattr(llm.sequence, "decode", cut)


@pytest.mark.parametrize("first", ["hello world", "an unrelated prompt first", "hello"])
def test_memory_ahead_of_its_record(spm_model, reference, monkeypatch, first):
    with Llama(str(spm_model), **KW) as llm:
        _cut_after_decoding(llm, monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            llm(first, max_tokens=4, temperature=0.0)
        assert llm("hello world", max_tokens=12, temperature=0.0)["choices"][0]["text"] == reference
        # again after a whole answer: the continuation of a cut prompt
        _cut_after_decoding(llm, monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            llm("hello world" + reference, max_tokens=4, temperature=0.0)
        assert llm("hello world", max_tokens=12, temperature=0.0)["choices"][0]["text"] == reference


def test_record_ahead_of_memory(spm_model, reference):
    with Llama(str(spm_model), **KW) as llm:
        llm("hello world", max_tokens=4, temperature=0.0)
        llm._input_ids.extend(llm.tokenize(b" and more", add_bos=False))  # recorded, never decoded
        assert llm("hello world", max_tokens=12, temperature=0.0)["choices"][0]["text"] == reference

"""``Llama(draft_model=...)``: drafted tokens are verified in one batch and the output is plain greedy's."""

from __future__ import annotations

import numpy as np
import pytest

from llama_cpp import Llama
from llama_cpp._errors import CallbackError, TokenizationError
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

PROMPT = "the quick brown fox jumps over the lazy dog and the quick brown fox jumps over the"


def make(path, **kw):
    return Llama(path, n_ctx=256, n_threads=1, verbose=False, **kw)


def test_find_candidate_pred_tokens():
    find = LlamaPromptLookupDecoding.find_candidate_pred_tokens
    assert find(np.array([1, 2, 3, 1, 2, 3, 1, 2, 3]), max_ngram_size=3, num_pred_tokens=2).tolist() == [1, 2]
    assert find(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9]), max_ngram_size=3, num_pred_tokens=2).size == 0
    assert find(np.array([5, 1, 9, 7, 1]), max_ngram_size=2, num_pred_tokens=5).tolist() == [9, 7, 1]
    assert find(np.array([4]), max_ngram_size=2, num_pred_tokens=3).size == 0
    assert find(np.array([4, 4]), 2, 3).dtype == np.intc
    with pytest.raises(ValueError):
        LlamaPromptLookupDecoding(num_pred_tokens=0)


class Oracle(LlamaDraftModel):
    """Proposes the true continuation (known from a plain run), ``n`` tokens at a time."""

    def __init__(self, full: list[int], n: int, wrong: bool = False) -> None:
        self.full, self.n, self.wrong, self.calls = full, n, wrong, 0

    def __call__(self, input_ids, /, **kwargs):
        self.calls += 1
        k = len(input_ids)
        out = np.array(self.full[k:k + self.n], dtype=np.intc)
        return (out + 1) % 100 if self.wrong else out


def plain_completion(path, n):
    with make(path) as m:
        return m(PROMPT, max_tokens=n, temperature=0)


@pytest.mark.parametrize("draft", [LlamaPromptLookupDecoding(), LlamaPromptLookupDecoding(max_ngram_size=3,
                                                                                          num_pred_tokens=4)])
def test_prompt_lookup_output_is_plain_greedy(spm_model, draft):
    expected = plain_completion(spm_model, 40)
    with make(spm_model, draft_model=draft) as m:
        got = m(PROMPT, max_tokens=40, temperature=0)
        assert got["choices"][0]["text"] == expected["choices"][0]["text"]
        assert got["usage"] == expected["usage"]
        streamed = "".join(c["choices"][0]["text"] for c in m(PROMPT, max_tokens=40, temperature=0, stream=True))
        assert streamed == expected["choices"][0]["text"]


def test_right_drafts_are_accepted_and_wrong_ones_rejected(spm_model):
    with make(spm_model) as m:
        prompt = m.tokenize(PROMPT.encode())
        gen = m.generate(prompt, temp=0)
        cont = [next(gen) for _ in range(24)]
        gen.close()
    full = prompt + cont
    right, wrong = Oracle(full, 6), Oracle(full, 6, wrong=True)
    for draft in (right, wrong):
        with make(spm_model, draft_model=draft) as m:
            gen = m.generate(prompt, temp=0)
            assert [next(gen) for _ in range(24)] == cont
            gen.close()
            # the memory holds exactly the tokens the object reports (rejected drafts were removed)
            n = m.n_tokens
            assert m.input_ids.tolist() == full[:n]
    assert right.calls <= 24 // 7 + 2  # each verify batch accepted the whole proposal (+1 bonus token)
    assert wrong.calls >= 23  # nothing accepted: one call per token


def test_draft_then_plain_prefix_reuse(spm_model):
    """After a drafted run the context is consistent: a following plain call reuses it correctly."""
    expected = plain_completion(spm_model, 20)
    with make(spm_model, draft_model=LlamaPromptLookupDecoding()) as m:
        m(PROMPT, max_tokens=30, temperature=0)
        m.draft_model = None
        assert m(PROMPT, max_tokens=20, temperature=0)["choices"][0]["text"] == expected["choices"][0]["text"]


def test_bad_draft_model_is_a_clear_error(spm_model):
    class Raising(LlamaDraftModel):
        def __call__(self, input_ids, /, **kwargs):
            raise RuntimeError("boom")

    class OutOfVocab(LlamaDraftModel):
        def __call__(self, input_ids, /, **kwargs):
            return np.array([10 ** 7], dtype=np.intc)

    with make(spm_model, draft_model=Raising()) as m:
        with pytest.raises(CallbackError, match="draft_model Raising raised RuntimeError: boom"):
            m(PROMPT, max_tokens=5, temperature=0)
    with make(spm_model, draft_model=OutOfVocab()) as m:
        with pytest.raises(TokenizationError, match="draft token"):
            m(PROMPT, max_tokens=5, temperature=0)
        m.draft_model = None
        assert m(PROMPT, max_tokens=3, temperature=0)["usage"]["completion_tokens"] >= 1
    with pytest.raises(TypeError, match="draft_model"):
        make(spm_model, draft_model=42)


@pytest.mark.parametrize("fixture", ["hybrid_model", "recurrent_model"])
def test_prompt_lookup_runs_on_recurrent_memory(request, fixture):
    """Prompt lookup drafts through the speculative engine, which rolls recurrent state back: the
    output is plain greedy's, drafts were verified, and no warning is given."""
    import warnings

    path = request.getfixturevalue(fixture)
    with make(path) as m:
        expected = m(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = make(path, draft_model=LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=4))
    with m:
        assert m(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"] == expected
        st = m.last_speculative_stats
        assert st is not None and st.drafted_by.get("prompt-lookup", 0) == st.drafted > 0
        assert st.rollbacks > 0 or st.accepted == st.drafted


@pytest.mark.parametrize("fixture", ["hybrid_model", "recurrent_model"])
def test_custom_draft_runs_on_recurrent_memory(request, fixture):
    """A custom draft model drafts through the same engine as prompt lookup, which rolls recurrent
    state back: plain greedy output, the object's drafts verified and counted under its type."""
    import warnings

    path = request.getfixturevalue(fixture)
    with make(path) as m:
        prompt = m.tokenize(PROMPT.encode())
        gen = m.generate(prompt, temp=0)
        cont = [next(gen) for _ in range(12)]
        gen.close()
    for wrong in (False, True):
        draft = Oracle(prompt + cont, 4, wrong=wrong)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            m = make(path, draft_model=draft)
        with m:
            gen = m.generate(prompt, temp=0)
            assert [next(gen) for _ in range(12)] == cont
            gen.close()
            st = m.last_speculative_stats
            assert draft.calls > 0 and st is not None and st.drafted_by == {"llama-draft-model": st.drafted}
            assert st.drafted > 0 and (st.accepted == 0 if wrong else st.accepted > 0)


def test_embedding_context_decodes_without_the_draft(spm_model):
    """``embedding=True`` cannot run the speculative engine: the draft is not used (a warning says so)."""
    expected = plain_completion(spm_model, 8)["choices"][0]["text"]
    with make(spm_model) as m:
        prompt = m.tokenize(PROMPT.encode())
    with pytest.warns(UserWarning, match="draft_model is not used with embedding=True"):
        m = make(spm_model, draft_model=Oracle(prompt, 4), embedding=True)
    with m:
        assert m(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"] == expected
        assert m.draft_model.calls == 0 and m.last_speculative_stats is None

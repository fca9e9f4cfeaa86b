"""Upstream 0.3.36's low-level object model and sampling semantics, where published libraries rely on them.

- ``Llama.model`` / ``Llama.ctx`` are raw pointers (ints) usable in every ``llama_*`` call, as
  outlines (``llama_model_get_vocab(llm.model)``) and guidance (``llama_get_memory(llm.ctx)``,
  ``llama_decode(llm.ctx, batch)``) use them; ``llama_cpp.llama_cpp._lib`` is the loaded library
  (llguidance casts ``_lib.llama_tokenize`` to a function pointer).
- ``seed=-1`` is upstream's "random"; calls without a seed advance the object's seed with upstream's formula.
- penalties count the sampled tokens only (upstream), or also the last prompt tokens
  (``sampling_convention="llama.cpp"``).
"""

from __future__ import annotations

import ctypes
import pickle
import random

import numpy as np
import pytest

import llama_cpp
from llama_cpp import LLAMA_DEFAULT_SEED, Llama, LlamaGrammar
from llama_cpp._errors import ParameterError
from llama_cpp._generation import sampling as _sampling

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(spm_model):
    m = Llama(model_path=str(spm_model), n_ctx=256, verbose=False)
    yield m
    m.close()


# -- pointers ------------------------------------------------------------------------------------
def test_model_and_ctx_are_the_raw_pointers(llm):
    assert isinstance(llm.model, int) and isinstance(llm.ctx, int)
    assert llm.model == llm._model.model and llm.ctx == llm._ctx.ctx
    assert llm.model is not None and llm.ctx is not None
    assert ctypes.cast(llm.ctx, ctypes.c_void_p).value == llm._ctx.ctx
    assert ctypes.c_void_p(llm.model).value == llm._model.model
    assert type(pickle.loads(pickle.dumps(llm.model))) is int


def test_the_pointers_work_in_llama_calls(llm):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert vocab == llm._model.vocab
    assert llama_cpp.llama_vocab_n_tokens(vocab) == llm.n_vocab()
    assert llama_cpp.llama_n_ctx(llm.ctx) == llm.n_ctx()
    assert llama_cpp.llama_get_model(llm.ctx) == llm.model
    assert llama_cpp.llama_get_memory(llm.ctx)
    buf = (ctypes.c_char * 32)()  # outlines' vocabulary loop
    n = llama_cpp.llama_token_to_piece(vocab, llm.token_eos(), buf, 32, 0, True)
    assert n > 0


def test_the_pointers_still_answer_the_wrappers_attributes(llm):
    assert llm.model.n_vocab == llm.n_vocab()
    assert llm.ctx.n_ctx() == llm.n_ctx()
    assert llm.model.tokenize(b"hello", add_special=False, parse_special=False) == llm.tokenize(b"hello", False)


def test_guidance_style_decode_through_the_raw_context(llm, spm_model):
    """guidance's engine: its own llama_batch, llama_memory_seq_rm, llama_decode and llama_get_logits."""
    greedy = Llama(model_path=str(spm_model), n_ctx=256, verbose=False)
    try:
        toks = greedy.tokenize(PROMPT.encode())
        expected = greedy.create_completion(PROMPT, max_tokens=1, temperature=0.0)["choices"][0]["text"]
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(greedy.ctx), -1, 0, -1)
        batch = llama_cpp.llama_batch_init(64, 0, 1)
        try:
            batch.n_tokens = len(toks)
            for j, t in enumerate(toks):
                batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = t, j, 1, True
                batch.seq_id[j][0] = 0
            assert llama_cpp.llama_decode(greedy.ctx, batch) == 0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(greedy.ctx), shape=(len(toks), greedy.n_vocab()))
            assert greedy.detokenize([int(np.argmax(logits[-1]))]).decode() == expected
        finally:
            llama_cpp.llama_batch_free(batch)
    finally:
        greedy.close()


def test_the_loaded_library_under_upstreams_names(llm):
    lib = llama_cpp.llama_cpp._lib
    assert isinstance(lib, ctypes.CDLL)
    assert ctypes.cast(lib.llama_tokenize, ctypes.c_void_p).value  # llguidance's tokenize_fptr
    assert isinstance(llama_cpp.mtmd_cpp._libmtmd, ctypes.CDLL)
    with pytest.raises(AttributeError):
        llama_cpp.llama_cpp._no_such_name  # noqa: B018


def test_semi_private_objects(llm):
    assert isinstance(llm._batch.batch, llama_cpp.llama_cpp.llama_batch)
    g = 'root ::= "a"'
    assert LlamaGrammar.from_string(g)._grammar == g


# -- seeds ---------------------------------------------------------------------------------------
def test_seed_minus_one_is_random_per_call(llm):
    assert _sampling.c_seed(-1) == LLAMA_DEFAULT_SEED
    texts = {llm.create_completion(PROMPT, max_tokens=8, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0,
                                   seed=-1)["choices"][0]["text"] for _ in range(6)}
    assert len(texts) > 1
    chat = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=2, seed=-1)
    assert chat["choices"][0]["message"]["role"] == "assistant"


def test_other_out_of_range_seeds_are_still_refused(llm):
    with pytest.raises(ParameterError):
        llm.create_completion(PROMPT, max_tokens=1, seed=-2)


def test_calls_without_a_seed_follow_upstreams_sequence(llm):
    llm.set_seed(42)
    got = [llm.create_completion(PROMPT, max_tokens=6)["choices"][0]["text"] for _ in range(2)]
    s1 = random.Random(42).randint(0, 2 ** 32)
    s2 = random.Random(s1).randint(0, 2 ** 32)
    want = [llm.create_completion(PROMPT, max_tokens=6, seed=s)["choices"][0]["text"] for s in (s1, s2)]
    assert got == want


def test_llama_seed_minus_one_constructs(spm_model):
    m = Llama(model_path=str(spm_model), n_ctx=64, seed=-1, verbose=False)
    try:
        assert m.create_completion("a", max_tokens=2)["choices"][0]["finish_reason"] in ("length", "stop")
    finally:
        m.close()


# -- penalties -----------------------------------------------------------------------------------
@pytest.mark.parametrize("convention", ["upstream", "llama.cpp"])
def test_repeat_penalty_counts_the_tokens_the_convention_names(spm_model, convention):
    m = Llama(model_path=str(spm_model), n_ctx=256, verbose=False, sampling_convention=convention)
    rows: list[np.ndarray] = []
    picked: list[int] = []

    def record(input_ids, scores):
        rows.append(np.array(scores, dtype=np.float32))
        return scores

    def stop(input_ids, logits):
        picked.append(int(input_ids[-1]))
        return False

    try:
        prompt = m.tokenize(PROMPT.encode())
        m.create_completion(prompt, max_tokens=12, temperature=0.0, repeat_penalty=1.5, logits_processor=[record],
                            stopping_criteria=[stop])
    finally:
        m.close()
    assert len(picked) >= 4
    for i, tok in enumerate(picked):
        seen = picked[:i] if convention == "upstream" else (list(prompt) + picked[:i])
        row = rows[i].copy()
        for t in set(seen[-64:]):
            row[t] = row[t] / 1.5 if row[t] > 0 else row[t] * 1.5
        assert int(np.argmax(row)) == tok, (convention, i)


def test_mirostat_scales_by_temperature_only_in_llama_cpps_convention(llm):
    plain = _sampling.sampler_chain(llm._model, mirostat_mode=2, temperature=0.5)
    scaled = _sampling.sampler_chain(llm._model, mirostat_mode=2, temperature=0.5, convention="llama.cpp")
    try:
        assert "temp" not in plain.names and "temp" in scaled.names
    finally:
        plain.close()
        scaled.close()


def test_an_unknown_convention_is_refused(spm_model):
    with pytest.raises(ParameterError, match="sampling_convention"):
        Llama(model_path=str(spm_model), sampling_convention="other", verbose=False)

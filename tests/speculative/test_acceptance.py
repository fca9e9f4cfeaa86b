"""Acceptance lands where each construction puts it.

n-gram types on the echo target: a prompt that is the echo chain's cycle repeated makes every
draft right; a prompt whose every successor differs from the echo successor makes every draft
wrong; the cycle prompt with one corrupted copy accepts a part. draft-simple: the
``echo`` draft agrees with the echo target always, the ``constant`` draft never, the ``noisy``
draft partly.
"""

from __future__ import annotations

import pytest

from .util import NGRAM_TYPES, always_prompt, config, never_prompt, partial_prompt, plain_generate, spec_generate

START_WORDS = (" cat", " time", " world")


def _word(model, w: str) -> int:
    toks = model.tokenize(w.encode(), add_special=False)
    assert len(toks) == 1, (w, toks)
    return toks[0]


@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
@pytest.mark.parametrize("m", (1, 4, 8))
def test_ngram_cycle_prompt_accepts_everything(targets, spec_type, m):
    model = targets["echo"]
    for w in START_WORDS:
        prompt = always_prompt(model, _word(model, w))
        ref = plain_generate(model, prompt, 24)
        got, st = spec_generate(model, prompt, 24, config(spec_type, m))
        assert got == ref
        assert st.drafted > 0 and st.accepted == st.drafted, (spec_type, m, w, str(st))
        assert st.rollbacks == 0
        if m > 1 and spec_type != "ngram-map-k":
            assert st.steps < len(got)  # several tokens per target decode


@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
def test_ngram_contradicting_prompt_accepts_nothing(targets, spec_type):
    model = targets["echo"]
    words = [_word(model, w) for w in (" cat", " dog", " sat", " mat", " the", " on", " and", " time", " world")]
    prompt, n = never_prompt(model, words, 24)
    assert n >= 2
    ref = plain_generate(model, prompt, n)
    got, st = spec_generate(model, prompt, n, config(spec_type, 4, ngram_simple={"size_n": 1, "size_m": 4}))
    assert got == ref
    assert st.drafted > 0 and st.accepted == 0, (spec_type, str(st))


@pytest.mark.parametrize("spec_type", ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"))
@pytest.mark.parametrize("m", (4, 8))
def test_ngram_corrupted_copy_accepts_part(targets, spec_type, m):
    """The last copy of the cycle starts with a wrong token: drafts copied from it fail there.
    (ngram-cache counts continuations, so one wrong copy among several is outvoted.)"""
    model = targets["echo"]
    prompt = partial_prompt(model, _word(model, " time"), _word(model, " sat"))
    ref = plain_generate(model, prompt, 32)
    got, st = spec_generate(model, prompt, 32, config(spec_type, m))
    assert got == ref
    assert 0.0 < st.acceptance_rate < 1.0, (spec_type, m, str(st))
    assert st.rollbacks > 0


@pytest.mark.parametrize("n", (1, 2, 4, 8))
def test_draft_model_echo_accepts_everything(targets, draft_path, n):
    model = targets["echo"]
    cfg = config("draft-simple", draft_model_path=str(draft_path("echo")), draft_n_max=n)
    prompt = model.tokenize(b"Once upon a time there was", add_special=True)
    got, st = spec_generate(model, prompt, 32, cfg)
    assert got == plain_generate(model, prompt, 32)
    assert st.drafted > 0 and st.acceptance_rate == 1.0 and st.rollbacks == 0
    assert st.steps == -(-32 // (n + 1))  # every step emits n + 1 tokens (the last step fewer)


@pytest.mark.parametrize("target", ("bpe", "echo"))
@pytest.mark.parametrize("n", (1, 4))
def test_draft_model_constant_accepts_nothing(targets, draft_path, target, n):
    model = targets[target]
    cfg = config("draft-simple", draft_model_path=str(draft_path("constant")), draft_n_max=n)
    prompt = model.tokenize(b"Hello world, this is a test", add_special=True)
    got, st = spec_generate(model, prompt, 24, cfg)
    assert got == plain_generate(model, prompt, 24)
    assert st.drafted > 0 and st.accepted == 0
    if target == "bpe":
        assert st.steps == 24 and st.rollbacks_partial == st.draft_steps
    else:  # hybrid: each rejection restores a checkpoint; the replay also yields the next token
        assert st.rollbacks_checkpoint == st.draft_steps and st.steps < 24


def test_draft_model_noisy_accepts_part(targets, draft_path):
    model = targets["echo"]
    cfg = config("draft-simple", draft_model_path=str(draft_path("noisy")), draft_n_max=2)
    prompt = model.tokenize(b"Once upon a time there was", add_special=True)
    got, st = spec_generate(model, prompt, 48, cfg)
    assert got == plain_generate(model, prompt, 48)
    assert 0.0 < st.acceptance_rate < 1.0, str(st)


def test_draft_p_min_and_n_min(targets, draft_path):
    model = targets["echo"]
    prompt = model.tokenize(b"Once upon a time there was", add_special=True)
    ref = plain_generate(model, prompt, 24)
    # the echo draft's logits are flat (head std 0.1): its top token holds far less than 0.9 of the top 10
    got, st = spec_generate(model, prompt, 24, config("draft-simple", draft_model_path=str(draft_path("echo")),
                                                       draft_n_max=4, draft_p_min=0.9))
    assert got == ref and st.drafted == 0
    # the constant draft puts all its mass on one token: p_min does not stop it
    got, st = spec_generate(model, prompt, 24, config("draft-simple", draft_model_path=str(draft_path("constant")),
                                                       draft_n_max=4, draft_p_min=0.9))
    assert got == ref and st.drafted > 0
    got, st = spec_generate(model, prompt, 24, config("draft-simple", draft_model_path=str(draft_path("echo")),
                                                       draft_n_max=4, draft_n_min=3))
    assert got == ref and all(d == st.drafted_at[0] for d in st.drafted_at[:3])


def test_ngram_cache_partly_right_continuation_accepts_part(targets):
    """ngram-cache drafts from the longest n-gram seen once (3- and 4-grams need one sample): the
    prompt holds the echo chain ``c0 c1 c2`` once after ``a b``, then a wrong token ``x``, and ends
    with ``a b c0``; the draft ``c1 c2 x`` is right for two tokens and wrong at the third."""
    model = targets["echo"]
    c0 = _word(model, " time")
    chain = plain_generate(model, [c0], 6)  # c1, c2, c3, ...: what follows c0 wherever it stands
    words = [_word(model, w) for w in (" cat", " dog", " sat", " mat", " the", " on", " and", " world")]
    a, b, x, *filler = [w for w in words if w not in chain and w != c0]
    prompt = [a, b, c0, chain[0], chain[1], x] + filler + [a, b, c0]
    ref = plain_generate(model, prompt, 16)
    got, st = spec_generate(model, prompt, 16, config("ngram-cache", 8))
    assert got == ref
    assert st.drafted_at and st.accepted_at[:2] == [1, 1] and st.accepted_at[2:3] == [0], str(st)
    assert 0.0 < st.acceptance_rate < 1.0 and st.rollbacks > 0, str(st)

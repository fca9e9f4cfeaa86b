"""KV consistency after rejections and rollbacks; state save/load mid-generation; EOG handling."""

from __future__ import annotations

import pytest

from .util import N_GEN, PROMPTS, greedy_sampler, make_decoder, plain_generate

ROLLBACK_MODES = {"partial": {}, "checkpoint": {"n_rs_seq": 0}}


@pytest.mark.parametrize("form", ("noisy", "random"))
@pytest.mark.parametrize("mode", sorted(ROLLBACK_MODES))
def test_continuing_after_rollback_equals_fresh_run(mtp_models, form, mode):
    m = mtp_models[form]
    cfg = dict(draft_n_max=4, **ROLLBACK_MODES[mode])
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    follow = m.tokenize(b" And then the next part", add_special=False)
    with make_decoder(m, **cfg) as dec:
        dec.prefill(prompt)
        first = list(dec.generate(greedy_sampler(), 20))
        assert dec.stats.rollbacks > 0
        assert dec.history == prompt + first
        full = prompt + first + follow
        dec.stats.reset()
        dec.prefill(full)
        assert dec.stats.prefill_tokens == len(follow)  # the history was kept, only new text evaluated
        second = list(dec.generate(greedy_sampler(), N_GEN))
    with make_decoder(m, **cfg) as fresh:
        fresh.prefill(full)
        assert list(fresh.generate(greedy_sampler(), N_GEN)) == second
    assert plain_generate(m, full, N_GEN) == second


@pytest.mark.parametrize("form", ("echo", "noisy"))
def test_prefill_with_diverging_history(mtp_models, form):
    """A new prompt sharing only a prefix: the rest is dropped (or everything reset) and redone."""
    m = mtp_models[form]
    a = m.tokenize(PROMPTS[0].encode(), add_special=True)
    b = m.tokenize(PROMPTS[0].encode()[:12] + b" something else entirely", add_special=True)
    with make_decoder(m, draft_n_max=3) as dec:
        dec.prefill(a)
        list(dec.generate(greedy_sampler(), 10))
        dec.prefill(b)
        got = list(dec.generate(greedy_sampler(), N_GEN))
        dec.prefill(a)  # a strict prefix of nothing evaluated since: redo from the divergence
        again = list(dec.generate(greedy_sampler(), N_GEN))
    assert got == plain_generate(m, b, N_GEN)
    assert again == plain_generate(m, a, N_GEN)


@pytest.mark.parametrize("form", ("noisy", "random", "echo"))
@pytest.mark.parametrize("mode", sorted(ROLLBACK_MODES))
def test_state_save_load_mid_generation(mtp_models, form, mode):
    m = mtp_models[form]
    cfg = dict(draft_n_max=4, **ROLLBACK_MODES[mode])
    prompt = m.tokenize(PROMPTS[2].encode(), add_special=True)
    with make_decoder(m, **cfg) as dec:
        dec.prefill(prompt)
        head = list(dec.generate(greedy_sampler(), 13))
        state = dec.save_state()
        tail = list(dec.generate(greedy_sampler(), 19))
        # the same decoder, after wandering off
        dec.prefill(m.tokenize(b"unrelated text here", add_special=True))
        list(dec.generate(greedy_sampler(), 5))
        dec.load_state(state)
        assert dec.history == prompt + head
        assert list(dec.generate(greedy_sampler(), 19)) == tail
    with make_decoder(m, **cfg) as other:  # a fresh decoder of the same model
        other.load_state(state)
        assert list(other.generate(greedy_sampler(), 19)) == tail
    assert plain_generate(m, prompt, 32) == head + tail


def test_stopping_early_keeps_history_consistent(mtp_models):
    """A consumer that stops mid-step: the decoder still knows what its memory holds."""
    m = mtp_models["echo"]
    prompt = m.tokenize(PROMPTS[1].encode(), add_special=True)
    ref = plain_generate(m, prompt, 40)
    with make_decoder(m, draft_n_max=8) as dec:
        dec.prefill(prompt)
        got = []
        for t in dec.generate(greedy_sampler(), 40):
            got.append(t)
            if len(got) == 3:
                break
        hist = dec.history
        assert hist[:len(prompt) + 3] == prompt + got and hist == prompt + ref[:len(hist) - len(prompt)]
        dec.prefill(prompt + got)  # what the consumer saw
        rest = list(dec.generate(greedy_sampler(), 37))
    assert got + rest == ref


def test_eog_from_a_callable_sampler_ends_generation(mtp_models):
    m = mtp_models["echo"]
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    eog = m.token_eos()
    assert m.is_eog(eog)
    chain = greedy_sampler()
    calls = []

    def sample(ctx, i):
        calls.append(i)
        tok = chain.sample(ctx, i)
        return eog if len(calls) == 6 else tok

    ref = plain_generate(m, prompt, 5)
    with make_decoder(m, draft_n_max=4) as dec:
        dec.prefill(prompt)
        got = list(dec.generate(sample, 30))
        assert got == ref + [eog]
        assert dec.history == prompt + got
        assert dec.stats.generated == 6


def test_context_full_stops_generation(mtp_models):
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    from .util import CTX

    m = mtp_models["echo"]
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    with MTPDecoder(m, dict(CTX), SpecConfig(draft_n_max=4)) as dec:
        n_ctx = dec.target.n_ctx()
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), n_ctx + 50))
    assert len(prompt) + len(got) == n_ctx + 1  # the last token is sampled but never decoded
    assert got == plain_generate(m, prompt, len(got))


def test_checkpoint_replay_keeps_every_budget(mtp_models):
    """n_rs_seq=0: every rejection restores a checkpoint; the replay also yields the next token,
    never past max_tokens, and the output stays plain greedy's."""
    from .util import PROMPTS, plain_generate, spec_generate

    m = mtp_models["noisy"]
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    ref = plain_generate(m, prompt, 16)
    for n in range(1, 17):
        got, st = spec_generate(m, prompt, n, draft_n_max=4, n_rs_seq=0)
        assert got == ref[:n], n
    assert st.rollbacks_checkpoint > 0 and st.steps < len(got)

"""The MTP draft context's catch-up rides in the next draft's first batch.

After a verify the draft memory must take the accepted pairs ``(x_p, h_{p-1})``; the decoder keeps
them pending and decodes them in front of the next draft's seed (under each head, when chained),
instead of in a batch of their own. These tests compare with a decoder that decodes them on their
own at the start of every draft (what the decoder did before, and what llama.cpp's driver does):
the same tokens and the same drafts, token for token and position for position, with one draft
decode fewer per step (one per head reached, chained).
"""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path

from .util import CTX, greedy_sampler, plain_generate

PROMPTS = ("Hello world, this is a test", "Once upon a time there was")
N_GEN = 40
#: name -> (fixture, params, draft sizes): one NextN head (qwen35) and three chained ones (step35)
MODELS = {
    "qwen35-echo": ("qwen35_mtp", {"form": "echo"}, (1, 2, 4)),
    "qwen35-noisy": ("qwen35_mtp", {"form": "noisy"}, (1, 2, 4)),
    "qwen35-random": ("qwen35_mtp", {"form": "random"}, (1, 2, 4)),  # a head that reads h
    "step35-echo": ("step35_mtp_heads", {"form": "echo"}, (1, 2, 3)),
    "step35-noisy": ("step35_mtp_heads", {"form": "noisy"}, (1, 2, 3)),
}


@pytest.fixture(scope="module")
def models():
    from llama_cpp.speculative import load_mtp_model

    made: dict = {}

    def get(name: str):
        if name not in made:
            fx, kw, _ = MODELS[name]
            made[name] = load_mtp_model(fixture_path(fx, **kw))
        return made[name]

    yield get
    for m in made.values():
        m.close()


def _nextn(dec):
    """The decoder's NextN drafter."""
    return next(d for d in dec.drafters if d.kind == "draft-mtp")


@pytest.fixture(autouse=True)
def draft_decodes(monkeypatch):
    """Counts the batches decoded on each draft context (by context pointer)."""
    from llama_cpp.speculative import batch as _batch

    counts: dict = {}
    real = _batch.RawExtBatch.decode

    def counted(self, tokens, *a, **kw):
        counts[self._ctx] = counts.get(self._ctx, 0) + 1
        return real(self, tokens, *a, **kw)

    monkeypatch.setattr(_batch.RawExtBatch, "decode", counted)
    return counts


def _run(model, prompt, draft_n_max: int, *, separate: bool, n: int = N_GEN, counts=None):
    """(tokens, stats, draft decodes) of one generation; ``separate``: the catch-up decoded on its own
    (the drafter's ``catch_up`` before every draft)."""
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    with MTPDecoder(model, dict(CTX), SpecConfig("draft-mtp", draft_n_max=draft_n_max)) as dec:
        nextn = _nextn(dec)
        real = nextn.draft
        drafts: list[list[int]] = []

        def recorded(prompt, id_last, k_max=None):
            if separate:
                nextn.catch_up(prompt)
            d = real(prompt, id_last, k_max)
            drafts.append(list(d))
            return d

        nextn.draft = recorded
        dec.prefill(prompt)  # the prompt's pairs are in the draft memory after it
        ptr = nextn.ctx.ptr
        before = (counts or {}).get(ptr, 0)
        toks = list(dec.generate(greedy_sampler(), n))
        dec.stats.drafts = drafts  # the MTP drafts, in order (for the comparisons below)
        return toks, dec.stats, (counts or {}).get(ptr, 0) - before


@pytest.mark.parametrize("name", list(MODELS))
def test_same_drafts_as_a_separate_catch_up(models, name, draft_decodes):
    m = models(name)
    for p in PROMPTS:
        prompt = m.tokenize(p.encode(), add_special=True)
        ref = plain_generate(m, prompt, N_GEN)
        for dn in MODELS[name][2]:
            got, st, n_merged = _run(m, prompt, dn, separate=False, counts=draft_decodes)
            want, st0, n_separate = _run(m, prompt, dn, separate=True, counts=draft_decodes)
            assert got == want == ref, (name, p, dn)
            assert (st.drafted_at, st.accepted_at) == (st0.drafted_at, st0.accepted_at), (name, p, dn)
            assert st.drafts == st0.drafts, (name, p, dn)  # the rejected tokens too
            assert st.steps == st0.steps
            # pairs wait after every step that accepted a draft token (chained heads: after every step)
            if m.n_layer_nextn() > 1:
                heads = min(dn, m.n_layer_nextn())
                assert n_separate - n_merged >= heads * (st.steps - 2), (name, p, dn, n_separate, n_merged)
            else:
                assert n_merged < n_separate if st.accepted else n_merged == n_separate, (name, p, dn)


def test_full_acceptance_decodes_one_batch_per_drafted_token(models, draft_decodes):
    """One head at 100 % acceptance: ``k`` draft decodes a step (the catch-up inside the first)."""
    m = models("qwen35-echo")
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    got, st, n = _run(m, prompt, 4, separate=False, counts=draft_decodes)
    assert st.accepted == st.drafted > 0
    assert n == st.drafted


def test_pending_pairs_survive_state_and_prefill(models):
    """Pairs still pending when generation stops are decoded before a snapshot or a new prompt:
    continuing, restoring and extending all draft as a fresh decoder does."""
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    for name in ("qwen35-noisy", "step35-noisy"):
        m = models(name)
        prompt = m.tokenize(PROMPTS[1].encode(), add_special=True)
        ref = plain_generate(m, prompt, N_GEN)
        with MTPDecoder(m, dict(CTX), SpecConfig("draft-mtp", draft_n_max=3)) as dec:
            dec.prefill(prompt)
            head = list(dec.generate(greedy_sampler(), 7))  # the last step's pairs wait for the next draft
            state = dec.save_state()
            tail = list(dec.generate(greedy_sampler(), N_GEN - len(head)))
            dec.load_state(state)
            again = list(dec.generate(greedy_sampler(), N_GEN - len(head)))
            assert head + tail == head + again == ref, name
            # a longer prompt that extends the history: the pending pairs go first
            longer = prompt + head + tail[:5]
            dec.prefill(longer)
            dec.stats.reset()
            ext = list(dec.generate(greedy_sampler(), 12))
            fresh, st, _ = _run(m, longer, 3, separate=False, n=12)
            assert ext == fresh == plain_generate(m, longer, 12), name
            assert (dec.stats.drafted_at, dec.stats.accepted_at) == (st.drafted_at, st.accepted_at), name


def test_pairs_wait_through_steps_another_type_drafts(models):
    """Combined with an n-gram type: steps the n-gram drafter wins add their pairs to the pending
    ones; the next MTP draft decodes them all (output equal to plain greedy)."""
    from llama_cpp.speculative import SpecConfig, make_decoder

    m = models("step35-noisy")
    text = "the cat sat on the mat and the cat sat on the mat and the cat sat on the"
    prompt = m.tokenize(text.encode(), add_special=True)
    ref = plain_generate(m, prompt, N_GEN)
    cfg = SpecConfig(["ngram-simple", "draft-mtp"], draft_n_max=3, ngram_simple={"size_n": 2, "size_m": 3})
    with make_decoder(m, cfg, ctx_params=dict(CTX)) as dec:
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), N_GEN))
        st = dec.stats
    assert got == ref
    assert st.drafted_by.get("draft-mtp", 0) > 0


@pytest.mark.parametrize("name", ("qwen35-noisy", "step35-noisy"))
def test_greedy_rows_verify_drafts_as_per_row_sampling(models, monkeypatch, name):
    """The verify rows picked by one argmax (GreedyRows, used from 16k tokens on; forced here on the
    tiny vocabulary): the same tokens and drafts as sampling row by row."""
    from llama_cpp.speculative import batch as _spec_batch
    from llama_cpp.speculative import decoder

    m = models(name)
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    base, st0, _ = _run(m, prompt, 3, separate=False)
    picked = []
    real = _spec_batch.GreedyRows.pick

    def pick(self, n):
        r = real(self, n)
        picked.append(r is not None)
        return r

    monkeypatch.setattr(decoder, "GREEDY_ROWS_MIN_VOCAB", 0)  # the verify loop reads it there
    monkeypatch.setattr(_spec_batch.GreedyRows, "pick", pick)
    got, st, _ = _run(m, prompt, 3, separate=False)
    assert picked and all(picked)
    assert got == base == plain_generate(m, prompt, N_GEN)
    assert (st.drafted_at, st.accepted_at) == (st0.drafted_at, st0.accepted_at)


@pytest.mark.parametrize("name", ("qwen35-echo", "qwen35-noisy", "step35-echo", "step35-noisy"))
def test_pairs_that_do_not_fit_one_micro_batch_go_alone(models, monkeypatch, name):
    """The least ``n_ubatch`` the hybrid targets take (``n_rs_seq + 2``): chained heads' pairs and
    draft do not fit one micro-batch together, so the pairs are decoded on their own first; the
    drafts are those of a roomy context."""
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    m = models(name)
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    dn = 3
    from llama_cpp.speculative.nextn import NextNDrafter

    want, st0, _ = _run(m, prompt, dn, separate=False)
    small = dict(CTX, n_batch=dn + 2, n_ubatch=dn + 2)
    flushed = []
    real = NextNDrafter.catch_up

    def flush(self, history):
        flushed.append(len(history))
        real(self, history)

    monkeypatch.setattr(NextNDrafter, "catch_up", flush)
    with MTPDecoder(m, small, SpecConfig("draft-mtp", draft_n_max=dn)) as dec:
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), N_GEN))
        st = dec.stats
    if m.n_layer_nextn() > 1:
        assert any(flushed)
    assert got == want == plain_generate(m, prompt, N_GEN)
    assert (st.drafted_at, st.accepted_at) == (st0.drafted_at, st0.accepted_at)


def test_a_micro_batch_without_room_for_the_snapshots_is_refused(models):
    """llama.cpp's hybrid memory aborts the process when ``n_ubatch <= n_rs_seq + 1``: a clear error
    before any decode instead (n_rs_seq is draft_n_max for MTP)."""
    from llama_cpp import SpeculativeError
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    m = models("qwen35-echo")
    assert m.is_hybrid()
    with pytest.raises(SpeculativeError, match=r"n_ubatch=4 must exceed n_rs_seq \+ 1 = 4"):
        MTPDecoder(m, dict(CTX, n_batch=4, n_ubatch=4), SpecConfig("draft-mtp", draft_n_max=3))
    with MTPDecoder(m, dict(CTX, n_batch=4, n_ubatch=4), SpecConfig("draft-mtp", draft_n_max=3, n_rs_seq=2)) as dec:
        prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
        dec.prefill(prompt)
        assert list(dec.generate(greedy_sampler(), 12)) == plain_generate(m, prompt, 12)


def test_a_hybrid_draft_model_without_room_for_its_snapshots_is_refused(models):
    """draft-simple: the draft context keeps ``draft_n_max`` snapshots; a hybrid draft model (here
    the echo target drafting for itself) in micro-batches of ``draft_n_max + 1`` is refused, not aborted."""
    from llama_cpp import SpeculativeError
    from llama_cpp._internals import LlamaModel
    from llama_cpp.speculative import SpecConfig, make_decoder

    path = fixture_path("qwen35_mtp", form="echo")
    with LlamaModel(path) as m:
        cfg = SpecConfig("draft-simple", draft_n_max=3, draft_model_path=str(path))
        with pytest.raises(SpeculativeError, match=r"the draft context of .*n_ubatch=4 must exceed"):
            make_decoder(m, cfg, ctx_params=dict(CTX, n_batch=4, n_ubatch=4))
        prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
        with make_decoder(m, cfg, ctx_params=dict(CTX, n_batch=5, n_ubatch=5)) as dec:
            dec.prefill(prompt)
            got = list(dec.generate(greedy_sampler(), 12))
            assert dec.stats.accepted == dec.stats.drafted > 0
        assert got == plain_generate(m, prompt, 12)


@pytest.mark.parametrize("dn", (1, 2))
def test_heads_no_draft_reaches_are_not_caught_up(models, dn, draft_decodes):
    """Chained heads with ``draft_n_max`` below their number: only the heads a draft can reach take
    the pairs (one draft decode per head a step at full acceptance), with llama.cpp's drafts."""
    m = models("step35-echo")
    prompt = m.tokenize(PROMPTS[0].encode(), add_special=True)
    got, st, n = _run(m, prompt, dn, separate=False, counts=draft_decodes)
    assert got == plain_generate(m, prompt, N_GEN)
    assert st.accepted == st.drafted > 0
    assert n == st.drafted


def test_a_state_with_fewer_heads_filled_is_refused(models):
    """A snapshot of a decoder whose drafts reach one head cannot serve one that drafts with two
    (the second head's layer never saw the history): a clear error, nothing changed; the other
    way round works."""
    from llama_cpp import SpeculativeError
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    m = models("step35-noisy")
    prompt = m.tokenize(PROMPTS[1].encode(), add_special=True)
    ref = plain_generate(m, prompt, N_GEN)
    with MTPDecoder(m, dict(CTX), SpecConfig("draft-mtp", draft_n_max=1)) as one, \
            MTPDecoder(m, dict(CTX), SpecConfig("draft-mtp", draft_n_max=2)) as two:
        one.prefill(prompt)
        head = list(one.generate(greedy_sampler(), 6))
        small = one.save_state()
        assert small.heads == 1
        two.prefill(prompt)
        list(two.generate(greedy_sampler(), 6))
        big = two.save_state()
        with pytest.raises(SpeculativeError, match="holds 1 of the 3 NextN heads"):
            two.load_state(small)
        assert two.kv_tokens == list(big.kv_tokens)  # untouched
        one.load_state(big)
        assert head + list(one.generate(greedy_sampler(), N_GEN - 6)) == ref


@pytest.mark.parametrize("fixture,form", (("qwen35_mtp", "random"), ("step35_mtp_heads", "noisy")))
def test_a_batch_led_by_pairs_gives_its_last_entrys_hidden_row(fixture, form):
    """The row a draft reads after a batch ``[pairs.., seed]`` is the seed's, as when the seed is
    decoded alone: qwen35's MTP graph computes h for every entry (llama.cpp's masked mode would
    return the first entry's), step35's for the outputs only."""
    import numpy as np

    from llama_cpp._core.ownership import float_view
    from llama_cpp.llama_batch import LlamaBatchExt
    from llama_cpp.speculative import MTPDecoder, RawExtBatch, SpecConfig, load_mtp_model

    with load_mtp_model(fixture_path(fixture, form=form)) as m, \
            MTPDecoder(m, dict(CTX), SpecConfig("draft-mtp", draft_n_max=2)) as dec:
        ctx = dec.draft
        raw = RawExtBatch(LlamaBatchExt(ctx), ctx, dec.n_embd)

        def row(i):
            return float_view(m.bindings.llama_get_embeddings_nextn_ith(ctx.ptr, i), dec.n_embd).copy()

        rows = np.random.default_rng(0).standard_normal((3, dec.n_embd)).astype(np.float32)
        toks = [int(t) for t in m.tokenize(b"Hello world", add_special=False)[:1]] + [9, 13]
        raw.decode(toks, 0, "last", rows)
        batch_h, batch_logits = row(2), ctx.logits_ith(2).copy()
        ctx.memory_clear(True)
        raw.decode(toks[:2], 0, False, rows[:2])
        raw.decode(toks[2:], 2, "last", rows[2:])
        alone_h, alone_logits = row(0), ctx.logits_ith(0).copy()
        assert np.allclose(batch_logits, alone_logits, atol=1e-4)
        assert np.allclose(batch_h, alone_h, atol=1e-4), float(np.abs(batch_h - alone_h).max())


@pytest.mark.parametrize("name", ("qwen35-random", "qwen35-noisy", "step35-noisy"))
def test_cut_histories_and_states_draft_as_a_fresh_decoder(models, name):
    """A history longer than a micro-batch, then prompts that cut it back (within the kept hidden rows and
    to a shorter prefix) and a state restored over another history: the same tokens and the same
    acceptance as a fresh decoder given each prompt (the draft memory keeps only what still holds)."""
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    m = models(name)
    base = m.tokenize(b"Once upon a time there was a little cat who lived in a house by the sea. " * 12,
                      add_special=True)
    other = base[:150] + m.tokenize(b" and then a dog came along and said hello to everyone there", add_special=False)
    ctx = dict(CTX, n_ctx=1024, n_batch=64, n_ubatch=64)
    cfg = SpecConfig("draft-mtp", draft_n_max=3)
    with MTPDecoder(m, ctx, cfg) as dec, MTPDecoder(m, ctx, cfg) as fresh:
        for p in (base, other, base[:100], base):
            dec.prefill(p)
            dec.stats.reset()
            got = list(dec.generate(greedy_sampler(), 24))
            fresh.reset()
            fresh.prefill(p)
            fresh.stats.reset()
            assert got == list(fresh.generate(greedy_sampler(), 24)) == plain_generate(m, p, 24), len(p)
            assert (dec.stats.drafted_at, dec.stats.accepted_at) == (fresh.stats.drafted_at,
                                                                    fresh.stats.accepted_at), len(p)
        state = dec.save_state()
        a = list(dec.generate(greedy_sampler(), 10))
        dec.prefill(other)
        list(dec.generate(greedy_sampler(), 5))
        dec.load_state(state)
        assert list(dec.generate(greedy_sampler(), 10)) == a

"""Warm-up of the contexts the speculative decoders and drafters create (as llama.cpp's common init).

A context's first decode with outputs costs several plain steps; llama.cpp's tools pay it before
timing (``common_init_from_params`` decodes ``[bos, eos]`` and clears the memory). Our decoders
do the same for the contexts they create: the target when they own it, the MTP draft context,
and the draft contexts of draft-simple, EAGLE3 and DFlash. A caller's context is left alone.
"""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path

from .util import CTX, N_GEN, greedy_sampler, plain_generate

PROMPT = "Once upon a time there was"

#: type -> (the draft fixture (name, params) or None, whether the target loads its NextN block)
TYPES = {
    "draft-mtp": (None, True),
    "draft-simple": (("draft_model", {"form": "echo"}), False),
    "draft-eagle3": (("eagle3_draft", {"form": "echo"}), False),
    "draft-dflash": (("dflash_draft", {"form": "first"}), False),
    "ngram-simple": (None, False),
}


@pytest.fixture(scope="module")
def echo_models():
    """The echo target loaded plain and with its NextN block."""
    from llama_cpp._internals import LlamaModel
    from llama_cpp.speculative import load_mtp_model

    path = fixture_path("qwen35_mtp", form="echo")
    models = {False: LlamaModel(path), True: load_mtp_model(path)}
    yield models
    for m in models.values():
        m.close()


def _config(spec_type: str):
    from llama_cpp.speculative import SpecConfig

    dspec, _ = TYPES[spec_type]
    kw = {"draft_model_path": str(fixture_path(dspec[0], **dspec[1]))} if dspec else {}
    if spec_type in ("draft-eagle3", "draft-dflash"):
        kw["n_rs_seq"] = 4
    return SpecConfig(spec_type, draft_n_max=4, **kw)


@pytest.fixture
def warmed(monkeypatch):
    """The ``ctx.ptr`` of every context :func:`warm_up` is called on (the real warm-up still runs)."""
    from llama_cpp.speculative import dflash, draft, eagle3, nextn
    from llama_cpp.speculative import engine as _spec_engine

    seen: list[int] = []
    real = _spec_engine.warm_up

    def record(model, ctx, decode):
        seen.append(ctx.ptr)
        real(model, ctx, decode)

    for module in (_spec_engine, nextn, draft, eagle3, dflash):  # each module that calls it
        monkeypatch.setattr(module, "warm_up", record)
    return seen


def _draft_ctxs(dec) -> list[int]:
    return [d.ctx.ptr for d in dec.drafters if getattr(d, "ctx", None) is not None]  # the NextN drafter's too


def test_warm_up_leaves_an_empty_context(echo_models):
    """One decode of [bos, eos] (ids of the vocabulary) with an output, then nothing left: an empty
    memory, zeroed perf counters, and the same greedy output as a context never warmed."""
    from llama_cpp._internals import LlamaContext
    from llama_cpp.speculative.batch import RawBatch
    from llama_cpp.speculative.engine import warm_up

    model = echo_models[False]
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    with LlamaContext(model, **CTX) as ctx:
        raw = RawBatch(ctx)
        calls: list[list[int]] = []

        def decode(toks):
            calls.append(list(toks))
            raw.decode(toks, 0, "last")

        warm_up(model, ctx, decode)
        assert len(calls) == 1 and 1 <= len(calls[0]) <= 2
        assert all(0 <= t < model.n_vocab for t in calls[0])
        assert ctx.seq_pos_max(0) == -1
        perf = ctx.perf()
        assert perf["t_eval_ms"] == 0 and perf["t_p_eval_ms"] == 0  # (llama.cpp reports counts of at least 1)
        raw.decode(prompt, 0, "last")
        got = []
        pos = len(prompt)
        s = greedy_sampler()
        for _ in range(8):
            t = s.sample(ctx, -1)
            got.append(t)
            raw.decode([t], pos, "last")
            pos += 1
        raw.close()
    assert got == plain_generate(model, prompt, 8)


@pytest.mark.parametrize("spec_type", list(TYPES))
def test_a_decoder_warms_the_contexts_it_creates(echo_models, warmed, spec_type):
    """An owned target and every draft context are warmed, once each; the first generation still
    equals plain greedy decoding."""
    from llama_cpp.speculative import make_decoder

    model = echo_models[TYPES[spec_type][1]]
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    with make_decoder(model, _config(spec_type), ctx_params=dict(CTX)) as dec:
        want = [dec.target.ptr, *_draft_ctxs(dec)]
        assert sorted(warmed) == sorted(want), spec_type
        assert dec.target.seq_pos_max(0) == -1
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), N_GEN))
    assert got == plain_generate(model, prompt, N_GEN)


@pytest.mark.parametrize("spec_type", list(TYPES))
def test_a_callers_target_is_left_alone(echo_models, warmed, spec_type):
    """A target passed in is neither warmed nor cleared: what it held is still there; the decoder's
    own draft contexts are warmed."""
    from llama_cpp._internals import LlamaContext
    from llama_cpp.speculative import make_decoder, target_context_params
    from llama_cpp.speculative.batch import RawBatch

    model = echo_models[TYPES[spec_type][1]]
    cfg = _config(spec_type)
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    with LlamaContext(model, **target_context_params(cfg, dict(CTX))) as tgt:
        raw = RawBatch(tgt)
        raw.decode(prompt, 0, "last")
        raw.close()
        with make_decoder(model, cfg, target=tgt) as dec:
            assert tgt.ptr not in warmed
            assert sorted(warmed) == sorted(_draft_ctxs(dec))
            assert tgt.seq_pos_max(0) == len(prompt) - 1
            dec.invalidate()  # the decoder did not make what the target holds
            dec.prefill(prompt)
            got = list(dec.generate(greedy_sampler(), N_GEN))
    assert got == plain_generate(model, prompt, N_GEN)

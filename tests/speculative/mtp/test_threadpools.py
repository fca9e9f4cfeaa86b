"""Draft contexts compute on the target's CPU threadpool (two polling pools stall each other's
barriers on a machine with as many cores as threads); the shared pool lives as long as its users."""

from __future__ import annotations

from llama_cpp._internals import LlamaContext
from llama_cpp.speculative import MTPDecoder, SpecConfig
from llama_cpp.speculative.engine import share_threadpools

from .util import greedy_sampler, plain_generate

TWO = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_threads": 2, "n_threads_batch": 2}


def _pools(ctx) -> list:
    return [p for p in ctx._ref.parents if p.name == "threadpool"]


def test_a_context_takes_the_targets_pool_and_keeps_it_alive(mtp_models):
    model = mtp_models["echo"]
    target, other = LlamaContext(model, **TWO), LlamaContext(model, **TWO)
    assert share_threadpools(target, other)
    assert _pools(target)[0] in _pools(other)
    target.close()  # the pool stays: ``other`` still runs on it
    assert all(p.ptr is not None for p in _pools(other))
    prompt = model.tokenize(b"the cat sat on the mat", add_special=True)
    other.close()
    assert plain_generate(model, prompt, 4, ctx_params=TWO)  # a fresh pair still works


def test_different_thread_counts_are_left_alone(mtp_models):
    model = mtp_models["echo"]
    with LlamaContext(model, **TWO) as target, LlamaContext(model, **{**TWO, "n_threads": 1}) as other:
        assert not share_threadpools(target, other)


def test_mtp_at_two_threads_equals_plain_greedy(mtp_models):
    model = mtp_models["echo"]
    prompt = model.tokenize(b"Once upon a time there was a little", add_special=True)
    with MTPDecoder(model, dict(TWO), SpecConfig(draft_n_max=3)) as dec:
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), 24))
        assert dec.stats.accepted > 0
    assert got == plain_generate(model, prompt, 24, ctx_params=TWO)

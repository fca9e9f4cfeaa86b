"""Helpers shared by the MTP tests (reference decoding, decoder construction)."""

from __future__ import annotations

import numpy as np

FORMS = ("echo", "noisy", "random")
PROMPTS = (
    "Hello world, this is a test",
    "The quick brown fox",
    "Once upon a time there was",
)
N_GEN = 32
CTX = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "n_threads_batch": 1}


def greedy_sampler():
    from llama_cpp._internals import LlamaSampler

    s = LlamaSampler()
    s.add_greedy()
    return s


def dist_sampler(seed: int, temp: float = 0.9):
    from llama_cpp._internals import LlamaSampler

    s = LlamaSampler()
    s.add_top_k(40)
    s.add_temp(temp)
    s.add_dist(seed)
    return s


def plain_generate(model, prompt: list[int], n: int, sampler=None, ctx_params: dict | None = None) -> list[int]:
    """Token-at-a-time decoding without speculation (the reference); the prompt in n_batch chunks."""
    from llama_cpp._internals import LlamaBatch, LlamaContext

    params = ctx_params or CTX
    sampler = sampler or greedy_sampler()
    nb = params["n_batch"]
    with LlamaContext(model, **params) as ctx, LlamaBatch(nb, 0, 1) as b:
        for s in range(0, len(prompt), nb):
            b.clear()
            b.add_sequence(np.asarray(prompt[s:s + nb], dtype=np.int32), 0, s, logits="last")
            ctx.decode(b)
        out: list[int] = []
        pos = len(prompt)
        for _ in range(n):
            t = sampler.sample(ctx, -1)
            out.append(t)
            if model.is_eog(t) or len(out) == n:
                break
            b.clear()
            b.add(t, pos, 0, True)
            pos += 1
            ctx.decode(b)
    return out


def make_decoder(model, **cfg):
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    return MTPDecoder(model, dict(CTX), SpecConfig(**cfg))


def spec_generate(model, prompt: list[int], n: int, sampler=None, **cfg):
    """(tokens, stats) of one MTP generation on a fresh decoder."""
    with make_decoder(model, **cfg) as dec:
        dec.prefill(prompt)
        toks = list(dec.generate(sampler or greedy_sampler(), n))
        return toks, dec.stats


GRAMMAR = 'root ::= (" the" | " cat" | " sat" | " on" | " mat")+'


def check_grammar_completions(plain, spec, prompt: str, after=None) -> None:
    """Greedy and seeded completions of ``prompt`` under :data:`GRAMMAR` on two ``Llama`` objects:
    ``spec``'s text is ``plain``'s and keeps to the grammar (the last word may be cut short by
    ``max_tokens``); ``after(temperature, seed, text)`` runs after each pair."""
    for temp, seed in ((0, None), (0.9, 3)):
        ref = plain.create_completion(prompt, max_tokens=20, temperature=temp, seed=seed, grammar=GRAMMAR)
        got = spec.create_completion(prompt, max_tokens=20, temperature=temp, seed=seed, grammar=GRAMMAR)
        text = got["choices"][0]["text"]
        assert text == ref["choices"][0]["text"]
        words = text.split()
        assert words and set(words[:-1]) <= {"the", "cat", "sat", "on", "mat"}
        if after is not None:
            after(temp, seed, text)

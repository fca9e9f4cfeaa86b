"""Helpers: reference decoding, decoder construction, and prompts built from the echo target.

The ``echo`` target's next token depends only on the current token (``next_of``), so its
greedy output from any token is a chain that ends in a cycle. A prompt made of that cycle
repeated makes every n-gram draft right (acceptance 1); a prompt whose every successor differs
from the echo successor, followed by a short generation that never revisits a token, makes every
draft wrong (acceptance 0).
"""

from __future__ import annotations

import numpy as np

from tests.speculative.mtp.util import check_grammar_completions, dist_sampler, greedy_sampler  # noqa: F401 (re-exported)
from tests.speculative.mtp.util import plain_generate as _plain_generate

CTX = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1}
N_GEN = 32
PROMPTS = (
    "the cat sat on the mat and the dog sat on the log and the cat sat on the",
    "Once upon a time there was a test, and once upon a time there was",
    "Hello world, this is a test",
)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SMALL = {"ngram_simple": {"size_n": 2, "size_m": 8}, "ngram_map_k": {"size_n": 2, "size_m": 8},
         "ngram_map_k4v": {"size_n": 2, "size_m": 8, "min_hits": 1},
         "ngram_mod": {"n_match": 2, "n_max": 8, "n_min": 1}}


def plain_generate(model, prompt: list[int], n: int, sampler=None) -> list[int]:
    """Token-at-a-time decoding without speculation (the reference), in this package's context."""
    return _plain_generate(model, prompt, n, sampler, ctx_params=CTX)


def config(spec_type, m: int | None = None, **kw):
    """A SpecConfig with small n-gram sizes (so the short test histories match); ``m`` sets every draft length."""
    from llama_cpp.speculative import SpecConfig

    params = {k: dict(v) for k, v in SMALL.items()}
    if m is not None:
        for k in ("ngram_simple", "ngram_map_k", "ngram_map_k4v"):
            params[k]["size_m"] = m
        params["ngram_simple"]["size_n"] = min(2, m)  # ngram-simple drafts no fewer than size_n tokens
        params["ngram_mod"].update(n_max=m, n_min=1)
        params["ngram_cache"] = {"n_draft": m}
        kw.setdefault("draft_n_max", min(m, 64))
    params.update(kw)
    return SpecConfig(spec_type, **params)


def spec_generate(model, prompt, n, cfg, sampler=None, ctx=None):
    """(tokens, stats) of one speculative generation on a fresh decoder."""
    from llama_cpp.speculative import make_decoder

    with make_decoder(model, cfg, ctx_params=dict(ctx or CTX)) as dec:
        dec.prefill(prompt)
        toks = list(dec.generate(sampler or greedy_sampler(), n))
        return toks, dec.stats


def next_of(model, tokens) -> dict[int, int]:
    """The echo target's greedy successor of each token (decoded alone at position 0)."""
    from llama_cpp._internals import LlamaBatch, LlamaContext

    out: dict[int, int] = {}
    with LlamaContext(model, n_ctx=16, n_batch=4, n_ubatch=4, n_threads=1, n_threads_batch=1) as ctx, \
            LlamaBatch(4, 0, 1) as b:
        for t in dict.fromkeys(int(x) for x in tokens):
            ctx.memory_clear(True)
            b.clear()
            b.add(t, 0, 0, True)
            ctx.decode(b)
            out[t] = int(np.argmax(ctx.logits_ith(-1)))
    return out


def echo_cycle(model, start: int, limit: int = 200) -> list[int]:
    """The cycle the echo target's greedy chain from ``start`` ends in."""
    chain = plain_generate(model, [start], limit)
    seen: dict[int, int] = {}
    for i, t in enumerate(chain):
        if t in seen:
            return chain[seen[t]:i]
        seen[t] = i
    raise AssertionError(f"no cycle within {limit} tokens from {start}")


def always_prompt(model, start: int, length: int = 60) -> list[int]:
    """The cycle repeated to at least ``length`` tokens (ending just before the cycle restarts)."""
    cyc = echo_cycle(model, start)
    reps = -(-length // len(cyc)) + 1
    return cyc * reps


def partial_prompt(model, start: int, other: int, copies: int = 3) -> list[int]:
    """The cycle repeated, then one more copy whose first token is ``other``: drafts copied from
    that copy are wrong from ``other`` on, drafts from the cycle are right."""
    cyc = echo_cycle(model, start)
    if len(cyc) < 2 or other in cyc:
        raise ValueError(f"needs a cycle of at least 2 tokens without {other}: {cyc}")
    return cyc * copies + [other] + cyc[1:]


def never_prompt(model, words: list[int], n_gen: int) -> tuple[list[int], int]:
    """(prompt, n_gen') where every adjacent pair differs from the echo successor and the
    generation of ``n_gen'`` tokens visits no prompt token nor any token twice."""
    nxt = next_of(model, words)
    seq = [w for w in words]
    # reorder so that no successor is the echo successor (also around the wrap)
    for _ in range(len(seq) * 4):
        bad = [i for i in range(len(seq)) if nxt[seq[i]] == seq[(i + 1) % len(seq)]]
        if not bad:
            break
        i = bad[0]
        j = (i + 2) % len(seq)
        seq[(i + 1) % len(seq)], seq[j] = seq[j], seq[(i + 1) % len(seq)]
    else:
        raise AssertionError("could not order the prompt words")
    prompt = seq * 3
    chain = plain_generate(model, prompt, n_gen)
    # stop before the chain returns to a token already seen in its own generation
    seen: set[int] = set()
    n = 0
    for t in chain:
        if t in seen:
            break
        seen.add(t)
        n += 1
    return prompt, n

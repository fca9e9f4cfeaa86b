"""``Llama``'s token sources: the prompt evaluated, then ``(token, logits_row_or_None)`` rows from
plain decoding or the speculative decoder (``speculative=`` types and upstream's ``draft_model``).

Functions take the ``Llama`` and work on its :class:`~llama_cpp._generation.sequence.GenerationSequence`
(``Llama.sequence``): the tokens in memory, their logits and the speculative decoder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from .._compat.hooks import HookedSource, TokenHooks
from .._core.sampler import LlamaSampler
from . import loop as _gen
from . import sampling as _sampling
from .sequence import GenerationSequence


def token_stream(llama: Any, prompt_tokens: Sequence[int], max_tokens: int, chain: LlamaSampler,
                 grammar: LlamaSampler | None, want_logprobs: bool, reuse_prefix: bool = True,
                 hooks: TokenHooks | None = None, prime: bool = True) -> Iterator[_gen.TokenRow]:
    """Evaluate the prompt now and return the ``(token, logits_row_or_None)`` source: tokens until
    EOG (yielded last) or ``max_tokens``. Called from inside the generators that consume it.
    ``prime=False``: the chain's penalties have already seen the prompt."""
    llama.native_context()
    seq: GenerationSequence = llama.sequence
    want_row = want_logprobs or (hooks is not None and bool(hooks.criteria))
    pick = _sampling.token_picker(seq.model, chain, grammar, want_row, hooks)
    source: Iterator[_gen.TokenRow]
    if seq.spec is not None:
        source = spec_token_stream(llama, prompt_tokens, max_tokens, chain, pick, reuse_prefix, prime)
    else:
        llama.last_prompt_cached = seq.prepare(prompt_tokens, reuse_prefix, llama.logits_all)
        if prime:
            _sampling.prime_penalties(chain, prompt_tokens, llama.last_n_tokens_size, llama.sampling_convention)
        source = plain_token_stream(seq, pick, max_tokens)
    return HookedSource(source, hooks) if hooks is not None else source  # type: ignore[return-value]


def plain_token_stream(seq: GenerationSequence, pick: _sampling.Pick, max_tokens: int) -> Iterator[_gen.TokenRow]:
    """One decode per token."""
    ids = seq.tokens
    assert seq.step is not None

    def decoded(tok: int) -> None:
        ids.append(tok)
        seq.n_outputs = 1  # the last batch is this token's: one logits row (``scores``)

    try:
        yield from _gen.decode_loop(seq.model, seq.step, pick, len(ids), max_tokens, decoded)
    except GeneratorExit:
        raise
    except BaseException:
        seq.fresh = False  # a decode may have failed half-way
        raise


def spec_token_stream(llama: Any, prompt_tokens: Sequence[int], max_tokens: int, chain: LlamaSampler,
                      pick: _sampling.Pick, reuse_prefix: bool, prime: bool = True) -> Iterator[_gen.TokenRow]:
    """``token_stream`` through the speculative decoder: the same tokens, several per target decode."""
    seq: GenerationSequence = llama.sequence
    dec = seq.spec
    assert dec is not None
    if not reuse_prefix:
        dec.invalidate()
    dec.stats.reset()
    seq.fresh = False
    dec.prefill(prompt_tokens)
    seq.tokens = dec.kv_tokens
    if prime:
        _sampling.prime_penalties(chain, prompt_tokens, llama.last_n_tokens_size, llama.sampling_convention)
    try:
        yield from _gen.speculative_loop(dec, pick, max_tokens)
    finally:
        seq.tokens = dec.kv_tokens
        st = dec.stats
        llama.last_speculative_stats = dataclasses.replace(
            st, drafted_at=list(st.drafted_at), accepted_at=list(st.accepted_at))


__all__ = ["plain_token_stream", "spec_token_stream", "token_stream"]

"""Sampling for every generation path: the llama.cpp sampler chain and the per-token picker.

:func:`sampler_chain` builds the native chain from request parameters (greedy when
``temperature == 0``); :func:`token_picker` draws one token from one output row of a context,
through the chain alone (fully native) or, with a grammar, grammar then chain over the
candidates. ``Llama``, the MTP decoder and multimodal chat all sample through these two.

The picker is the per-token hook point: with Python logits processors (upstream's
``logits_processor(input_ids, scores)``, held by a :class:`~llama_cpp._compat.hooks.TokenHooks`)
it takes the candidates path and the processors rewrite a copy of the logits row before the
grammar and the chain see it. Without them sampling stays one native call per token.
"""

from __future__ import annotations

import ctypes
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._compat.hooks import TokenHooks
from .._core.context import LlamaContext
from .._core.model import LlamaModel
from .._core.sampler import LlamaSampler, TokenCandidates
from .._errors import CallbackError, GrammarError, LlamaError, ParameterError, TokenizationError
from .._safety import checks as _checks
from ..llama_cpp import LLAMA_DEFAULT_SEED
from ..llama_grammar import LlamaGrammar

#: ``pick(context, output_index) -> (token, logits row or None)``; the token is accepted.
Pick = Callable[[LlamaContext, int], tuple[int, Any]]


def suppressed_tokens(model: LlamaModel) -> dict[int, float]:
    """The vocabulary's suppress-token list as a ``-inf`` logit bias (empty when there is none)."""
    C = model.bindings
    n = ctypes.c_int32(0)
    try:
        ptr = C.llama_vocab_get_suppress_tokens(model.vocab, ctypes.byref(n))
    except (AttributeError, LlamaError):  # a library without the suppress-token list
        return {}
    if not ptr or n.value <= 0:
        return {}
    if isinstance(ptr, int):
        ptr = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int32))
    return {int(ptr[i]): float("-inf") for i in range(n.value)}


_FLOAT_MAX = 3.4028234663852886e38


def _bias_value(tok: int, v: Any) -> float:
    """A bias as a C float: -inf (or anything below float's range) bans the token; NaN and +inf
    would make llama.cpp's sampling undefined, so they are refused."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ParameterError(f"logit_bias[{tok}] = {v!r} is not a number") from None
    if math.isnan(f) or f > _FLOAT_MAX:
        raise ParameterError(f"logit_bias[{tok}] = {v!r}: use a finite bias, or -inf to ban the token")
    return f


def _bias(model: LlamaModel, logit_bias: Mapping[Any, float] | None) -> dict[int, float]:
    bias: dict[int, float] = {}
    for k, v in (logit_bias or {}).items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise TokenizationError(f"logit_bias key {k!r} is not a token id") from None
        if not 0 <= tok < model.n_vocab:
            raise TokenizationError(f"logit_bias key {tok} is outside the vocabulary [0, {model.n_vocab})")
        bias[tok] = _bias_value(tok, v)
    for tok, v in suppressed_tokens(model).items():
        bias.setdefault(tok, v)
    if len(bias) >= model.n_vocab and all(v == float("-inf") for v in bias.values()):
        # llama.cpp's samplers would still pick one of them: a banned token, silently
        raise ParameterError(f"logit_bias bans every token of the vocabulary ({model.n_vocab}): leave at least "
                             "one token without a -inf bias")
    return bias


#: ``Llama(sampling_convention=...)``: ``"upstream"`` samples as llama-cpp-python 0.3.36 (penalties
#: over the sampled tokens only, mirostat on the raw logits, its seed sequence); ``"llama.cpp"`` as
#: llama.cpp's tools (penalties also over the last prompt tokens, temperature before mirostat, an
#: unset seed random per call)
CONVENTIONS = ("upstream", "llama.cpp")


def check_convention(convention: str) -> str:
    if convention not in CONVENTIONS:
        raise ParameterError(f"sampling_convention must be one of {', '.join(map(repr, CONVENTIONS))}, "
                             f"got {convention!r}")
    return convention


def next_seed(seed: int, convention: str) -> int:
    """The object's seed for a call without one: upstream advances every seed with its formula, the
    default included (the same sequence as upstream 0.3.36); llama.cpp's convention keeps the default
    (and -1) random per call."""
    if convention == "upstream":
        return random.Random(seed).randint(0, 2 ** 32)
    if seed in (LLAMA_DEFAULT_SEED, -1):
        return seed
    return random.Random(seed).randrange(0, LLAMA_DEFAULT_SEED)


def c_seed(seed: int) -> int:
    """A seed as llama.cpp takes it (``uint32_t``): ``-1`` is upstream's "random", llama.cpp's
    ``LLAMA_DEFAULT_SEED``; ``2**32`` (upstream's seed sequence can draw it) wraps to 0 as ctypes
    wraps it there. Anything else out of range is refused by the checks."""
    seed = int(seed)
    if seed == -1:
        return LLAMA_DEFAULT_SEED
    return 0 if seed == 2 ** 32 else seed


def sampler_chain(model: LlamaModel, *, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                  min_p: float = 0.05, typical_p: float = 1.0, repeat_penalty: float = 1.0,
                  frequency_penalty: float = 0.0, presence_penalty: float = 0.0, penalty_last_n: int = 64,
                  mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                  seed: int = LLAMA_DEFAULT_SEED, logit_bias: Mapping[Any, float] | None = None,
                  convention: str = "upstream") -> LlamaSampler:
    """A llama.cpp sampler chain: logit bias, penalties, then greedy, mirostat or the
    top-k/typical/top-p/min-p/temperature/dist pipeline (``temperature < 0``: dist alone).
    Mirostat samples the raw logits as upstream's chain does; llama.cpp's ``convention`` scales them
    by the temperature first, as its tools do. ``seed=-1`` is random (:func:`c_seed`)."""
    seed = c_seed(seed)
    mirostat_temp = convention == "llama.cpp"
    _checks.sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                     repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                     presence_penalty=presence_penalty, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                     mirostat_eta=mirostat_eta, seed=seed)
    n_vocab = model.n_vocab
    bias = _bias(model, logit_bias)
    chain = LlamaSampler()
    try:
        if bias:
            chain.add_logit_bias(n_vocab, bias)
        if repeat_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0:
            chain.add_penalties(n_vocab, int(penalty_last_n), repeat_penalty, frequency_penalty, presence_penalty)
        seed = int(seed)
        if temperature == 0:
            chain.add_greedy()
        elif temperature < 0:
            chain.add_dist(seed)
        elif mirostat_mode == 1:
            if mirostat_temp:
                chain.add_temp(temperature)
            chain.add_mirostat(n_vocab, seed, mirostat_tau, mirostat_eta, 100)
        elif mirostat_mode == 2:
            if mirostat_temp:
                chain.add_temp(temperature)
            chain.add_mirostat_v2(seed, mirostat_tau, mirostat_eta)
        else:
            chain.add_top_k(top_k)
            chain.add_typical(typical_p, 1)
            chain.add_top_p(top_p, 1)
            chain.add_min_p(min_p, 1)
            chain.add_temp(temperature)
            chain.add_dist(seed)
    except BaseException:
        chain.close()
        raise
    return chain


@runtime_checkable
class OutputConstraint(Protocol):
    """A ``grammar=`` that is more than a GBNF grammar: a chat answer's sampler and rendering
    (:class:`~llama_cpp._chat.constraint.ChatConstraint`: the template's lazy or strict grammar, the
    reasoning budget, the preserved tokens detokenized as text)."""

    special_tokens: frozenset[int]

    def sampler(self, model: LlamaModel) -> Any:
        """A sampler used as the grammar sampler is (``apply``, ``accept``, ``close``), or None."""


def grammar_sampler(model: LlamaModel, grammar: None | str | LlamaGrammar | OutputConstraint) -> Any:
    """A one-sampler chain holding the GBNF ``grammar``, an :class:`OutputConstraint`'s own sampler, or
    None without either."""
    if grammar is None:
        return None
    if isinstance(grammar, OutputConstraint):
        return grammar.sampler(model)
    g = grammar if isinstance(grammar, LlamaGrammar) else LlamaGrammar(grammar)
    s = LlamaSampler()
    try:
        s.add_grammar(model, g.grammar, g.root)
    except BaseException:
        s.close()
        raise
    return s


def special_tokens(grammar: Any) -> frozenset[int]:
    """The control tokens a generation under ``grammar`` detokenizes as text (an
    :class:`OutputConstraint`'s preserved tokens; none otherwise)."""
    return grammar.special_tokens if isinstance(grammar, OutputConstraint) else frozenset()


def prime_penalties(chain: LlamaSampler, history: Sequence[int], last_n: int, convention: str = "llama.cpp") -> None:
    """Let the penalty sampler see the last ``last_n`` tokens of the prompt (all when negative), as
    llama.cpp's tools do; upstream's convention counts only the sampled tokens (nothing to do)."""
    if convention == "llama.cpp" and "penalties" in chain.names and last_n:
        for t in history if last_n < 0 else history[-last_n:]:
            chain.accept(t)


def token_picker(model: LlamaModel, chain: LlamaSampler, grammar: LlamaSampler | None, want_row: bool,
                 hooks: TokenHooks | None = None) -> Pick:
    """``pick(ctx, i) -> (token, logits row or None)`` for output ``i``: the native chain, or, with a
    grammar, the grammar then the chain over the candidates (both accept the token); ``hooks``'
    logits processors rewrite the row first and the picked token joins their history."""
    sample_native = model.bindings.llama_sampler_sample
    chain_ptr = chain.ptr
    if hooks is not None and hooks.processors:
        return _processed_picker(model, chain, grammar, want_row, hooks)
    if grammar is None:
        def pick(ctx: LlamaContext, i: int) -> tuple[int, Any]:
            row = ctx.logits_ith(i) if want_row else None
            return int(sample_native(chain_ptr, ctx.ptr, i)), row
        return pick
    cand = TokenCandidates(model.n_vocab)

    def pick_constrained(ctx: LlamaContext, i: int) -> tuple[int, Any]:
        row = ctx.logits_ith(i)
        cand.fill(row)
        grammar.apply(cand.ref)
        chain.apply(cand.ref)
        tok = _allowed_token(cand)
        grammar.accept(tok)
        chain.accept(tok)
        return tok, row if want_row else None
    return pick_constrained


def _allowed_token(cand: TokenCandidates, grammar: bool = True) -> int:
    """The chain's pick, refused when its score is -inf: every token the grammar allows was ruled out
    (a -inf ``logit_bias`` or a logits processor), and accepting it would abort inside llama.cpp."""
    tok = cand.selected_token()
    a = cand.array
    if not np.isfinite(a.data[a.selected].logit):
        if not grammar:
            raise CallbackError("the logits_processor (with logit_bias) left every token at -inf: leave at "
                                "least one token a finite score")
        raise GrammarError("every token the grammar allows has a score of -inf (set by logit_bias or a "
                           "logits_processor): relax them or the grammar")
    return tok


def _processed_picker(model: LlamaModel, chain: LlamaSampler, grammar: LlamaSampler | None, want_row: bool,
                      hooks: TokenHooks) -> Pick:
    cand = TokenCandidates(model.n_vocab)

    def pick_processed(ctx: LlamaContext, i: int) -> tuple[int, Any]:
        row = ctx.logits_ith(i)
        cand.fill(hooks.process(row))
        if grammar is not None:
            grammar.apply(cand.ref)
        chain.apply(cand.ref)
        tok = _allowed_token(cand, grammar is not None)
        if grammar is not None:
            grammar.accept(tok)
        chain.accept(tok)
        hooks.push(tok)
        return tok, row if want_row else None
    return pick_processed


def sample_once(model: LlamaModel, ctx: LlamaContext, chain: LlamaSampler, grammar: LlamaSampler | None,
                hooks: TokenHooks | None = None, idx: int = -1) -> int:
    """One token from output ``idx`` without accepting it (``Llama.sample``)."""
    processed = hooks is not None and bool(hooks.processors)
    if grammar is None and not processed:
        return chain.sample(ctx, idx)
    cand = TokenCandidates(model.n_vocab)
    row = ctx.logits_ith(idx)
    cand.fill(hooks.process(row) if processed else np.asarray(row))
    if grammar is not None:
        grammar.apply(cand.ref)
    chain.apply(cand.ref)
    return _allowed_token(cand, grammar is not None)


__all__ = ["CONVENTIONS", "OutputConstraint", "Pick", "c_seed", "check_convention", "grammar_sampler", "next_seed",
           "prime_penalties", "sample_once", "sampler_chain", "special_tokens", "suppressed_tokens", "token_picker"]

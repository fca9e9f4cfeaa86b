"""The bodies of ``Llama``'s completion API: prompt tokens (text, token ids, fill-in-the-middle),
``create_completion``'s chunks with echoed-prompt logprobs and the prompt cache, ``generate`` (with
``send``) and ``sample``.

Functions take the ``Llama`` and go through its public methods (``make_sampler``, ``save_state``,
``load_state``...), so overriding or patching those still takes effect, and work on its
:class:`~llama_cpp._generation.sequence.GenerationSequence` (``Llama.sequence``); ``Llama`` keeps the
public signatures and docstrings.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .._compat.hooks import TokenHooks
from .._compat.state import longest_token_prefix
from .._core.sampler import LlamaSampler
from .._errors import ContextOverflowError, LlamaError
from . import loop as _gen
from . import responses as _responses
from . import sampling as _sampling
from . import streams as _streams

#: wraps a generator so the ``Llama`` stays busy until it ends (``CallGuard.stream``)
StreamGuard = Callable[[Iterator[Any]], Iterator[Any]]

log = logging.getLogger("llama_cpp")

#: rows per batch when scoring an echoed prompt: bounds the logits buffer
PROMPT_LOGPROB_ROWS = 64

_SAMPLER_ARGS = ("top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty",
                 "presence_penalty", "mirostat_mode", "mirostat_tau", "mirostat_eta", "logit_bias")


def prompt_tokens(llama: Any, prompt: str | bytes | Sequence[int], suffix: str | None,
                  add_bos: bool = True) -> list[int]:
    """The tokens of a completion prompt: text (``suffix``: fill-in-the-middle) or token ids."""
    m = llama.native_model()
    if isinstance(prompt, (str, bytes)):
        data = prompt.encode("utf-8") if isinstance(prompt, str) else prompt
        if suffix is not None:
            return infill_tokens(llama, data, suffix.encode("utf-8"))
        # the Llama's tokenizer: the model's vocabulary, or Llama(tokenizer=...)
        toks = [int(t) for t in llama.tokenizer_.tokenize(data, add_bos, True)] if data or add_bos else []
    else:
        if suffix is not None:
            raise ValueError("suffix needs a text prompt")
        toks = [int(t) for t in prompt]
    if not toks and m.add_bos() and m.token_bos() >= 0:
        toks = [m.token_bos()]
    return toks


def infill_tokens(llama: Any, prefix: bytes, suffix: bytes) -> list[int]:
    """A fill-in-the-middle prompt with the model's FIM tokens (SPM order with ``spm_infill``)."""
    m = llama.native_model()
    C = m.bindings
    pre, suf, mid = (int(C.llama_vocab_fim_pre(m.vocab)), int(C.llama_vocab_fim_suf(m.vocab)),
                     int(C.llama_vocab_fim_mid(m.vocab)))
    if min(pre, suf, mid) < 0:
        raise ValueError("suffix (fill-in-the-middle) needs a model with FIM tokens; this one has none")
    p = m.tokenize(prefix, add_special=False, parse_special=False)
    s = m.tokenize(suffix, add_special=False, parse_special=False)
    bos = [m.token_bos()] if m.add_bos() and m.token_bos() >= 0 else []
    if llama.spm_infill:
        return bos + [suf] + s + [pre] + p + [mid]
    return bos + [pre] + p + [suf] + s + [mid]


def completion_chunks(llama: Any, prompt_tokens: list[int], *, max_tokens: int | None, stop: Any,
                      logprobs: int | None, echo: bool, chain: LlamaSampler, grammar: LlamaSampler | None,
                      completion_id: str, created: int, model_name: str, hooks: TokenHooks | None = None,
                      prompt_chars: int | None = None,
                      special_tokens: frozenset[int] = frozenset()) -> Iterator[dict[str, Any]]:
    """The one generation path: streaming yields these chunks, non-streaming joins them."""
    m = llama.native_model()
    ctx = llama.native_context()
    llama.sequence.check_prompt(prompt_tokens)
    room = ctx.n_ctx() - len(prompt_tokens)
    if max_tokens is None or max_tokens <= 0:
        max_tokens = room
    max_tokens = min(int(max_tokens), room)
    want_lp = logprobs is not None and logprobs >= 0
    if llama.cache is not None:
        cache_restore(llama, prompt_tokens)
    head = m.detokenize(prompt_tokens) if echo else b""
    prompt_lp = prompt_logprobs(llama, prompt_tokens, _gen.Logprobs(m, logprobs)) if want_lp and echo else ()
    base = 0  # logprob offsets count from the end of the prompt when it is not echoed
    if want_lp and not echo:
        base = _gen.char_len(m.detokenize(prompt_tokens)) if prompt_chars is None else prompt_chars
    tokens = _streams.token_stream(llama, prompt_tokens, max_tokens, chain, grammar, want_lp, hooks=hooks)
    yield from _gen.completion_chunks(
        m, tokens, n_prompt=len(prompt_tokens), stop=stop, logprobs=logprobs, head=head,
        completion_id=completion_id, created=created, model_name=model_name, prompt_logprobs=prompt_lp,
        offset_base=base, special_tokens=special_tokens)
    if llama.cache is not None and llama.sequence.tokens:
        llama.cache[list(llama.sequence.tokens)] = llama.save_state()


def prompt_logprobs(llama: Any, tokens: Sequence[int], lp: _gen.Logprobs) -> list[_gen.LogprobEntry]:
    """Evaluate ``tokens`` afresh keeping every position's logits, and return the echoed prompt's
    logprob entries (a leading BOS is left out; the first token has no logprob, as upstream).
    The context then holds the prompt with its last logits, so generation evaluates nothing."""
    ctx, m = llama.native_context(), llama.native_model()
    first = 1 if len(tokens) > 1 and tokens[0] == m.token_bos() else 0
    # offsets[k]: characters of detokenize(tokens[:k]); after the first piece (whose leading space
    # detokenize may drop) each token adds its own piece, so one pass instead of one per prefix
    offsets = [0] * len(tokens)
    if first + 1 < len(tokens):
        offsets[first + 1] = _gen.char_len(m.detokenize(tokens[:first + 1]))
    for k in range(first + 2, len(tokens)):
        offsets[k] = offsets[k - 1] + _gen.char_len(m.token_to_piece(int(tokens[k - 1])))
    entries = [lp.entry(int(tokens[first]), None, offsets[first])]
    seq = llama.sequence
    seq.tokens.clear()
    seq.fresh = False
    ctx.memory_clear(True)
    step = max(1, min(ctx.n_batch(), PROMPT_LOGPROB_ROWS))
    for i in range(0, len(tokens), step):
        chunk = [int(t) for t in tokens[i:i + step]]
        seq.decode(chunk, i, True)
        seq.tokens.extend(chunk)
        for j in range(len(chunk)):
            nxt = i + j + 1  # the row of position i + j scores the token after it
            if first < nxt < len(tokens):
                entries.append(lp.entry(int(tokens[nxt]), ctx.logits_ith(j - len(chunk)), offsets[nxt]))
    seq.fresh = True
    return entries


def cache_restore(llama: Any, prompt_tokens: Sequence[int]) -> None:
    """Load the cached state sharing the most with the prompt, if it shares more than the context."""
    try:
        item = llama.cache[prompt_tokens]
    except KeyError:
        return
    cached = [int(t) for t in np.asarray(item.input_ids)[: item.n_tokens]]
    if longest_token_prefix(cached, prompt_tokens) > longest_token_prefix(llama.sequence.tokens, prompt_tokens):
        try:
            llama.load_state(item)
        except LlamaError as exc:  # another model's or another context's entry: evaluate afresh
            log.warning("prompt cache entry not used: %s", exc)


def create_completion(llama: Any, call: Mapping[str, Any], guard: StreamGuard) -> Any:
    """``Llama.create_completion`` (``call``: its arguments, already type-checked; ``guard`` wraps the
    stream)."""
    llama.native_context()
    prompt, suffix = call["prompt"], call["suffix"]
    seq = llama.sequence
    tokens = prompt_tokens(llama, prompt, suffix)
    seq.check_prompt(tokens)
    hooks = TokenHooks.build(tokens, llama.n_vocab(), call["logits_processor"], call["stopping_criteria"])
    seed = seq.next_seed(call["seed"], llama.sampling_convention)
    chain = llama.make_sampler(temperature=call["temperature"], penalty_last_n=call["penalty_last_n"],
                                seed=seed, **{k: call[k] for k in _SAMPLER_ARGS})
    grammar = call["grammar"]
    try:
        gsampler = _sampling.grammar_sampler(llama.native_model(), grammar)
    except BaseException:
        chain.close()
        raise
    chunks = completion_chunks(
        llama, tokens, max_tokens=call["max_tokens"], stop=call["stop"], logprobs=call["logprobs"], echo=call["echo"],
        chain=chain, grammar=gsampler, completion_id=f"cmpl-{uuid.uuid4()}", created=int(time.time()),
        model_name=call["model"] or llama.model_path, hooks=hooks, special_tokens=_sampling.special_tokens(grammar),
        prompt_chars=len(prompt) if isinstance(prompt, str) and suffix is None else None)

    def closing() -> Iterator[dict[str, Any]]:
        try:
            yield from chunks
        finally:
            chain.close()
            if gsampler is not None:
                gsampler.close()

    if call["stream"]:
        return guard(closing())
    return _responses.join_chunks(list(closing()))


def generate(llama: Any, call: Mapping[str, Any], guard: StreamGuard) -> Iterator[int]:
    """``Llama.generate`` (``call``: its arguments; ``guard`` wraps the token generator)."""
    tokens = [int(t) for t in call["tokens"]]
    llama.native_context()
    if not call["reset"]:
        tokens = list(llama.sequence.tokens) + tokens
    llama.sequence.check_prompt(tokens)
    processors, criteria = call["logits_processor"], call["stopping_criteria"]
    n_vocab = llama.n_vocab()
    hooks = TokenHooks.build(tokens, n_vocab, processors, criteria)
    chain = llama.make_sampler(temperature=call["temp"], penalty_last_n=None, seed=call["seed"],
                                **{k: call[k] for k in _SAMPLER_ARGS})
    try:
        g = _sampling.grammar_sampler(llama.native_model(), call["grammar"])
    except BaseException:
        chain.close()
        raise

    def token_ids() -> Generator[int, Sequence[int] | None, None]:
        history, h, prime = list(tokens), hooks, True
        try:
            while True:
                stream = _streams.token_stream(llama, history, llama.n_ctx() - len(history), chain, g, False,
                                               reuse_prefix=True, hooks=h, prime=prime)
                more: list[int] = []
                for tok, _ in stream:
                    history.append(tok)
                    sent = yield tok
                    if sent is not None and len(sent):
                        more = sent_tokens(llama, sent, len(history))
                        break
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
                if not more:
                    return
                # the token just yielded was not decoded yet: it is evaluated with ``more``
                _sampling.prime_penalties(chain, more, llama.last_n_tokens_size, llama.sampling_convention)
                history += more
                h = TokenHooks.build(history, n_vocab, processors, criteria)
                prime = False
        finally:
            chain.close()
            if g is not None:
                g.close()

    return guard(token_ids())


def sent_tokens(llama: Any, sent: Sequence[int], n_history: int) -> list[int]:
    """Tokens sent into ``generate``, checked before they reach the context."""
    if isinstance(sent, (str, bytes)) or not isinstance(sent, Sequence | np.ndarray):
        raise TypeError(f"generate().send() takes a sequence of token ids, got {type(sent).__name__}")
    more = [int(t) for t in sent]
    llama.native_model().check_tokens(more, "sent token")
    if n_history + len(more) >= llama.n_ctx():
        raise ContextOverflowError(
            f"{n_history} tokens so far + {len(more)} sent leave no room in n_ctx={llama.n_ctx()}: "
            "send fewer tokens or create Llama(n_ctx=...) larger")
    return more


def sample(llama: Any, call: Mapping[str, Any]) -> int:
    """``Llama.sample`` (``call``: its arguments)."""
    ctx = llama.native_context()
    seq = llama.sequence
    if not seq.tokens:
        raise LlamaError("nothing evaluated yet: call eval(tokens) first")
    seq.refresh_logits(llama.logits_all)
    ids = seq.tokens
    idx = call["idx"]
    ridx = -1 if idx is None else int(idx) - len(ids)
    if not -max(1, seq.n_outputs) <= ridx < 0:
        raise IndexError(f"idx={idx} has no logits: the last batch kept positions "
                         f"{len(ids) - max(1, seq.n_outputs)}..{len(ids) - 1} "
                         "(create Llama(logits_all=True) to keep every position)")
    chain = llama.make_sampler(temperature=call["temp"], penalty_last_n=None, seed=call["seed"],
                                **{k: call[k] for k in _SAMPLER_ARGS})
    try:
        hooks = TokenHooks.build(ids[:len(ids) + ridx + 1], llama.n_vocab(), call["logits_processor"], None)
        _sampling.prime_penalties(chain, ids, llama.last_n_tokens_size, llama.sampling_convention)
        g = _sampling.grammar_sampler(seq.model, call["grammar"])
        try:
            return _sampling.sample_once(seq.model, ctx, chain, g, hooks, ridx)
        finally:
            if g is not None:
                g.close()
    finally:
        chain.close()


__all__ = ["PROMPT_LOGPROB_ROWS", "cache_restore", "completion_chunks", "create_completion", "generate",
           "infill_tokens", "prompt_logprobs", "prompt_tokens", "sample", "sent_tokens"]

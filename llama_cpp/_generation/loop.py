"""The generation engine every path drives: token loops, the UTF-8-safe text stream with stop
strings, logprobs, and OpenAI-style completion chunks.

A generation is three layers, each written once:

1. a *token source* yields ``(token, logits row or None)`` until an end-of-generation token
   (yielded last) or the limit: :func:`decode_loop` (one token per ``llama_decode``, after a
   text or multimodal prompt) or :func:`speculative_loop` (several per verify batch of a
   :class:`~llama_cpp.speculative.decoder.SpeculativeDecoder`). Both draw every token through one
   :data:`~llama_cpp._generation.sampling.Pick`, the per-token hook point for logits processors;
2. :class:`TextStream` turns tokens into text: bytes are held back while they end inside a UTF-8
   sequence or could begin a stop string, and the text is cut where a stop string first appears;
3. :func:`completion_chunks` renders the stream as ``text_completion`` chunks (with logprobs and
   usage); :mod:`llama_cpp._generation.responses` joins them or converts them to chat chunks.

``Llama`` (plain, or speculative: ``speculative=`` types and upstream's ``draft_model`` objects,
drafters of the one verify loop) and multimodal chat differ only in their prompt evaluation and
their token source. Upstream's ``stopping_criteria(input_ids, logits)`` wraps the token
source (:class:`~llama_cpp._compat.hooks.HookedSource`); a prompt cache sits in front of the token
source, where the prompt is evaluated.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaBatch, LlamaContext
from .._core.model import LlamaModel
from .._errors import DecodeError
from ..speculative.decoder import SpeculativeDecoder
from .sampling import Pick

#: what a token source yields: the token and a copy of its logits row (None unless asked for)
TokenRow = tuple[int, "np.ndarray | None"]


def utf8_complete_len(b: bytes) -> int:
    """Length of the longest prefix of ``b`` that does not end inside a UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if c & 0x80 == 0:
            return n
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


def held_suffix(text: bytes, stops: Sequence[bytes]) -> int:
    """Bytes at the end of ``text`` that could be the start of a stop sequence."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


# --------------------------------------------------------------------------------------------
# token sources
# --------------------------------------------------------------------------------------------

class TokenStep:
    """A one-token batch bound to a context, decoded with a raw ``llama_decode`` (no per-token checks:
    the token comes from the sampler, the position from the loop)."""

    def __init__(self, ctx: LlamaContext) -> None:
        batch = LlamaBatch(1, 0, 1)
        batch.logits[0] = 1
        batch.n_tokens = 1
        self.batch = batch
        self.ctx = ctx
        self.struct = batch.validated_view(ctx, 0, 1)

    def close(self) -> None:
        self.struct = None
        self.batch.close()


def decode_loop(model: LlamaModel, step: TokenStep, pick: Pick, n_past: int, max_tokens: int,
                decoded: Callable[[int], None] | None = None) -> Iterator[TokenRow]:
    """Sample at the last output, yield, decode the token at ``n_past``, repeat.

    Stops after an end-of-generation token (yielded), ``max_tokens`` tokens or a full context;
    ``decoded(token)`` is called for each token once it is in the context's memory.
    """
    ctx = step.ctx
    C = model.bindings
    ctx_ptr, vocab, one_struct = ctx.ptr, model.vocab, step.struct
    token_arr, pos_arr = step.batch.token_arr, step.batch.pos
    decode, is_eog = C.llama_decode, C.llama_vocab_is_eog
    n_ctx = ctx.n_ctx()
    pos = n_past
    produced = 0
    while produced < max_tokens:
        tok, row = pick(ctx, -1)
        produced += 1
        yield tok, (np.array(row) if row is not None else None)
        if is_eog(vocab, tok) or produced >= max_tokens or pos >= n_ctx:
            return
        token_arr[0] = tok
        pos_arr[0] = pos
        rc = decode(ctx_ptr, one_struct)
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc} while generating token {produced}")
        ctx.n_decode += 1
        pos += 1
        if decoded is not None:
            decoded(tok)


def speculative_loop(decoder: SpeculativeDecoder, pick: Pick, max_tokens: int) -> Iterator[TokenRow]:
    """:func:`decode_loop` through a prefilled speculative decoder: the same tokens, several per target decode."""
    rows: collections.deque[np.ndarray | None] = collections.deque()

    def sample(ctx: LlamaContext, i: int) -> int:
        # called once per emitted token, in order, with that token's row of the verify batch
        tok, row = pick(ctx, i)
        rows.append(None if row is None else np.array(row))
        return tok

    for tok in decoder.generate(sample, max_tokens):
        yield tok, rows.popleft()


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------

class TextStream:
    """Generated bytes after an optional ``head`` (the echoed prompt): which of them are safe to
    send, and where a stop string ends the text."""

    def __init__(self, stops: Iterable[str | bytes], head: bytes = b"") -> None:
        self.stops = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in stops if s]
        self._longest = max((len(s) for s in self.stops), default=0)
        self.text = bytearray(head)
        self.start = len(head)  # stop strings are searched after the head
        self.sent = 0
        self.stopped = False

    def push(self, piece: bytes) -> bytes:
        """Append ``piece``; return the bytes now safe to send (after a stop string: up to it)."""
        text = self.text
        text.extend(piece)
        stops = self.stops
        if stops:
            search_from = max(self.start, self.sent - self._longest)
            data = bytes(text)
            hit = min((i for i in (data.find(s, search_from) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                del text[hit:]
                self.stopped = True
                return b""
            safe = len(text) - held_suffix(bytes(text[self.sent:]), stops)
        else:
            safe = len(text)
        safe = self.sent + utf8_complete_len(bytes(text[self.sent:safe]))
        if safe <= self.sent:
            return b""
        out = bytes(text[self.sent:safe])
        self.sent = safe
        return out

    def rest(self) -> bytes:
        """Everything not sent yet (the tail at the end of generation)."""
        out = bytes(self.text[self.sent:])
        self.sent = len(self.text)
        return out


#: one ``logprobs`` entry: the token's piece, its text offset, its log-probability and top ones
LogprobEntry = tuple[str, int, "float | None", "dict[str, float] | None"]


def char_len(data: bytes) -> int:
    """Characters in UTF-8 ``data``, counting a sequence cut at either end once (its lead byte)."""
    return sum(1 for b in data if b & 0xC0 != 0x80)


class Logprobs:
    """The ``logprobs`` block of completion chunks: per token its piece, offset and log-softmax.

    Offsets count characters of the response text, as OpenAI's and upstream's do: from the start of
    the echoed prompt, or without ``echo`` from the end of the prompt (``len(prompt)``)."""

    def __init__(self, model: LlamaModel, top: int | None) -> None:
        self.enabled = top is not None and top >= 0
        self.top = int(top or 0)
        self.piece = model.token_to_piece

    def entry(self, tok: int, row: np.ndarray | None, offset: int) -> LogprobEntry:
        piece = self.piece(tok).decode("utf-8", errors="ignore")
        if row is None:
            return piece, offset, None, None
        r = row.astype(np.float64)
        mx = r.max()
        lse = mx + np.log(np.exp(r - mx).sum())
        top: dict[str, float] = {}
        k = self.top
        if k > 0:
            idx = np.argpartition(-r, min(k, len(r) - 1))[:k]
            for j in idx[np.argsort(-r[idx])]:
                top[self.piece(int(j)).decode("utf-8", errors="ignore")] = float(r[j] - lse)
        top[piece] = float(r[tok] - lse)
        return piece, offset, float(r[tok] - lse), top

    def block(self, entries: list[tuple[int, np.ndarray | None, int]],
              ready: Sequence[LogprobEntry] = ()) -> dict[str, Any] | None:
        """The block for ``ready`` entries then ``(token, row, offset)`` ones; None when disabled."""
        if not self.enabled:
            return None
        rows = [*ready, *(self.entry(tok, row, offset) for tok, row, offset in entries)]
        return {"tokens": [e[0] for e in rows], "text_offset": [e[1] for e in rows],
                "token_logprobs": [e[2] for e in rows], "top_logprobs": [e[3] for e in rows]}


def _piece_of(plain: Callable[..., bytes], preserved: frozenset[int], tok: int) -> bytes:
    return plain(tok, tok in preserved)


def completion_chunks(model: LlamaModel, tokens: Iterable[TokenRow], *, n_prompt: int,
                      stop: str | bytes | Sequence[str | bytes] | None, logprobs: int | None,
                      head: bytes, completion_id: str, created: int, model_name: str,
                      offset_base: int = 0, prompt_logprobs: Sequence[LogprobEntry] = (),
                      special_tokens: Collection[int] = ()) -> Iterator[dict[str, Any]]:
    """``text_completion`` chunks of the generated text: one per safe piece, then a final chunk with
    the rest, the finish reason (``stop``: EOG or a stop string; ``length``) and the usage.
    ``special_tokens`` are control tokens rendered as their text (a chat template's preserved tokens,
    which its parser reads); other control tokens render as nothing.

    Logprob offsets start at ``offset_base`` plus the characters of ``head`` (the echoed prompt);
    ``prompt_logprobs`` (the echoed prompt's own entries) lead the first block."""
    stops = [stop] if isinstance(stop, (str, bytes)) else list(stop or [])
    text = TextStream(stops, head)
    lp = Logprobs(model, logprobs)
    pending: list[tuple[int, np.ndarray | None, int]] = []
    ready: Sequence[LogprobEntry] = prompt_logprobs
    chars = offset_base + char_len(head)
    n_gen = 0
    finish = "length"
    token_to_piece: Callable[[int], bytes] = model.token_to_piece
    if special_tokens:
        token_to_piece = functools.partial(_piece_of, model.token_to_piece, frozenset(special_tokens))

    def chunk(data: bytes, reason: str | None, lps: Any) -> dict[str, Any]:
        return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"text": data.decode("utf-8", errors="ignore"), "index": 0, "logprobs": lps,
                             "finish_reason": reason}]}

    for tok, row in tokens:
        if model.is_eog(tok):
            finish = "stop"
            break
        n_gen += 1
        piece = token_to_piece(tok)
        if lp.enabled:
            pending.append((tok, row, chars))
            chars += char_len(piece)
        out = text.push(piece)
        if text.stopped:
            finish = "stop"
            break
        if out:
            yield chunk(out, None, lp.block(pending, ready))
            pending, ready = [], ()
    if getattr(tokens, "stopped", False):  # a stopping criterion ended it (HookedSource)
        finish = "stop"
    final = chunk(text.rest(), finish, lp.block(pending, ready))
    final["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}
    yield final


__all__ = ["LogprobEntry", "TextStream", "TokenRow", "TokenStep", "char_len", "completion_chunks", "decode_loop",
           "held_suffix", "speculative_loop", "utf8_complete_len"]

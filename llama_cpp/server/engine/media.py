"""Image and audio in the slots: a media prompt as the slots hold it, and its media decoded into a slot.

A prompt with media is a list of entries, one per position (as llama-server's ``server_tokens``):
text tokens, and for each media chunk ``n_pos`` copies of a negative key that stands for its content
(a hash of its projector rows), so that prefix reuse and the shared prompt cache compare media by
what they put in the KV cache: the same image at the same place is reused, any other stops the match.
Each chunk's rows are encoded before the request queues (:func:`media_prompt`, one encode at a time
per projector) and decoded into the slot's sequence in a decode of their own when its prefill
reaches them (:func:`decode_span`, as llama-server's ``mtmd_helper_eval_chunk_single``); the text
around them joins the shared batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Any

import numpy as np

from ..._errors import ContextOverflowError
from ..._multimodal.decode import decode_media

_KEY_MASK = (1 << 62) - 1
# mtmd contexts are not made to be used from two threads at once: their creation, tokenizing and encoding
# for the slots take this lock (request threads prepare media prompts while the scheduler decodes)
ENCODE_LOCK = threading.Lock()


@dataclasses.dataclass
class MediaSpan:
    """One media chunk of a prompt: where it starts among the prompt's entries and its decoder input."""

    start: int  # index of its first entry in the prompt (and its first position)
    n_pos: int  # entries (positions) it takes; its rows may be more (M-RoPE images)
    rows: np.ndarray  # (n_tokens, n_embd) float32 projector output
    positions: np.ndarray  # (n_tokens, n_pos_per_embd) int32 decoder positions
    non_causal: bool  # decoded with causal attention off (then in one micro-batch)
    key: int  # the negative entry that stands for it in the prompt

    @property
    def end(self) -> int:
        return self.start + self.n_pos

    @property
    def n_tokens(self) -> int:
        return int(self.rows.shape[0])


def media_key(rows: np.ndarray) -> int:
    """A negative id of a media chunk's rows (never a token id)."""
    h = int.from_bytes(hashlib.blake2b(np.ascontiguousarray(rows).tobytes(), digest_size=8).digest(), "little")
    return -(h & _KEY_MASK) - 1


def media_prompt(mctx: Any, chunks: Any, n_ubatch: int) -> tuple[list[int], list[MediaSpan]]:
    """The entries and media spans of mtmd ``chunks`` (closed by the caller), media encoded now.
    A non-causal chunk larger than ``n_ubatch`` or a prompt ending in media is refused (a 400)."""
    items = list(chunks)
    if items and items[-1].is_media:
        raise ValueError("the prompt ends with an image or audio part: the chat template must put text after it")
    tokens: list[int] = []
    spans: list[MediaSpan] = []
    for ch in items:
        if not ch.is_media:
            tokens.extend(int(t) for t in ch.tokens)
            continue
        non_causal = mctx.use_non_causal(ch)
        if non_causal and ch.n_tokens > n_ubatch:
            raise ContextOverflowError(
                f"a {ch.kind} chunk of {ch.n_tokens} embeddings must be decoded in one micro-batch (non-causal "
                f"attention) but n_ubatch={n_ubatch}: raise n_batch and n_ubatch")
        with ENCODE_LOCK:
            rows = mctx.encode(ch)
        start = len(tokens)
        key = media_key(rows)
        spans.append(MediaSpan(start, ch.n_pos, rows, mctx.positions(ch, start), non_causal, key))
        tokens.extend([key] * ch.n_pos)
    return tokens, spans


def cells(tokens: list[int], spans: list[MediaSpan]) -> int:
    """KV cells the prompt takes (an M-RoPE image has more rows than positions)."""
    return len(tokens) + sum(max(0, m.n_tokens - m.n_pos) for m in spans)


def span_at(spans: list[MediaSpan], i: int) -> MediaSpan | None:
    """The span that starts at entry ``i``."""
    for m in spans:
        if m.start == i:
            return m
    return None


def text_until(spans: list[MediaSpan], i: int, end: int) -> int:
    """Where the text run starting at entry ``i`` stops: the next span's start, or ``end``."""
    return min([m.start for m in spans if m.start >= i] + [end])


def whole_spans(spans: list[MediaSpan], keep: int) -> int:
    """``keep`` lowered to the start of a span it would cut (a media chunk is reused whole or not at all)."""
    for m in spans:
        if m.start < keep < m.end:
            return m.start
    return keep


def decode_span(ctx: Any, batch: Any, seq: int, span: MediaSpan) -> int:
    """Decode ``span``'s rows into sequence ``seq``; returns the number of decodes."""
    return decode_media(ctx, batch, span.rows, span.positions, span.non_causal, output_last=False, seq=seq)


__all__ = ["ENCODE_LOCK", "MediaSpan", "cells", "decode_span", "media_key", "media_prompt", "span_at", "text_until",
           "whole_spans"]

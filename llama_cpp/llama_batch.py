"""Python batches over llama.cpp's ``llama_batch`` and ``llama_batch_ext``.

* :class:`LlamaBatch` holds token ids *or* embedding rows with explicit positions, sequence ids
  and output flags; submit any range of it with ``context.decode(batch, start=, count=)``.
* :class:`LlamaBatchExt` wraps the extended batch of one context (``llama_batch_ext_init(ctx)``):
  entries may pair a token id with a hidden-state row (``set_embd_token``, for MTP drafting),
  embedding entries take M-RoPE positions, and ``process()`` submits it with ``llama_process``.

Everything is validated before the native call: token ids against the vocabulary, sequence ids
against ``n_seq_max``, rows against the context's input width (float32, finite), and capacity;
the error names the offending entry.
"""

from __future__ import annotations

from typing import Any

from ._core.context import LlamaBatch, LlamaBatchExtNative, LlamaContext
from ._core.ownership import unwrap


def _context_of(obj: Any) -> LlamaContext:
    obj = unwrap(obj)
    if isinstance(obj, LlamaContext):
        return obj
    ctx = unwrap(getattr(obj, "ctx", None))  # a Llama (or anything exposing its LlamaContext as .ctx)
    if isinstance(ctx, LlamaContext):
        return ctx
    raise TypeError(f"expected a LlamaContext or a Llama, got {type(obj).__name__}")


class LlamaBatchExt(LlamaBatchExtNative):
    """An extended batch for one context (a :class:`LlamaContext` or a ``Llama``).

    Capacity is the context's ``n_batch``; embedding rows are ``n_embd_inp`` wide for a normal
    context and ``n_embd_out`` wide for an MTP context. Positions are always explicit.
    """

    def __init__(self, ctx: LlamaContext | Any) -> None:
        context = _context_of(ctx)
        super().__init__(context)
        self.context = context

    def process(self, encode: bool = False) -> None:
        """Submit the batch to its context (``llama_process`` DECODE, or ENCODE)."""
        self.context.process(self, encode=encode)


def decode(ctx: LlamaContext | Any, batch: LlamaBatch, start: int = 0, count: int | None = None) -> None:
    """``llama_decode`` of ``batch`` entries ``[start, start + count)`` on ``ctx``."""
    _context_of(ctx).decode(batch, start=start, count=count)


__all__ = ["LlamaBatch", "LlamaBatchExt", "decode"]

"""Evaluating multimodal prompts: media rows decoded at their positions (:func:`decode_media`) and
mtmd chunks evaluated into a context (:func:`eval_chunks`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._core.context import LlamaBatchExtNative, LlamaContext
from .._errors import ContextOverflowError
from ..mtmd import Chunks, MTMDContext

# --------------------------------------------------------------------------------------------
# evaluation helpers
# --------------------------------------------------------------------------------------------

def decode_media(ctx: LlamaContext, batch: LlamaBatchExtNative, rows: np.ndarray, positions: np.ndarray,
                  non_causal: bool, *, output_last: bool,
                  after: Callable[[np.ndarray], None] | None = None, seq: int = 0) -> int:
    """Decode media rows at ``positions`` of sequence ``seq`` (split by n_batch unless attention is
    non-causal); ``after(positions[s:e])`` runs after each decode, while the context holds its per-row
    outputs. Returns the number of decodes."""
    n = rows.shape[0]
    step = ctx.n_batch()
    if non_causal:
        if n > min(ctx.n_ubatch(), step):
            raise ContextOverflowError(
                f"a media chunk of {n} embeddings must be decoded in one micro-batch (non-causal attention) "
                f"but n_ubatch={ctx.n_ubatch()}: raise n_batch and n_ubatch")
        step = n
    causal0 = ctx.causal_attn()
    if non_causal:
        ctx.set_causal_attn(False)
    try:
        for s in range(0, n, step):
            batch.clear()
            for j in range(s, min(n, s + step)):
                p = int(positions[j, 0]) if positions.shape[1] == 1 else [int(v) for v in positions[j]]
                batch.add_embd(rows[j], seq, p, output=output_last and j == n - 1)
            ctx.process(batch)
            if after is not None:
                after(positions[s:min(n, s + step)])
    finally:
        if non_causal:
            ctx.set_causal_attn(causal0)
    return -(-n // step)


def eval_chunks(mctx: MTMDContext, ctx: LlamaContext, chunks: Chunks, n_past: int = 0) -> int:
    """Evaluate every chunk on sequence 0 of ``ctx`` from ``n_past``; logits of the last entry stay
    available. Returns the new ``n_past`` (the mtmd_helper_eval_chunks equivalent)."""
    items = list(chunks)
    need = max(chunks.n_pos, chunks.n_tokens)  # M-RoPE image rows take a cell each, sharing positions
    if n_past + need > ctx.n_ctx():
        raise ContextOverflowError(f"the prompt needs {need} positions after {n_past}; n_ctx is "
                                   f"{ctx.n_ctx()}: shorten the conversation or raise n_ctx")
    batch = LlamaBatchExtNative(ctx)
    try:
        for k, ch in enumerate(items):
            last = k == len(items) - 1
            if ch.is_media:
                rows = mctx.encode(ch)
                decode_media(ctx, batch, rows, mctx.positions(ch, n_past), mctx.use_non_causal(ch),
                              output_last=last)
            else:
                toks = ch.tokens
                step = ctx.n_batch()
                for s in range(0, len(toks), step):
                    batch.clear()
                    part = toks[s:s + step]
                    for j, t in enumerate(part):
                        batch.add_token(int(t), 0, n_past + s + j,
                                        output=last and s + j == len(toks) - 1)
                    ctx.process(batch)
            n_past += ch.n_pos
    finally:
        batch.close()
    return n_past

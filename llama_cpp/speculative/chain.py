"""llama.cpp's chained draft over several NextN heads (``common_speculative_impl_draft_mtp`` with
``n_layer_nextn > 1``), on sequence 0 of one MTP draft context
(:class:`~llama_cpp.speculative.nextn.NextNDrafter`'s, one per sequence, in the server's slots too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import SpeculativeError


def chain_draft(ctx: Any, raw: Any, toks: list[int], rows: list[np.ndarray], base: int, k: int, n_pend: int,
                n_used: int, confident: Callable[[np.ndarray, int], bool],
                row: Callable[[int], np.ndarray]) -> tuple[list[int], int]:
    """Draft up to ``k`` tokens, step ``i`` on head ``i`` over the whole draft so far; returns the draft
    and how many positions the draft memory holds after it.

    ``toks``/``rows`` (extended in place) start with the ``n_pend`` waiting catch-up pairs at ``base..``,
    then ``(id_last, h_{P-1})``. Each head has its own layer (and KV): step ``i`` removes the draft
    region and decodes ``toks`` at ``base..`` with ``rows`` (``h'_j``, head ``j``'s row at its last
    entry, read with ``row``), writing the pairs into its layer first; the heads up to ``n_used`` that
    the draft did not reach get the pairs alone. The removed cells come back in the same order, so
    every earlier head's layer keeps what it wrote there. ``raw`` is the context's
    :class:`~llama_cpp.speculative.batch.RawExtBatch`; ``confident(logits, best)`` applies
    ``draft_p_min``.
    """
    C = ctx.bindings
    out: list[int] = []
    held = base
    ran = 0

    def drop() -> None:
        if not ctx.seq_rm(0, base, -1):
            raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")

    try:
        for i in range(k):
            drop()
            C.llama_set_nextn_layer_offset(ctx.ptr, i)
            raw.decode(toks, base, "last", rows)
            ran = i + 1
            held = base + len(toks)
            last = len(toks) - 1
            logits = ctx.logits_ith(last)
            best = int(np.argmax(logits))
            if not confident(logits, best):
                break
            out.append(best)
            if len(out) >= k:
                break
            rows.append(row(last))
            toks.append(best)
        if n_pend and ran < n_used:  # the heads this draft did not reach: the pairs alone, in each head's layer
            for head in range(ran, n_used):
                drop()
                C.llama_set_nextn_layer_offset(ctx.ptr, head)
                raw.decode(toks[:n_pend], base, False, rows[:n_pend])
            held = base + n_pend
    finally:
        C.llama_set_nextn_layer_offset(ctx.ptr, 0)  # the default for every other decode
    return out, held


def chain_pairs(ctx: Any, raw: Any, toks: Sequence[int], rows: Sequence[np.ndarray], pos0: int, n_used: int,
                n_batch: int) -> None:
    """Decode catch-up pairs ``(toks, rows)`` at ``pos0..`` into the layers of heads ``0..n_used-1``
    (no outputs): per head, the positions are removed and decoded again under it (llama.cpp's
    ``process``), in ``n_batch`` chunks."""
    C = ctx.bindings
    n = len(toks)
    try:
        for head in range(n_used):
            if not ctx.seq_rm(0, pos0, -1):
                raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
            C.llama_set_nextn_layer_offset(ctx.ptr, head)
            for s in range(0, n, n_batch):
                e = min(n, s + n_batch)
                raw.decode(toks[s:e], pos0 + s, False, rows[s:e])
    finally:
        C.llama_set_nextn_layer_offset(ctx.ptr, 0)


__all__ = ["chain_draft", "chain_pairs"]

"""The server slots' batched drafters: one object drafts for every slot of a step (the table's
``BATCHED`` rows, built by their ``batched`` constructor): :class:`BatchedDraftModel` (``draft-simple``),
one draft context with one sequence per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaBatch, LlamaContext
from .batch import common_prefix, top_k_share
from .draft import load_draft_model
from .engine import share_threadpools

_TOP_K = 10  # llama.cpp's top-k draft sampler (draft_p_min compares the top token's share of these)


class BatchedDraftModel:
    """``draft-simple`` for every slot: one draft context with one sequence per slot.

    Before a step's drafts, each sequence's draft memory is made a prefix of its slot's history
    (a suffix removal, or a fresh start where the memory refuses it); then the missing tokens and
    every slot's pending token are decoded in one batch, and the drafts grow by one greedy token
    per slot and decode until each stops (``draft_n_max``, the step's budget, or the top token's
    share of the top 10 under ``draft_p_min``), as :class:`~llama_cpp.speculative.draft.DraftModel` does
    for one sequence.
    """

    kind = "draft-simple"

    def __init__(self, target_model: Any, target_ctx: Any, path: Any, n_slots: int, *, n_max: int, n_min: int,
                 p_min: float, n_gpu_layers: int = 0) -> None:

        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.model = self.ctx = self._batch = None
        self.model = load_draft_model(target_model, path, n_gpu_layers=n_gpu_layers)
        try:
            tp = target_ctx.params
            self.ctx = LlamaContext(self.model, n_ctx=target_ctx.n_ctx(), n_batch=target_ctx.n_batch(),
                                    n_ubatch=target_ctx.n_ubatch(), n_seq_max=n_slots, kv_unified=True,
                                    n_threads=tp.n_threads, n_threads_batch=tp.n_threads_batch, embeddings=False)
            share_threadpools(target_ctx, self.ctx)
            self.n_batch = self.ctx.n_batch()
            self._batch = LlamaBatch(self.n_batch, 0, 1)
        except BaseException:
            self.close()
            raise
        self.n_vocab_target = int(target_model.n_vocab)
        self._n_vocab_draft = int(self.model.n_vocab)
        self._topk = min(_TOP_K, self._n_vocab_draft)
        self._kv: list[list[int]] = [[] for _ in range(n_slots)]  # tokens in each sequence's draft memory

    def close(self) -> None:
        for name in ("_batch", "ctx", "model"):  # the batch first: it points into the context
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    def _sync(self, seq: int, history: Sequence[int]) -> int:
        kv = self._kv[seq]
        L = common_prefix(kv, history)
        if L < len(kv):
            if L > 0 and self.ctx.seq_rm(seq, L, -1):
                del kv[L:]
            else:
                self.ctx.seq_rm(seq, -1, -1)
                kv.clear()
                L = 0
        return L

    def _decode(self) -> None:
        try:
            self.ctx.decode(self._batch)
        except BaseException:
            # what the draft memory holds is unknown now: every sequence starts over at its next draft
            self.ctx.memory_clear(True)
            for kv in self._kv:
                kv.clear()
            raise

    def draft(self, items: list[tuple[int, list[int], int, int]]) -> list[list[int]]:
        """Drafts for ``(seq, history, id_last, k_max)`` items (distinct sequences), in order."""
        b = self._batch
        vocab_t = self.n_vocab_target
        tails: list[list[int]] = []
        for seq, history, id_last, _ in items:
            L = self._sync(seq, history)
            tails.append([*history[L:], id_last])
        live = [i for i, it in enumerate(items) if it[3] > 0 and min(tails[i]) >= 0
                and max(tails[i]) < self._n_vocab_draft]
        out: list[list[int]] = [[] for _ in items]
        if not live:
            return out
        # catch-up: everything before each pending token, without outputs, in as many batches as it takes
        b.clear()
        for i in live:
            seq = items[i][0]
            body = tails[i][:-1]
            start = 0
            while start < len(body):
                room = self.n_batch - b.n_tokens
                if room == 0:
                    self._decode()
                    b.clear()
                    room = self.n_batch
                chunk = body[start:start + room]
                b.add_sequence(np.asarray(chunk, dtype=np.int32), seq, len(self._kv[seq]), logits=False)
                self._kv[seq].extend(chunk)
                start += len(chunk)
        if b.n_tokens + len(live) > self.n_batch:
            self._decode()
            b.clear()
        step = {i: tails[i][-1] for i in live}
        while step:
            rows: list[tuple[int, int]] = []
            for i, tok in step.items():
                seq = items[i][0]
                first, _ = b.add_sequence(np.asarray([tok], dtype=np.int32), seq, len(self._kv[seq]), logits=True)
                self._kv[seq].append(tok)
                rows.append((i, first))
            self._decode()
            b.clear()
            nxt: dict[int, int] = {}
            for i, row in rows:
                logits = self.ctx.logits_ith(row)
                best = int(np.argmax(logits))
                if self.p_min > 0.0 and top_k_share(logits, best, self._topk) < self.p_min:
                    continue
                if best >= vocab_t:
                    continue  # a token the target does not have (vocabularies may differ in size)
                out[i].append(best)
                if len(out[i]) < min(self.n_max, items[i][3]):
                    nxt[i] = best
            step = nxt
        for i in live:
            if len(out[i]) < self.n_min:
                out[i] = []
        return out


__all__ = ["BatchedDraftModel"]

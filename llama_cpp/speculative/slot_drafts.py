"""The server slots' batched drafters: one object drafts for every slot of a step (the table's
``BATCHED`` rows, built by their ``batched`` constructor).

- :class:`BatchedDraftModel` (``draft-simple``): one draft context with one sequence per slot;
- :class:`BatchedMTP` (``draft-mtp``, one NextN head): one MTP draft context with one sequence per
  slot, fed the target's NextN rows by the slot engine (``reads_nextn``);
- :class:`ChainedSlotsMTP` (``draft-mtp`` on a model with several chained NextN heads): the same
  bookkeeping, with one MTP draft context per slot, each drafting as
  :class:`~llama_cpp.speculative.MTPDecoder` chains heads.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaBatch, LlamaContext
from .._errors import DecodeError, SpeculativeError
from ..llama_batch import LlamaBatchExt
from ..llama_cpp import LLAMA_CONTEXT_TYPE_MTP
from .batch import RawExtBatch, common_prefix, top_k_share
from .chain import chain_draft, chain_pairs
from .draft import load_draft_model
from .engine import share_threadpools, warm_up
from .gguf_nextn import CHAINED_NEXTN_ARCHS, NEXTN_H_ALL_ROWS_ARCHS, NEXTN_H_OUTPUT_ROWS_ARCHS

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
    reads_nextn = False  # drafts from its own model, not from the target's NextN rows

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


class _MTPSeq:
    """One sequence's MTP bookkeeping: the draft memory pairs ``(x_p, h_{p-1})`` of positions ``0..n_c-1``
    (decoded ``< n_valid``, the rest waiting in ``pend_*`` for the next draft batch) and ``h_{n_c-1}``."""

    __slots__ = ("n_c", "n_valid", "n_mem", "pend_tok", "pend_h", "h_last", "_zeros")

    def __init__(self, n_embd: int) -> None:
        self._zeros = np.zeros(n_embd, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        self.n_c = 0  # target positions whose pairs are known
        self.n_valid = 0  # draft memory positions holding the right pairs (one past n_c after a draft)
        self.n_mem = 0  # positions the draft memory holds (draft rows past n_valid are removed lazily)
        self.pend_tok: list[int] = []
        self.pend_h: list[np.ndarray] = []
        self.h_last: np.ndarray | None = self._zeros  # None: comes from re-evaluating position n_c-1

    def commit(self, p: int, tok: int, h: np.ndarray) -> None:
        """Target position ``p`` holds ``tok`` now, with NextN row ``h`` (a row the caller lets us keep)."""
        if p < self.n_c:  # a replayed or re-evaluated row: its pair is known already
            if p == self.n_c - 1 and self.h_last is None:
                self.h_last = h
            return
        if p != self.n_c:
            raise SpeculativeError(f"internal error: MTP pair at position {p}, {self.n_c} known")
        if p >= self.n_valid:
            self.pend_tok.append(int(tok))
            self.pend_h.append(self.h_last if self.h_last is not None else self._zeros)
        self.h_last = h
        self.n_c += 1

    def h_at(self, k: int) -> np.ndarray | None:
        """``h_{k-1}`` if known."""
        if k == self.n_c:
            return self.h_last
        if self.n_valid <= k < self.n_c:
            return self.pend_h[k - self.n_valid]
        return None


class BatchedMTP:
    """``draft-mtp`` (one NextN head) for every slot: one MTP draft context with one sequence per slot.

    The slot engine's target context returns the NextN row of every decoded entry
    (``llama_set_embeddings_nextn(target, True, False)``); :meth:`commit_rows` pairs each kept token
    ``x_p`` with ``h_{p-1}``. A step's drafts decode, in ONE batch for all drafting slots, each slot's
    waiting pairs and ``(id_last, h_{P-1})`` at ``P`` (the catch-up rides in the first draft batch, as in
    :class:`~llama_cpp.speculative.MTPDecoder`), then one batch per further drafted position with
    ``(d_j, h'_j)`` (the head's own row), greedy on the NextN head, until ``draft_n_max``, the slot's
    budget or ``draft_p_min``. Draft rows past ``P`` are removed before the slot's next draft.
    """

    kind = "draft-mtp"
    reads_nextn = True  # the slot engine hands it the target's NextN rows (commit_rows, reuse, restart)

    def __init__(self, model: Any, target_ctx: Any, n_slots: int, *, n_max: int, n_min: int, p_min: float) -> None:

        if getattr(model, "load_mtp", None) is not True or model.n_layer_nextn() <= 0:
            raise SpeculativeError("draft-mtp in slots needs the model loaded with its NextN (MTP) layers: "
                                   "Llama(path, load_mtp=True, n_seq_max=n_slots)")
        if model.n_layer_nextn() > 1:
            raise SpeculativeError(f"this model has {model.n_layer_nextn()} chained NextN heads, which the slot "
                                   "engine does not run: serve it one request at a time")
        C = model.bindings
        self.bindings = C
        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.n_embd = int(model.n_embd_out())
        self.n_vocab = int(model.n_vocab)
        self._topk = min(_TOP_K, self.n_vocab)
        self._target = target_ctx
        self.ctx = self._batch = None
        tp = target_ctx.params
        self.ctx = LlamaContext(model, ctx_other=target_ctx, ctx_type=LLAMA_CONTEXT_TYPE_MTP, n_ctx=target_ctx.n_ctx(),
                                n_batch=target_ctx.n_batch(), n_ubatch=target_ctx.n_ubatch(), n_seq_max=n_slots,
                                n_rs_seq=0, n_outputs_max=n_slots, n_outputs_max_per_seq=1, kv_unified=True,
                                n_threads=tp.n_threads, n_threads_batch=tp.n_threads_batch, embeddings=False)
        try:
            fn = C.__bindings__.functions.get("llama_get_ctx_other")
            if fn is not None and fn.available():
                other = C.llama_get_ctx_other(self.ctx.ptr)
                addr = lambda q: ctypes.cast(q, ctypes.c_void_p).value if q else None  # noqa: E731
                if other is not None and addr(other) == addr(target_ctx.ptr):
                    raise SpeculativeError("this MTP draft context shares the target's memory (gemma4-assistant "
                                           "style heads): not implemented; use a model with its own NextN layers")
            share_threadpools(target_ctx, self.ctx)
            C.llama_set_embeddings_nextn(target_ctx.ptr, True, False)  # h for every decoded entry
            # h for every entry, by batch index: the masked mode copies the FIRST n_outputs rows of the MTP
            # graph's h (all entries), which is the output's row only when the output comes first, not
            # when a slot's catch-up pairs precede its (id_last, h) entry in the draft batch
            C.llama_set_embeddings_nextn(self.ctx.ptr, True, False)
            self.n_batch = self.ctx.n_batch()
            self._batch = LlamaBatch(self.n_batch, 0, 1)
            self._batch.n_tokens = self.n_batch
            self._struct = self._batch.validated_view(self.ctx, 0, self.n_batch)
            self._rows = np.zeros((self.n_batch, self.n_embd), dtype=np.float32)
            self._struct.embd = self._rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            self._n = 0
            self._seqs = [_MTPSeq(self.n_embd) for _ in range(n_slots)]
            self._tok_of = self._batch.token_arr
            warm_up(model, self.ctx, self._warm)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._struct = None
        for name in ("_batch", "ctx"):  # the batch first: it points into the context
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    def _warm(self, toks: list[int]) -> None:
        self._n = 0
        self._add(0, toks, 0, self._rows[:0], True)
        self._rows[:len(toks)] = 0.0
        self._decode()

    # -- the batch -----------------------------------------------------------------------------
    def _add(self, seq: int, toks: Sequence[int], pos0: int, rows: Any, out_last: bool) -> int:
        """Entries ``toks`` of ``seq`` at ``pos0..`` with hidden ``rows`` (set by the caller when empty);
        the index of the last."""
        b, n, m = self._batch, self._n, len(toks)
        b.token_arr[n:n + m] = toks
        b.pos[n:n + m] = np.arange(pos0, pos0 + m)
        b.seq_ids[n:n + m, 0] = seq
        b.n_seq_id[n:n + m] = 1
        b.logits[n:n + m] = 0
        if out_last:
            b.logits[n + m - 1] = 1
        if len(rows):
            self._rows[n:n + m] = rows
        self._n = n + m
        return n + m - 1

    def _decode(self) -> None:
        self._struct.n_tokens = self._n
        rc = int(self.bindings.llama_decode(self.ctx.ptr, self._struct))
        self._n = 0
        if rc != 0:
            # what the draft memory holds is unknown now: every sequence starts its pairs over
            self.ctx.memory_clear(True)
            for st in self._seqs:
                st.n_valid = st.n_mem = 0
            raise DecodeError(f"llama_decode returned {rc} on the MTP draft batch")

    def _flush(self, seq: int) -> None:
        """Decode ``seq``'s waiting pairs on their own (too many for one batch with the others)."""
        st = self._seqs[seq]
        while st.pend_tok:
            m = min(self.n_batch, len(st.pend_tok))
            self._add(seq, st.pend_tok[:m], st.n_valid, np.asarray(st.pend_h[:m]), False)
            self._decode()
            del st.pend_tok[:m], st.pend_h[:m]
            st.n_valid += m
            st.n_mem = st.n_valid

    def _forget(self, seq: int) -> None:
        """Empty ``seq``'s draft memory."""
        self.ctx.seq_rm(seq, -1, -1)

    # -- the slot engine's side ----------------------------------------------------------------
    def reuse(self, seq: int, keep: int) -> int:
        """How much of a cached prefix of ``keep`` tokens the target may keep for MTP: ``keep`` when
        ``h_{keep-1}`` is known, else one less (that token is decoded again for its row)."""
        st = self._seqs[seq]
        keep = min(keep, st.n_c)
        if keep <= 0:
            return 0
        return keep if st.h_at(keep) is not None else keep - 1

    def restart(self, seq: int, keep: int) -> None:
        """A new request on ``seq`` whose target memory holds its first ``keep`` tokens (see :meth:`reuse`)."""
        st = self._seqs[seq]
        h = st.h_at(keep) if 0 < keep <= st.n_c else None
        if keep <= 0:
            self._forget(seq)
            st.reset()
            return
        if h is not None:
            if keep >= st.n_valid:
                del st.pend_tok[keep - st.n_valid:], st.pend_h[keep - st.n_valid:]
            else:
                st.pend_tok, st.pend_h = [], []
            st.n_valid = min(st.n_valid, keep)
            st.n_c, st.h_last = keep, h
        elif keep < st.n_valid:  # position keep is decoded again: its pair is in the draft memory
            st.pend_tok, st.pend_h = [], []
            st.n_valid = st.n_c = keep + 1
            st.h_last = None
        else:
            raise SpeculativeError(f"internal error: no MTP row for the cached prefix of {keep} tokens")

    def commit_rows(self, seq: int, pos0: int, toks: Sequence[int], rows: np.ndarray) -> None:
        """Kept target positions ``pos0..`` of ``seq`` (tokens ``toks``, NextN rows ``rows``, copied here)."""
        if not len(toks):
            return
        rows = np.array(rows, dtype=np.float32)
        st = self._seqs[seq]
        for j, t in enumerate(toks):
            st.commit(pos0 + j, t, rows[j])

    def target_rows(self, n: int) -> np.ndarray:
        """A view of the NextN rows of the target's last decode (``n`` entries, in batch order)."""
        ptr = self.bindings.llama_get_embeddings_nextn(self._target.ptr)
        if not ptr:
            raise SpeculativeError("the target context returned no NextN hidden states")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))

    def draft(self, items: list[tuple[int, list[int], int, int]]) -> list[list[int]]:
        """Drafts for ``(seq, history, id_last, k_max)`` items (distinct sequences), in order."""
        out: list[list[int]] = [[] for _ in items]
        live = [i for i, it in enumerate(items) if min(it[3], self.n_max) >= max(self.n_min, 1)]
        if not live:
            return out
        for i in live:
            seq, hist = items[i][0], items[i][1]
            st = self._seqs[seq]
            if st.n_c != len(hist) or st.n_valid + len(st.pend_tok) != st.n_c:
                raise SpeculativeError(f"internal error: MTP pairs of sequence {seq} cover {st.n_c} of {len(hist)} "
                                       "positions")
            if st.n_mem > st.n_valid:
                if not self.ctx.seq_rm(seq, st.n_valid, -1):
                    raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                st.n_mem = st.n_valid
        if sum(len(self._seqs[items[i][0]].pend_tok) + 1 for i in live) > self.n_batch:
            for i in live:
                self._flush(items[i][0])
        step: list[tuple[int, int]] = []  # (item, its output entry), in batch order
        self._n = 0
        for i in live:
            seq, _, id_last, _ = items[i]
            st = self._seqs[seq]
            toks, hs = [*st.pend_tok, id_last], [*st.pend_h, st.h_last]
            step.append((i, self._add(seq, toks, st.n_valid, np.asarray(hs), True)))
            st.pend_tok, st.pend_h = [], []
            st.n_valid = st.n_mem = st.n_c + 1
        C, ctx = self.bindings, self.ctx.ptr
        while step:
            n_tok = self._n
            self._decode()
            # every output's logits (rows in batch order) and every entry's h, read once for all slots
            logits = np.ctypeslib.as_array(C.llama_get_logits(ctx), shape=(len(step), self.n_vocab))
            best = logits.argmax(axis=1).tolist()
            go: list[tuple[int, int]] = []
            for j, (i, row) in enumerate(step):
                if self.p_min > 0.0 and top_k_share(logits[j], best[j], self._topk) < self.p_min:
                    continue
                out[i].append(best[j])
                if len(out[i]) < min(self.n_max, items[i][3]):
                    go.append((i, row))
            if not go:
                break
            ptr = C.llama_get_embeddings_nextn(ctx)
            if not ptr:
                raise SpeculativeError("the MTP draft context returned no hidden states")
            h = np.ctypeslib.as_array(ptr, shape=(n_tok, self.n_embd))[[row for _, row in go]]
            step = []
            for (i, _), hr in zip(go, h):
                st = self._seqs[items[i][0]]
                step.append((i, self._add(items[i][0], [out[i][-1]], st.n_mem, hr[None, :], True)))
                st.n_mem += 1
        for i in live:
            if len(out[i]) < self.n_min:
                out[i] = []
        return out


class ChainedSlotsMTP(BatchedMTP):
    """``draft-mtp`` with several chained NextN heads for every slot: one MTP draft context per slot
    (one sequence each), with :class:`BatchedMTP`'s pairs bookkeeping (:meth:`commit_rows`,
    :meth:`reuse`, :meth:`restart`).

    A slot's draft is llama.cpp's chained one, as in :class:`~llama_cpp.speculative.MTPDecoder`: step
    ``i`` selects head ``i``, removes the draft region and decodes the waiting pairs, ``(id_last,
    h_{P-1})`` and the draft so far with the head rows ``h'_j``; the heads a draft does not reach get
    the waiting pairs alone. Each head writes its own layer's KV into cells that come back in the same
    order after the removal, which holds within one sequence of its own context (cells freed by one
    slot could go to another in a shared one). ``n_max`` is ``draft_n_max`` capped at the heads.
    """

    def __init__(self, model: Any, target_ctx: Any, n_slots: int, *, n_max: int, n_min: int, p_min: float) -> None:

        self._ctxs: list[Any] = []
        self._bexts: list[Any] = []
        self._raws: list[Any] = []
        if getattr(model, "load_mtp", None) is not True or model.n_layer_nextn() <= 1:
            raise SpeculativeError("ChainedSlotsMTP runs models loaded with several NextN heads "
                                   "(Llama(path, load_mtp=True)); one head is BatchedMTP's")
        arch = model.metadata.get("general.architecture")
        self.n_heads = int(model.n_layer_nextn())
        if arch not in CHAINED_NEXTN_ARCHS:
            raise SpeculativeError(f"llama.cpp's {arch!r} MTP graph runs one NextN head; this model has {self.n_heads}")
        C = model.bindings
        if not C.__bindings__.functions["llama_set_nextn_layer_offset"].available():
            raise SpeculativeError("this llama.cpp build does not export llama_set_nextn_layer_offset, which "
                                   f"chaining {self.n_heads} NextN heads needs: use a build from the pinned source")
        self.bindings = C
        self.n_max, self.n_min, self.p_min = min(int(n_max), self.n_heads), int(n_min), float(p_min)
        self._n_used = self.n_max  # the heads a draft can reach: only their layers need the history's pairs
        self.n_embd = int(model.n_embd_out())
        self.n_vocab = int(model.n_vocab)
        self._topk = min(_TOP_K, self.n_vocab)
        self._target = target_ctx
        unmasked = arch in NEXTN_H_ALL_ROWS_ARCHS
        self._h_last_exact = unmasked or arch in NEXTN_H_OUTPUT_ROWS_ARCHS
        tp = target_ctx.params
        try:
            C.llama_set_embeddings_nextn(target_ctx.ptr, True, False)  # h for every decoded entry
            for _ in range(n_slots):
                ctx = LlamaContext(model, ctx_other=target_ctx, ctx_type=LLAMA_CONTEXT_TYPE_MTP,
                                   n_ctx=max(1, target_ctx.n_ctx() // n_slots), n_batch=target_ctx.n_batch(),
                                   n_ubatch=target_ctx.n_ubatch(), n_seq_max=1, n_rs_seq=0, n_outputs_max=1,
                                   n_outputs_max_per_seq=1, n_threads=tp.n_threads,
                                   n_threads_batch=tp.n_threads_batch, embeddings=False)
                self._ctxs.append(ctx)
                share_threadpools(target_ctx, ctx)
                C.llama_set_embeddings_nextn(ctx.ptr, True, not unmasked)
                self._bexts.append(LlamaBatchExt(ctx))
                self._raws.append(RawExtBatch(self._bexts[-1], ctx, self.n_embd))
                zeros = np.zeros((2, self.n_embd), dtype=np.float32)
                raw = self._raws[-1]
                warm_up(model, ctx, lambda toks, raw=raw: raw.decode(toks, 0, "last", zeros[:len(toks)]))
            self.n_batch = int(target_ctx.n_batch())
            self._n_ubatch = int(target_ctx.n_ubatch())
            self._seqs = [_MTPSeq(self.n_embd) for _ in range(n_slots)]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for b in self._bexts:  # the batches first: they point into their contexts
            b.close()
        for ctx in self._ctxs:
            ctx.close()
        self._bexts, self._ctxs, self._raws = [], [], []

    def _forget(self, seq: int) -> None:
        self._ctxs[seq].seq_rm(0, -1, -1)

    def _row(self, ctx: Any, i: int) -> np.ndarray:
        ptr = self.bindings.llama_get_embeddings_nextn_ith(ctx.ptr, int(i))
        if not ptr:
            raise SpeculativeError(f"the MTP draft context returned no hidden state for output {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def _confident(self, logits: np.ndarray, best: int) -> bool:
        return self.p_min <= 0.0 or top_k_share(logits, best, self._topk) >= self.p_min

    def _flush(self, seq: int) -> None:
        """Decode ``seq``'s waiting pairs on their own, in every head's layer."""
        st, ctx, raw = self._seqs[seq], self._ctxs[seq], self._raws[seq]
        toks, rows, base = st.pend_tok, st.pend_h, st.n_valid
        chain_pairs(ctx, raw, toks, rows, base, self._n_used, self.n_batch)
        st.n_valid = st.n_mem = base + len(toks)
        st.pend_tok, st.pend_h = [], []

    def draft(self, items: list[tuple[int, list[int], int, int]]) -> list[list[int]]:
        """Drafts for ``(seq, history, id_last, k_max)`` items (distinct sequences), in order, slot by slot."""
        out: list[list[int]] = [[] for _ in items]
        for i, (seq, hist, id_last, k_max) in enumerate(items):
            k = min(k_max, self.n_max)
            if k < max(self.n_min, 1):
                continue
            st = self._seqs[seq]
            if st.n_c != len(hist) or st.n_valid + len(st.pend_tok) != st.n_c:
                raise SpeculativeError(f"internal error: MTP pairs of sequence {seq} cover {st.n_c} of {len(hist)} "
                                       "positions")
            d = self._chain(seq, int(id_last), k)
            out[i] = d if len(d) >= self.n_min else []
        return out

    def _chain(self, seq: int, id_last: int, k: int) -> list[int]:
        st, ctx, raw = self._seqs[seq], self._ctxs[seq], self._raws[seq]
        P = st.n_c
        if st.pend_tok and (len(st.pend_tok) + k > self._n_ubatch or (k > 1 and not self._h_last_exact)):
            self._flush(seq)
        base, n_pend = st.n_valid, len(st.pend_tok)
        toks, rows = [*st.pend_tok, id_last], [*st.pend_h, st.h_last]
        st.pend_tok, st.pend_h = [], []
        try:
            out, st.n_mem = chain_draft(ctx, raw, toks, rows, base, k, n_pend, self._n_used, self._confident,
                                        lambda i: self._row(ctx, i))
        except BaseException:
            # what the draft memory holds is unknown now: the slot's pairs start over
            ctx.seq_rm(0, -1, -1)
            st.n_valid = st.n_mem = 0
            raise
        st.n_valid = P  # the pairs below P are in every head's layer; (id_last, h) is decoded again next time
        return out


__all__ = ["BatchedDraftModel", "BatchedMTP", "ChainedSlotsMTP"]

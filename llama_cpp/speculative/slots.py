"""Speculative decoding inside the server's slot engine: one draft per slot, one target decode for all.

Per step, every generating slot proposes a draft from its own history (the n-gram types, upstream's
prompt lookup, ``draft-simple`` over ONE draft context holding one sequence per slot, or ``draft-mtp``
over ONE MTP draft context holding one sequence per slot: each drafted position is one draft decode
for all drafting slots). The slot engine then decodes every slot's ``[pending, d_0..d_{k-1}]`` rows
in its one ``llama_decode`` (all rows outputs), picks at each row with the slot's own sampler and
grammar until the first pick that differs from the draft (*sample and match*: the output is the
plain slot's, greedy or seeded) and removes the rejected rows from that slot's sequence
(``llama_memory_seq_rm``).

A recurrent or hybrid target cannot drop the last positions of a recurrent state (its context has no
``n_rs_seq`` snapshots here): a drafting slot's recurrent state is saved before the decode
(``llama_state_seq_*`` with ``PARTIAL_ONLY``, per sequence) and restored when a draft token is
rejected; its kept tokens are then decoded again in front of its rows in the next step's batch, so
the rollback costs no decode of its own.

``draft-mtp`` (:class:`BatchedMTP`): the target context returns the NextN row of every decoded entry;
each kept token is paired with the row before it (``(x_p, h_{p-1})``, llama.cpp's MTP input), and the
pairs ride in the slot's next draft batch. ``Llama(load_mtp=True)`` loads the NextN tensors for it.

``draft-eagle3``, ``draft-dflash`` and ``draft-dspark`` (the table's ``PER_SEQUENCE`` rows) keep a
drafter per slot sequence, with its own draft context, built once and kept between that slot's
requests: after each target decode it is told the tokens of its sequence and their first entry in the
batch, so it reads its own layer features (llama.cpp hands per-token outputs out in batch order, also
where a recurrent or hybrid target's micro-batches took the tokens in another order).

What cannot run here (see :func:`slot_unsupported`) is what the table's rows say (``not_in_slots``,
``slot_check``): ``draft-mtp`` on a model with several chained NextN heads. Such models stay on the
serial engine.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import DecodeError, SpeculativeError
from ..llama_cpp import LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import SeqCheckpoint, common_prefix, top_k_share
from .decoder import verify_draft
from .engine import close_drafters, propose, share_threadpools
from .ngram import PromptLookup
from .registry import PER_SEQUENCE, PER_SLOT, DrafterArgs, SpeculativeType, rows_of
from .stats import SpeculativeStats

log = logging.getLogger("llama_cpp.speculative")

_TOP_K = 10  # llama.cpp's top-k draft sampler (draft_p_min compares the top token's share of these)


def slot_unsupported(config: Any, model_path: Any = None) -> str | None:
    """Why ``config`` (a :class:`~llama_cpp.speculative.SpecConfig`) cannot speculate in slots; None if it can:
    its rows' ``not_in_slots``, then (given ``model_path``, the served file) their ``slot_check``."""
    rows = rows_of(config)
    refused = [r for r in rows if r.not_in_slots]
    if refused:
        return f"{', '.join(r.name for r in refused)} {refused[0].not_in_slots}"
    if model_path is not None:
        for r in rows:
            why = r.slot_check(model_path) if r.slot_check is not None else None
            if why is not None:
                return why
    return None


class SlotDrafts:
    """One request's drafters (its own n-gram tables, its slot's per-sequence drafters, in priority
    order), those of them that read the target's rows, and counters."""

    __slots__ = ("drafters", "draft_model", "observers", "stats")

    def __init__(self, drafters: list[Any], draft_model: bool) -> None:
        self.drafters = drafters
        self.draft_model = draft_model
        self.observers = [d for d in drafters if d.observes]
        self.stats = SpeculativeStats()


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
        from .._core.context import LlamaBatch, LlamaContext
        from .draft import load_draft_model

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

    def __init__(self, model: Any, target_ctx: Any, n_slots: int, *, n_max: int, n_min: int, p_min: float) -> None:
        from .._core.context import LlamaBatch, LlamaContext
        from ..llama_cpp import LLAMA_CONTEXT_TYPE_MTP
        from .engine import warm_up

        if getattr(model, "load_mtp", None) is not True or model.n_layer_nextn() <= 0:
            raise SpeculativeError("draft-mtp in slots needs the model loaded with its NextN (MTP) layers: "
                                   "Llama(path, load_mtp=True, n_seq_max=n_slots)")
        if model.n_layer_nextn() > 1:
            raise SpeculativeError(f"this model has {model.n_layer_nextn()} chained NextN heads, which the slot "
                                   "engine does not run: serve it one request at a time")
        C = model._C
        self._C = C
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
        rc = int(self._C.llama_decode(self.ctx.ptr, self._struct))
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
            self.ctx.seq_rm(seq, -1, -1)
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
        ptr = self._C.llama_get_embeddings_nextn(self._target.ptr)
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
        C, ctx = self._C, self.ctx.ptr
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


class SlotSpeculation:
    """The drafting side of speculation in the slot engine (one per served model).

    ``config`` is the model's :class:`~llama_cpp.speculative.SpecConfig` (or None with only
    upstream's ``prompt_lookup`` callable). :meth:`start` gives a request its drafters,
    :meth:`propose` drafts for every generating slot of a step, :meth:`accepted` reports a verify.
    """

    def __init__(self, model: Any, target_ctx: Any, n_slots: int, config: Any = None,
                 prompt_lookup: Any = None) -> None:
        from .config import INHERITED_PARAMS, SpeculativeType

        if config is None and prompt_lookup is None:
            raise SpeculativeError("SlotSpeculation needs a SpecConfig or a prompt_lookup draft callable")
        if config is not None:
            reason = slot_unsupported(config)
            if reason is not None:
                raise SpeculativeError(reason)
        self.config = config
        self.model = model
        self.n_vocab = int(model.n_vocab)
        self.prompt_lookup = prompt_lookup
        self.types: list[str] = [t.value for t in config.types] if config is not None else ["prompt-lookup"]
        self._static: Any = None
        self._dynamic: Any = None
        if config is not None and SpeculativeType.NGRAM_CACHE in config.types:
            from .ngram import load_ngram_cache

            c = config.ngram_cache
            # read once, shared read-only by every slot's drafter
            self._static = load_ngram_cache(c.lookup_cache_static) if c.lookup_cache_static is not None else None
            self._dynamic = load_ngram_cache(c.lookup_cache_dynamic) if c.lookup_cache_dynamic is not None else None
        # the per-sequence rows' drafters (draft-eagle3, draft-dflash, draft-dspark), slot by slot
        self.seq_drafters: list[list[Any]] = [[] for _ in range(n_slots)]
        self.draft_model: BatchedDraftModel | None = None
        self.mtp: BatchedMTP | None = None
        seq_rows = [r for r in rows_of(config) if r.slots == PER_SEQUENCE] if config is not None else []
        if seq_rows:
            tp = target_ctx.params
            inherited = {n: getattr(tp, n) for n in INHERITED_PARAMS if hasattr(tp, n)}
            inherited["n_ctx"] = max(1, target_ctx.n_ctx() // n_slots)  # a slot's share, as its positions are
            try:
                for seq in range(n_slots):
                    args = DrafterArgs(model, config, target_ctx, ctx_params=inherited, seq=seq)
                    for row in seq_rows:
                        self.seq_drafters[seq].append(row.build(args))
                        share_threadpools(target_ctx, self.seq_drafters[seq][-1].ctx)
            except BaseException:
                self.close()
                raise
        try:
            if config is not None and SpeculativeType.DRAFT_SIMPLE in config.types:
                self.draft_model = BatchedDraftModel(model, target_ctx, config.draft_model_path, n_slots,
                                                     n_max=config.draft_n_max, n_min=config.draft_n_min,
                                                     p_min=config.draft_p_min, n_gpu_layers=config.draft_n_gpu_layers)
            if config is not None and SpeculativeType.DRAFT_MTP in config.types:
                self.mtp = BatchedMTP(model, target_ctx, n_slots, n_max=config.draft_n_max,
                                      n_min=config.draft_n_min, p_min=config.draft_p_min)
        except BaseException:
            self.close()
            raise
        self.n_max = max([config.n_max if config is not None else 0]
                         + ([prompt_lookup.num_pred_tokens] if prompt_lookup is not None else []))
        self.stats = SpeculativeStats()  # every request's, since start
        # recurrent state rolls back through one checkpoint per sequence
        self.checkpoints: list[SeqCheckpoint] | None = None
        if model.is_recurrent() or model.is_hybrid():
            self.checkpoints = [SeqCheckpoint(target_ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
                                for seq in range(n_slots)]

    def close(self) -> None:
        for ds in self.seq_drafters:
            close_drafters(ds)
            ds.clear()
        if getattr(self, "draft_model", None) is not None:
            self.draft_model.close()
            self.draft_model = None
        if getattr(self, "mtp", None) is not None:
            self.mtp.close()
            self.mtp = None

    @property
    def observes(self) -> bool:
        """Whether a slot's drafters read the target's per-token rows (see :meth:`observe`)."""
        return any(d.observes for ds in self.seq_drafters for d in ds)

    def observe(self, sd: SlotDrafts, tokens: Sequence[int], pos0: int, first: int) -> None:
        """The target decoded ``tokens`` of ``sd``'s slot at ``pos0..``, batch entries ``first..``."""
        for d in sd.observers:
            d.observe(tokens, pos0, first)

    def _slot_drafters(self, seq: int) -> list[Any]:
        """One request's drafters: upstream's prompt-lookup object first, then every per-slot row (built
        now) and per-sequence row (``seq``'s, kept), in the table's order."""
        cfg = self.config
        out: list[Any] = []
        if self.prompt_lookup is not None:
            out.append(PromptLookup(self.prompt_lookup, self.prompt_lookup.num_pred_tokens))
        if cfg is None:
            return out
        args = DrafterArgs(self.model, cfg, ngram_caches=(self._static, self._dynamic))
        kept = iter(self.seq_drafters[seq])
        for row in rows_of(cfg):
            if row.slots == PER_SEQUENCE:
                out.append(next(kept))
            if row.slots != PER_SLOT or row.build is None:
                continue
            if row.type is SpeculativeType.PROMPT_LOOKUP and self.prompt_lookup is not None:
                continue  # that object drafts for it (first)
            out.append(row.build(args))
        return out

    def start(self, prompt: Sequence[int], seq: int = 0) -> SlotDrafts:
        """A new request's drafters on sequence ``seq``, told its prompt."""
        sd = SlotDrafts(self._slot_drafters(seq), self.draft_model is not None)
        for d in sd.drafters:
            d.begin(prompt)
        return sd

    def propose(self, items: list[tuple[SlotDrafts, int, list[int], int, int]]) -> list[tuple[list[int], Any]]:
        """``(draft, source)`` for each ``(drafts, seq, history, id_last, k_max)``: the first drafter (in
        llama.cpp's priority order) with a non-empty draft; the draft model last, for all its slots at once."""
        out: list[tuple[list[int], Any]] = []
        need_model: list[int] = []
        for i, (sd, _seq, kv, id_last, k_max) in enumerate(items):
            draft, src = propose(sd.drafters, kv, id_last, k_max, self.n_vocab) if k_max > 0 else ([], None)
            out.append((draft, src))
            if not draft and sd.draft_model and k_max > 0:
                need_model.append(i)
        if need_model and self.draft_model is not None:
            drafts = self.draft_model.draft([(items[i][1], items[i][2], items[i][3], items[i][4]) for i in need_model])
            for i, d in zip(need_model, drafts):
                if d:
                    out[i] = (d, self.draft_model)
        if self.mtp is not None:  # the NextN head last (llama.cpp's order), for every slot still without a draft
            need = [i for i, (sd, _seq, _kv, _id, k_max) in enumerate(items) if not out[i][0] and k_max > 0]
            if need:
                drafts = self.mtp.draft([(items[i][1], items[i][2], items[i][3], items[i][4]) for i in need])
                for i, d in zip(need, drafts):
                    if d:
                        out[i] = (d, self.mtp)
        return out

    def accepted(self, sd: SlotDrafts, src: Any, n_drafted: int, n_accepted: int, n_out: int,
                 rollback: str | None = None, replayed: int = 0) -> None:
        """One verify of slot drafts ``sd``: ``n_accepted`` of ``n_drafted`` kept, ``n_out`` tokens emitted;
        ``rollback`` is ``"partial"`` (rows removed) or ``"checkpoint"`` (``replayed`` tokens to decode again)."""
        if src is not None and src is not self.draft_model and src is not self.mtp:
            src.accept(n_accepted)
        kind = getattr(src, "kind", None)
        for st in (sd.stats, self.stats):
            st.steps += 1
            st.generated += n_out
            st._count_draft(n_drafted, n_accepted, kind)
            if self.checkpoints is not None and n_drafted:
                st.checkpoints += 1
            if rollback == "partial":
                st.rollbacks_partial += 1
            elif rollback == "checkpoint":
                st.rollbacks_checkpoint += 1
                st.replayed_tokens += replayed


def verify_rows(pick: Callable[[Any, int], tuple[int, Any]], ctx: Any, first: int, draft: Sequence[int],
                is_eog: Callable[[int], bool]) -> tuple[list[int], list[Any], int]:
    """Pick at rows ``first..first+len(draft)`` until the first pick that is not the draft's (or an
    accepted end of generation): the tokens, copies of their rows (None where not asked) and how many
    drafted tokens they accept."""
    rows: list[Any] = []

    def sample(j: int) -> int:
        tok, row = pick(ctx, first + j)
        rows.append(None if row is None else np.array(row))
        return tok

    toks, n_acc = verify_draft(sample, draft, is_eog)
    return toks, rows, n_acc


def remove_rejected(ctx: Any, seq: int, pos: int) -> None:
    """Drop positions ``pos..`` of ``seq`` (rejected draft rows) from the target memory."""
    if not ctx.seq_rm(seq, pos, -1):
        raise DecodeError(f"the target memory refused to remove the rejected draft rows of sequence {seq} from "
                          f"position {pos}")


__all__ = ["BatchedDraftModel", "BatchedMTP", "PromptLookup", "SlotDrafts", "SlotSpeculation", "remove_rejected",
           "slot_unsupported", "verify_rows"]

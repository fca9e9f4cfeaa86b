"""Speculative decoding inside the server's slot engine: one draft per slot, one target decode for all.

Per step, every generating slot proposes a draft from its own history (the n-gram types, upstream's
prompt lookup, or ``draft-simple`` over ONE draft context holding one sequence per slot, drafted
for all slots together: one draft decode per drafted position). The slot engine then decodes every
slot's ``[pending, d_0..d_{k-1}]`` rows in its one ``llama_decode`` (all rows outputs), picks at each
row with the slot's own sampler and grammar until the first pick that differs from the draft
(*sample and match*: the output is the plain slot's, greedy or seeded) and removes the rejected rows
from that slot's sequence (``llama_memory_seq_rm``).

A recurrent or hybrid target cannot drop the last positions of a recurrent state (its context has no
``n_rs_seq`` snapshots here): a drafting slot's recurrent state is saved before the decode
(``llama_state_seq_*`` with ``PARTIAL_ONLY``, per sequence) and restored when a draft token is
rejected; its kept tokens are then decoded again in front of its rows in the next step's batch, so
the rollback costs no decode of its own.

What cannot run here (see :func:`slot_unsupported`): the types fed the target's hidden states
(``draft-mtp``, ``draft-eagle3``, ``draft-dflash``, ``draft-dspark``): their drafts read per-position
rows of the target (NextN embeddings, extracted layers) that the slot engine does not route per
slot, and ``Llama`` loads NextN tensors only together with its one-sequence decoder. Such models
stay on the serial engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._errors import DecodeError, SpeculativeError
from ._spec_batch import SeqCheckpoint, common_prefix, top_k_share
from ._spec_engine import propose, share_threadpools
from ._spec_stats import SpeculativeStats
from .llama_cpp import LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

log = logging.getLogger("llama_cpp.speculative")

_TOP_K = 10  # llama.cpp's top-k draft sampler (draft_p_min compares the top token's share of these)


def slot_unsupported(config: Any) -> str | None:
    """Why ``config`` (a :class:`~llama_cpp.speculative.SpecConfig`) cannot speculate in slots; None if it can."""
    from .speculative import SpeculativeType

    serial = [t.value for t in config.types if t in (SpeculativeType.DRAFT_MTP, SpeculativeType.DRAFT_EAGLE3,
                                                     SpeculativeType.DRAFT_DFLASH, SpeculativeType.DRAFT_DSPARK)]
    if serial:
        return (f"{', '.join(serial)} drafts from the target's hidden states (NextN or feature rows of every "
                "position, with Llama loading the NextN tensors only for its one-sequence decoder), which the slot "
                "engine does not carry per slot: served one request at a time")
    return None


class PromptLookup:
    """Upstream's ``draft_model`` callable (``LlamaPromptLookupDecoding``) as a slot drafter."""

    kind = "prompt-lookup"

    def __init__(self, fn: Callable[[np.ndarray], Any], n_max: int) -> None:
        self.fn = fn
        self.n_max = int(n_max)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def reset(self) -> None:
        pass

    def accept(self, n_accepted: int) -> None:
        pass

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        out = self.fn(np.asarray([*prompt, id_last], dtype=np.intc))
        return [int(t) for t in np.asarray(out).reshape(-1)[:self.n_max]]


class SlotDrafts:
    """One request's drafters (its own n-gram tables) and counters."""

    __slots__ = ("drafters", "draft_model", "stats")

    def __init__(self, drafters: list[Any], draft_model: bool) -> None:
        self.drafters = drafters
        self.draft_model = draft_model
        self.stats = SpeculativeStats()


class BatchedDraftModel:
    """``draft-simple`` for every slot: one draft context with one sequence per slot.

    Before a step's drafts, each sequence's draft memory is made a prefix of its slot's history
    (a suffix removal, or a fresh start where the memory refuses it); then the missing tokens and
    every slot's pending token are decoded in one batch, and the drafts grow by one greedy token
    per slot and decode until each stops (``draft_n_max``, the step's budget, or the top token's
    share of the top 10 under ``draft_p_min``), as :class:`~llama_cpp._spec_draft.DraftModel` does
    for one sequence.
    """

    kind = "draft-simple"

    def __init__(self, target_model: Any, target_ctx: Any, path: Any, n_slots: int, *, n_max: int, n_min: int,
                 p_min: float, n_gpu_layers: int = 0) -> None:
        from ._internals import LlamaBatch, LlamaContext
        from ._spec_draft import load_draft_model

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


class SlotSpeculation:
    """The drafting side of speculation in the slot engine (one per served model).

    ``config`` is the model's :class:`~llama_cpp.speculative.SpecConfig` (or None with only
    upstream's ``prompt_lookup`` callable). :meth:`start` gives a request its drafters,
    :meth:`propose` drafts for every generating slot of a step, :meth:`accepted` reports a verify.
    """

    def __init__(self, model: Any, target_ctx: Any, n_slots: int, config: Any = None,
                 prompt_lookup: Any = None) -> None:
        from .speculative import SpeculativeType

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
            from ._spec_ngram import load_ngram_cache

            c = config.ngram_cache
            # read once, shared read-only by every slot's drafter
            self._static = load_ngram_cache(c.lookup_cache_static) if c.lookup_cache_static is not None else None
            self._dynamic = load_ngram_cache(c.lookup_cache_dynamic) if c.lookup_cache_dynamic is not None else None
        self.draft_model: BatchedDraftModel | None = None
        if config is not None and SpeculativeType.DRAFT_SIMPLE in config.types:
            self.draft_model = BatchedDraftModel(model, target_ctx, config.draft_model_path, n_slots,
                                                 n_max=config.draft_n_max, n_min=config.draft_n_min,
                                                 p_min=config.draft_p_min, n_gpu_layers=config.draft_n_gpu_layers)
        self.n_max = max([config.n_max if config is not None else 0]
                         + ([prompt_lookup.num_pred_tokens] if prompt_lookup is not None else []))
        self.stats = SpeculativeStats()  # every request's, since start
        # recurrent state rolls back through one checkpoint per sequence
        self.checkpoints: list[SeqCheckpoint] | None = None
        if model.is_recurrent() or model.is_hybrid():
            self.checkpoints = [SeqCheckpoint(target_ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
                                for seq in range(n_slots)]

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None

    def _ngram_drafters(self) -> list[Any]:
        from ._spec_ngram import NgramCache, NgramMap, NgramMod, NgramSimple
        from .speculative import _PRIORITY, SpeculativeType

        cfg = self.config
        out: list[Any] = []
        if self.prompt_lookup is not None:
            out.append(PromptLookup(self.prompt_lookup, self.prompt_lookup.num_pred_tokens))
        if cfg is None:
            return out
        for t in _PRIORITY:
            if t not in cfg.types:
                continue
            if t is SpeculativeType.NGRAM_SIMPLE:
                out.append(NgramSimple(cfg.ngram_simple.size_n, cfg.ngram_simple.size_m))
            elif t in (SpeculativeType.NGRAM_MAP_K, SpeculativeType.NGRAM_MAP_K4V):
                p = cfg.ngram_map_k if t is SpeculativeType.NGRAM_MAP_K else cfg.ngram_map_k4v
                out.append(NgramMap(p.size_n, p.size_m, p.min_hits, key_only=t is SpeculativeType.NGRAM_MAP_K))
            elif t is SpeculativeType.NGRAM_MOD:
                q = cfg.ngram_mod
                out.append(NgramMod(q.n_match, q.n_max, q.n_min))
            elif t is SpeculativeType.NGRAM_CACHE:
                out.append(NgramCache(cfg.ngram_cache.n_draft, static=self._static, dynamic=self._dynamic))
        return out

    def start(self, prompt: Sequence[int]) -> SlotDrafts:
        """A new request's drafters, told its prompt."""
        sd = SlotDrafts(self._ngram_drafters(), self.draft_model is not None)
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
        return out

    def accepted(self, sd: SlotDrafts, src: Any, n_drafted: int, n_accepted: int, n_out: int,
                 rollback: str | None = None, replayed: int = 0) -> None:
        """One verify of slot drafts ``sd``: ``n_accepted`` of ``n_drafted`` kept, ``n_out`` tokens emitted;
        ``rollback`` is ``"partial"`` (rows removed) or ``"checkpoint"`` (``replayed`` tokens to decode again)."""
        if src is not None and src is not self.draft_model:
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
    toks: list[int] = []
    rows: list[Any] = []
    n_acc = 0
    k = len(draft)
    for j in range(k + 1):
        tok, row = pick(ctx, first + j)
        toks.append(tok)
        rows.append(None if row is None else np.array(row))
        if j < k and tok == draft[j]:
            n_acc += 1
            if is_eog(tok):
                break
            continue
        break
    return toks, rows, n_acc


def remove_rejected(ctx: Any, seq: int, pos: int) -> None:
    """Drop positions ``pos..`` of ``seq`` (rejected draft rows) from the target memory."""
    if not ctx.seq_rm(seq, pos, -1):
        raise DecodeError(f"the target memory refused to remove the rejected draft rows of sequence {seq} from "
                          f"position {pos}")


__all__ = ["BatchedDraftModel", "PromptLookup", "SlotDrafts", "SlotSpeculation", "remove_rejected",
           "slot_unsupported", "verify_rows"]

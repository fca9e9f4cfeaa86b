"""``draft-mtp``: :class:`NextNDrafter`, the model's own NextN (MTP) head(s) as a drafter (the
algorithm is described in :mod:`llama_cpp.speculative`).

The drafter owns the MTP draft context (``ctx_other`` = the target) and turns the target's NextN
rows on. Its draft memory holds, at each position ``p``, the pair ``(x_p, h_{p-1})``: the token with
the target's hidden state one position before (``h_{-1}`` = zeros).

- ``observe(tokens, pos0)`` runs after every target decode: it keeps each position's ``h`` row with
  the token it was made for (:class:`~llama_cpp.speculative.features.RowStore`; a history cut back
  within its margin is re-paired without the target, a deeper one decodes the target again).
- ``draft(history, id_last, k)`` decodes the confirmed pairs the draft memory lacks (the catch-up)
  in front of the seed ``(id_last, h_{P-1})``, in one batch where that batch fits (one draft decode a
  step is saved), then ``(d_j, h'_j)`` per drafted token with the head's own row. Positions after
  the seed are never kept: they pair drafted tokens with the head's rows, not the target's.
- Several NextN heads are chained as in llama.cpp (:mod:`llama_cpp.speculative.chain`).
- In the server's slots (``slot=k``) it follows target sequence ``k`` with a draft context of its own,
  kept between that slot's requests: ``begin`` keeps the pairs of the prefix the new prompt shares
  with the slot's last history (the prompt is decoded after it, and observed as any decode).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaContext
from .._core.ownership import float_view
from .._errors import OptionalSymbolMissing, SpeculativeError
from ..llama_batch import LlamaBatchExt
from ..llama_cpp import LLAMA_CONTEXT_TYPE_MTP
from .batch import RawBatch, RawExtBatch, SeqCheckpoint, common_prefix, top_k_share
from .chain import chain_draft, chain_pairs
from .drafter import DrafterBase
from .engine import warm_up
from .features import RowStore
from .gguf_nextn import CHAINED_NEXTN_ARCHS, NEXTN_H_ALL_ROWS_ARCHS, NEXTN_H_OUTPUT_ROWS_ARCHS

log = logging.getLogger("llama_cpp.speculative")

NEXTN_SYMBOLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")
DRAFT_TOP_K = 10  # the draft's confidence is its top token's share of the top 10, as in llama.cpp

#: h rows kept behind the paired boundary, for rewinds without a target re-decode
_ROW_MARGIN = 512
#: the token of a media position in a history (:mod:`llama_cpp.mtmd_chat`'s ``MEDIA_TOKEN``)
_MEDIA = -1


def check_nextn_heads(arch: str | None, n: int, what: str) -> None:
    """Several NextN heads only where llama.cpp's MTP graph can run each of them."""
    if n > 1 and arch not in CHAINED_NEXTN_ARCHS:
        raise SpeculativeError(
            f"{what} declares {n} NextN (MTP) layers, but llama.cpp's {arch!r} MTP graph runs exactly one "
            f"(it would abort the process): several heads are chained only for "
            f"{', '.join(sorted(CHAINED_NEXTN_ARCHS))}; convert the model with one MTP layer or use "
            "another speculative type")


def check_mtp_loaded(model: Any) -> None:
    if getattr(model, "load_mtp", None) is not True:
        raise SpeculativeError(
            "this model was not loaded with its NextN (MTP) layers: load it with "
            "llama_cpp.speculative.load_mtp_model(path) (LlamaModel(path, load_mtp=True)), or use "
            "Llama(path, speculative=SpecConfig(...)) which does so")
    if model.n_layer_nextn() <= 0:
        raise SpeculativeError(
            "this model has no NextN (MTP) layers (llama_model_n_layer_nextn == 0): MTP speculative "
            "decoding needs a model converted with its MTP head; use SpecConfig(spec_type='none')")


def check_nextn(model: Any) -> int:
    """Check ``model`` was loaded with its NextN layers and this build exports the MTP API; returns
    the number of NextN heads."""
    check_mtp_loaded(model)
    C = model.bindings
    missing = [n for n in NEXTN_SYMBOLS if not C.__bindings__.functions[n].available()]
    if missing:
        raise OptionalSymbolMissing(
            f"this llama.cpp build does not export {', '.join(missing)} (the MTP staging API): use a "
            "build from the pinned source")
    n_heads = max(1, int(model.n_layer_nextn()))
    if n_heads > 1:
        check_nextn_heads(model.metadata.get("general.architecture"), n_heads, "this model")
        if not C.__bindings__.functions["llama_set_nextn_layer_offset"].available():
            raise OptionalSymbolMissing(
                "this llama.cpp build does not export llama_set_nextn_layer_offset, which chaining "
                f"{n_heads} NextN heads needs: use a build from the pinned source")
    return n_heads


class NextNDrafter(DrafterBase):
    """The ``draft-mtp`` drafter over sequence 0 of ``target`` (its model loaded with the NextN layers),
    or over server slot ``slot``'s sequence.

    ``ctx_params``: what the draft context inherits from the target's (threads above all; in the slots
    its ``n_ctx``, a slot's share). With
    several heads :attr:`n_max` is ``config.draft_n_max`` capped at :attr:`n_heads` (as llama.cpp
    does), and the catch-up runs once per head a draft can reach (a head beyond ``draft_n_max``
    never drafts, and its layer attends only to its own KV).
    """

    kind = "draft-mtp"
    takes_limit = True
    observes = True

    #: a saved prompt state restored into the target leaves this drafter without its rows (a target
    #: re-decode): the server's slots share no prompt states with it
    uses_saved_prompts = False

    def __init__(self, model: Any, target: Any, config: Any, ctx_params: Mapping[str, Any],
                 slot: int | None = None) -> None:
        self.ctx: Any = None
        self.slot = slot
        self.seq = 0 if slot is None else int(slot)  # the target sequence followed
        self._batch: Any = None
        self._refill: Any = None
        self.n_heads = check_nextn(model)
        C = self.bindings = model.bindings
        self.model, self.target = model, target
        self._chain = self.n_heads > 1
        self.n_max = min(config.draft_n_max, self.n_heads) if self._chain else int(config.draft_n_max)
        self.n_min, self.p_min = int(config.draft_n_min), float(config.draft_p_min)
        # the heads a draft can reach: only their layers need the history's pairs
        self._n_used = min(self.n_heads, self.n_max) if self._chain else 1
        if self.n_max < config.draft_n_max:
            log.info("draft_n_max=%d capped at the model's %d chained NextN heads (as llama.cpp does)",
                     config.draft_n_max, self.n_heads)
        self.n_embd = int(model.n_embd_out())
        try:
            dparams = {k: v for k, v in ctx_params.items() if k not in ("n_rs_seq", "ctx_type", "n_ctx")}
            # one output row per decode (as in llama.cpp's tools): a one-row output buffer
            dparams.update(ctx_type=LLAMA_CONTEXT_TYPE_MTP, n_ctx=int(ctx_params.get("n_ctx") or target.n_ctx()),
                           n_rs_seq=0, n_batch=target.n_batch(), n_ubatch=target.n_ubatch(), n_seq_max=1,
                           n_outputs_max=1, n_outputs_max_per_seq=1)
            self.ctx = LlamaContext(model, ctx_other=target, **dparams)
            if self._mem_shared():
                raise SpeculativeError(
                    "this MTP draft context shares the target's memory (gemma4-assistant style heads run in "
                    "one graph): that mode is not implemented here; use a model with its own NextN layers")
            C.llama_set_embeddings_nextn(target.ptr, True, False)  # h for every decoded position
            # h of every entry where the graph computes it for all (read by batch index), else of the
            # output only; elsewhere a batch's last row is not known to be right: no batch that needs it
            arch = model.metadata.get("general.architecture")
            unmasked = arch in NEXTN_H_ALL_ROWS_ARCHS
            self._h_last_exact = unmasked or arch in NEXTN_H_OUTPUT_ROWS_ARCHS
            C.llama_set_embeddings_nextn(self.ctx.ptr, True, not unmasked)
            self._batch = LlamaBatchExt(self.ctx)
            self._raw = RawExtBatch(self._batch, self.ctx, self.n_embd)
            zeros = np.zeros((2, self.n_embd), dtype=np.float32)
            warm_up(model, self.ctx, lambda toks: self._raw.decode(toks, 0, "last", zeros[:len(toks)]))
        except BaseException:
            self.close()
            raise
        self._n_batch = target.n_batch()
        self._ubatch = self.ctx.n_ubatch()
        self._topk = min(DRAFT_TOP_K, model.n_vocab)
        self._zero = np.zeros((1, self.n_embd), dtype=np.float32)
        self._rows = RowStore(self.n_embd, max(_ROW_MARGIN, self._n_batch))  # h_p, by position
        self.reset()

    def _mem_shared(self) -> bool:
        """llama.cpp's ``is_mem_shared``: the draft context kept the target as its ``ctx_other``."""
        fn = self.bindings.__bindings__.functions.get("llama_get_ctx_other")
        if fn is None or not fn.available():
            return False
        other = self.bindings.llama_get_ctx_other(self.ctx.ptr)
        addr = lambda p: ctypes.cast(p, ctypes.c_void_p).value if p else None  # noqa: E731
        return other is not None and addr(other) == addr(self.target.ptr)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        for name in ("_refill", "_batch"):
            b = getattr(self, name, None)
            if b is not None:
                b.close()
                setattr(self, name, None)
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None

    def reset(self) -> None:
        if self.ctx is not None:
            self.ctx.memory_clear(True)
        self._n_dft = 0  # the confirmed pairs at 0.._n_dft-1 in the draft memory
        self._n_mem = 0  # positions the draft memory holds (the pairs, then a seed and drafted entries)
        self._hist: list[int] = []  # the last draft's history: the pairs below _n_dft were made for it
        self._rows.clear()

    def begin(self, prompt: Sequence[int]) -> None:
        """A prefill ended: the prompt's pairs go into the draft memory now (part of the prefill, as
        llama.cpp's tools do), not in the first draft's batch. In a slot, a new request whose prompt
        is decoded next: only the pairs of the prefix it shares with the slot's last history stay."""
        if self.slot is not None:
            self._n_dft = min(self._n_dft, common_prefix(self._hist, prompt))
            return
        if self.ctx is not None:
            try:
                self.catch_up(prompt)
            except BaseException:
                self.reset()
                raise

    def accept(self, n_accepted: int) -> None:
        pass

    def rewind(self, n_keep: int) -> None:
        # the kept rows need no cut: a target decode at p drops every row from p on, and a restored
        # state (the one change without a decode) reloads the store (:meth:`load`)
        self._n_dft = min(self._n_dft, n_keep)

    # -- the target's side ------------------------------------------------------------------
    def target_rows(self, m: int, first: int = 0) -> np.ndarray:
        """The target's NextN rows of its last decode: ``m`` of them from batch entry ``first`` (a view)."""
        ptr = self.bindings.llama_get_embeddings_nextn(self.target.ptr)
        if not ptr:
            raise SpeculativeError("the target context returned no NextN hidden states")
        return float_view(ptr, (first + m) * self.n_embd).reshape(first + m, self.n_embd)[first:]

    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None:
        """The target just decoded ``tokens`` at ``pos0..``: keep their ``h`` rows. Everything before
        ``pos0`` is confirmed history: a backlog of pairs that would not fit a draft's first batch
        anyway (a long prompt, steps other drafters won) goes into the draft memory now, so the
        store keeps about a batch and its margin, not the whole prompt."""
        if len(tokens) and self.ctx is not None:
            self._rows.put(pos0, self.target_rows(len(tokens), first), tokens)
            if pos0 + 1 < self._n_dft:
                # the history was cut back (rewind() follows the decode): the pairs from pos0 on are
                # not known to hold; only a verify's seed pair, at pos0 itself, always does
                self._n_dft = pos0
            elif pos0 - self._n_dft >= self._ubatch:
                self._catch_up_stored(pos0)

    def _catch_up_stored(self, end: int) -> None:
        """Decode the pairs of positions ``_n_dft .. end-1`` from the store's tokens and rows (what the
        target decoded there), where the store holds them."""
        self._trim(self._n_dft)
        lo = self._n_dft
        st = self._rows
        if lo < end and st.base <= max(lo - 1, 0) and st.base + st.n >= end:
            self._decode_pairs(st.tokens(lo, end), self._h(lo, end), lo)
            st.forget(end)

    def _h(self, lo: int, hi: int) -> np.ndarray:
        """``h_{lo-1} .. h_{hi-2}``: the rows that pair with positions ``lo .. hi-1``."""
        if lo > 0:
            return self._rows.get(lo - 1, hi - 1)
        return np.concatenate([self._zero, self._rows.get(0, hi - 1)]) if hi > 1 else self._zero

    def _ensure_rows(self, hist: Sequence[int], lo: int, hi: int) -> None:
        """Rows for ``hist``'s positions ``lo..hi-1``, decoding the target again where the store lacks them."""
        miss = self._rows.first_miss(hist, lo, hi)
        if miss is None:
            return
        if _MEDIA in hist[miss:hi]:
            raise SpeculativeError("internal error: the NextN drafter lost the hidden rows of a media span")
        tgt, seq = self.target, self.seq
        if not tgt.seq_rm(seq, miss, -1):
            tgt.seq_rm(seq, -1, -1)
            miss = 0
        if self._refill is None:
            self._refill = RawBatch(tgt, seq)
        self._refill.decode(list(hist[miss:hi]), miss, "none", self.observe)

    # -- the draft memory -------------------------------------------------------------------
    def _trim(self, keep: int) -> None:
        """The draft memory keeps positions ``< keep``."""
        if self._n_mem > keep and not self.ctx.seq_rm(0, keep, -1):
            raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
        self._n_mem = min(self._n_mem, keep)
        self._n_dft = min(self._n_dft, keep)

    def _decode_pairs(self, tokens: Sequence[int], rows: np.ndarray, pos0: int) -> None:
        """Feed ``(x_p, h_{p-1})`` pairs at ``pos0..`` to the draft memory (its KV only, no outputs);
        chained heads: into each reachable head's layer."""
        n = len(tokens)
        if self._chain:
            chain_pairs(self.ctx, self._raw, tokens, rows, pos0, self._n_used, self._n_batch)
        else:
            for s in range(0, n, self._n_batch):
                e = min(n, s + self._n_batch)
                self._raw.decode(tokens[s:e], pos0 + s, False, rows[s:e])
        self._n_dft = self._n_mem = pos0 + n

    def catch_up(self, history: Sequence[int]) -> None:
        """Make the draft memory hold the pairs of every position of ``history`` (the target's memory)."""
        P = len(history)
        self._trim(min(self._n_dft, P))
        if self._n_dft < P:
            self._ensure_rows(history, max(self._n_dft - 1, 0), P)
            lo = self._n_dft  # (a re-decode of the target may have caught part of it up)
            if lo < P:
                self._decode_pairs(list(history[lo:P]), self._h(lo, P), lo)

    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        k_max = self.n_max if n_max is None else min(self.n_max, int(n_max))
        if k_max < max(self.n_min, 1) or self.ctx is None:
            return []
        try:
            out = self._draft(prompt, int(id_last), k_max)
        except BaseException:
            self.reset()  # a failed decode leaves the memory unknown: start over next time
            raise
        return out if len(out) >= self.n_min else []

    def _draft(self, prompt: list[int], id_last: int, k_max: int) -> list[int]:
        P = len(prompt)
        if self.slot is not None:
            self._hist = [*prompt, id_last]
        self._trim(min(self._n_dft, P))
        self._ensure_rows(prompt, max(self._n_dft - 1, 0), P)
        keep = self._n_dft  # (after any re-decode of the target, which may catch part of it up)
        n_pend = P - keep
        # the catch-up pairs open the first draft batch (each head's, when chained) unless the batch
        # would not fit one micro-batch, or a draft of several tokens reads the hidden row of that
        # batch's last entry where the graph does not compute it exactly
        over = n_pend + (min(k_max, self.n_heads) if self._chain else 1) > self._ubatch
        if n_pend and (over or (k_max > 1 and not self._h_last_exact)):
            self.catch_up(prompt)
            keep, n_pend = P, 0
        toks = prompt[keep:] + [id_last]
        rows = self._h(keep, P + 1)
        if self._chain:
            out, held = chain_draft(self.ctx, self._raw, toks, list(rows), keep, min(k_max, self.n_heads), n_pend,
                                    self._n_used, self._confident, self._draft_row)
            # every head decodes the seed's position again next time (llama.cpp's process())
            self._n_mem, self._n_dft = held, min(held, P)
            self._rows.forget(P)
            return out
        out: list[int] = []
        raw, ctx, base = self._raw, self.ctx, keep
        while True:
            raw.decode(toks, base, "last", rows)
            last = len(toks) - 1
            self._n_mem = base + len(toks)
            if base == keep:
                self._n_dft = P + 1  # the pairs and the seed (id_last stays in the history)
            logits = ctx.logits_ith(last)
            best = int(logits.argmax())
            if not self._confident(logits, best):
                break
            out.append(best)
            if len(out) >= k_max:
                break
            base, toks, rows = P + len(out), [best], self._draft_row(last)[None, :]
        self._rows.forget(P)
        return out

    def _confident(self, logits: np.ndarray, best: int) -> bool:
        """Whether the draft's top token clears ``draft_p_min`` (its share of the top-k softmax)."""
        return self.p_min <= 0.0 or top_k_share(logits, best, self._topk) >= self.p_min

    def _draft_row(self, i: int) -> np.ndarray:
        ptr = self.bindings.llama_get_embeddings_nextn_ith(self.ctx.ptr, int(i))
        if not ptr:
            raise SpeculativeError(f"the draft context returned no hidden state for output {i}")
        return float_view(ptr, self.n_embd).copy()

    # -- media --------------------------------------------------------------------------------
    def add_media(self, p0: int, n_pos: int, positions: np.ndarray, h: np.ndarray) -> None:
        """The target decoded a media chunk at history positions ``p0 .. p0 + n_pos - 1`` after text it
        decoded since the memories were cleared (``positions``: the chunk's mtmd positions, one row per
        embedding; ``h``: the target's rows of them): mirror the shifted rows into the draft memory,
        after the pairs of the text before the chunk."""
        self._trim(min(self._n_dft, p0))
        self._catch_up_stored(p0)
        if self._n_dft < p0:
            raise SpeculativeError("internal error: the NextN drafter lost the hidden rows before a media chunk")
        n = h.shape[0]
        shifted = np.concatenate([self._h(p0, p0 + 1), h[:-1]])
        b, dft = self._batch, self.ctx
        for s in range(0, n, self._n_batch):
            b.clear()
            for j in range(s, min(n, s + self._n_batch)):
                p = int(positions[j, 0]) if positions.shape[1] == 1 else [int(v) for v in positions[j]]
                b.add_embd(np.ascontiguousarray(shifted[j], dtype=np.float32), 0, p, output=False)
            dft.process(b)
        end = p0 + int(n_pos)
        self._n_dft = self._n_mem = end
        self._rows.put(end - 1, h[-1:], [_MEDIA])  # what the next text position pairs with

    # -- state ----------------------------------------------------------------------------------
    def save(self, history: Sequence[int]) -> tuple[bytes, bytes, int, int]:
        """The draft memory's state after the pairs of ``history`` (the target's memory): (state,
        ``h`` of the last position, positions held, heads whose layers hold them; 0: one head)."""
        self.catch_up(history)
        if history:
            self._ensure_rows(history, len(history) - 1, len(history))
        full = SeqCheckpoint(self.ctx, 0, 0)
        full.save()
        h = self._h(len(history), len(history) + 1)[0]
        return full.data(), h.astype(np.float32).tobytes(), self._n_dft, self._n_used if self._chain else 0

    def load(self, history: Sequence[int], state: bytes, h_last: bytes, n_draft: int, heads: int) -> None:
        """Restore what :meth:`save` returned for ``history``."""
        h = np.frombuffer(h_last, dtype=np.float32)
        if h.shape != (self.n_embd,):
            raise SpeculativeError(f"the state's hidden row has {h.size} floats; this model uses {self.n_embd}")
        if self._chain and 0 < heads < self._n_used:
            raise SpeculativeError(
                f"the state's draft memory holds {heads} of the {self.n_heads} NextN heads (saved by a decoder "
                f"with draft_n_max={heads}); this decoder drafts with {self._n_used}: load it into a decoder "
                f"with draft_n_max <= {heads}, or prefill the tokens instead")
        self.reset()
        if history:
            self.ctx.state_seq_set(state, 0)
            self._rows.put(len(history) - 1, h[None, :], [history[-1]])
        self._n_dft = self._n_mem = min(int(n_draft), len(history))


__all__ = ["DRAFT_TOP_K", "NEXTN_SYMBOLS", "NextNDrafter", "check_mtp_loaded", "check_nextn", "check_nextn_heads"]

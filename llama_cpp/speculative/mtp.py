""":class:`MTPDecoder`: greedy-exact MTP speculative decoding with the model's own NextN head(s)
(the algorithm is described in :mod:`llama_cpp.speculative`).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaContext
from .._errors import ClosedError, ContextOverflowError, OptionalSymbolMissing, SpeculativeError
from ..llama_batch import LlamaBatchExt
from ..llama_cpp import LLAMA_CONTEXT_TYPE_MTP, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import RawExtBatch, SeqCheckpoint, check_snapshot_ubatch, common_prefix
from .chain import chain_draft, chain_pairs
from .config import (
    DRAFT_N_MAX_LIMIT,
    DRAFT_TOP_K,
    INHERITED_PARAMS,
    NEXTN_H_ALL_ROWS_ARCHS,
    NEXTN_H_OUTPUT_ROWS_ARCHS,
    NEXTN_SYMBOLS,
    MTPState,
    SpecConfig,
    log,
)
from .decoder import SpeculativeDecoder
from .drafters import build_drafters
from .engine import (
    checked_prompt,
    close_drafters,
    context_params_of,
    propose,
    share_threadpools,
    tell_drafters,
    warm_up,
)
from .model_files import check_context_params, check_mtp_loaded, check_nextn_heads, target_context_params
from .registry import TypeSpec


class MTPDecoder(SpeculativeDecoder):
    """Greedy-exact MTP speculative decoding over one sequence of one model.

    ``MTPDecoder(model, ctx_params, config)`` creates the target context (``ctx_params`` are
    ``llama_context_params`` fields, as for :class:`~llama_cpp._internals.LlamaContext`) and the
    MTP draft context; pass ``target=`` to adopt a target context created with
    :func:`target_context_params`. Then :meth:`prefill` the token history (the last token is
    kept pending: it opens the first verify batch) and iterate :meth:`generate`.

    A model with several NextN heads (:data:`CHAINED_NEXTN_ARCHS`) has them chained as in
    llama.cpp: draft step ``i`` runs head ``i`` over the whole draft so far, the draft context's
    catch-up runs once per head a draft can reach (llama.cpp's runs it for every head; a head
    beyond ``draft_n_max`` never drafts, and its layer attends only to its own KV), and
    :attr:`draft_n_max` is ``config.draft_n_max`` capped at :attr:`n_heads`. The catch-up pairs
    wait for the next draft and are decoded in its first batch.
    """

    def __init__(self, model: Any, ctx_params: Mapping[str, Any] | None, config: SpecConfig, *,
                 target: Any = None, prompt_lookup: Any = None,
                 wrap: Callable[[TypeSpec, Any, Any], Any] | None = None, draft_model: Any = None) -> None:

        self._target = self._draft = None
        self._drafters: list[Any] = []
        if not isinstance(config, SpecConfig):
            raise SpeculativeError(f"config must be a SpecConfig, got {type(config).__name__}")
        if not config.needs_nextn:
            check_context_params(config, {})  # names an unimplemented type as such
            raise SpeculativeError(f"MTPDecoder runs spec_type 'draft-mtp', got {config.spec_type.value!r}")
        params = context_params_of(ctx_params, target)
        if target is not None:
            # the draft context runs like its target (threads above all: oversubscribed threads
            # spin and make every decode orders of magnitude slower)
            tp = getattr(target, "params", None)
            for name in INHERITED_PARAMS:
                if tp is not None and hasattr(tp, name):
                    params.setdefault(name, getattr(tp, name))
        check_context_params(config, params)
        self.config = config
        self.model = model
        check_mtp_loaded(model)
        n_nextn = model.n_layer_nextn()
        C = model.bindings
        missing = [n for n in NEXTN_SYMBOLS if not C.__bindings__.functions[n].available()]
        if missing:
            raise OptionalSymbolMissing(
                f"this llama.cpp build does not export {', '.join(missing)} (the MTP staging API): use a "
                "build from the pinned source")
        self.bindings = C
        # llama.cpp's modes: one head; several heads chained (draft step i runs head i); heads
        # sharing the target's memory (a separate gemma4-assistant model: refused below)
        self.n_heads = max(1, int(n_nextn))
        self._chain = self.n_heads > 1
        if self._chain:
            check_nextn_heads(model.metadata.get("general.architecture"), self.n_heads, "this model")
            if not C.__bindings__.functions["llama_set_nextn_layer_offset"].available():
                raise OptionalSymbolMissing(
                    "this llama.cpp build does not export llama_set_nextn_layer_offset, which chaining "
                    f"{self.n_heads} NextN heads needs: use a build from the pinned source")
        #: the longest MTP draft: ``config.draft_n_max``, capped at the number of chained heads
        self.draft_n_max = min(config.draft_n_max, self.n_heads) if self._chain else config.draft_n_max
        # the heads a draft can reach: only their layers need the history's pairs
        self._n_used = min(self.n_heads, self.draft_n_max) if self._chain else 1
        if self.draft_n_max < config.draft_n_max:
            log.info("draft_n_max=%d capped at the model's %d chained NextN heads (as llama.cpp does)",
                     config.draft_n_max, self.n_heads)

        owns_target = target is None
        if owns_target:
            target = LlamaContext(model, **target_context_params(config, params))
        elif target.n_seq_max() != 1:
            raise SpeculativeError("the target context must have n_seq_max=1")
        self._owns_target = owns_target
        self._target = target
        try:
            check_snapshot_ubatch(model, target, "the MTP target context")
            dparams = {k: v for k, v in params.items() if k not in ("n_rs_seq", "ctx_type", "n_ctx")}
            # the draft outputs one row per decode (as in llama.cpp's tools): a one-row output
            # buffer instead of n_batch rows
            dparams.update(ctx_type=LLAMA_CONTEXT_TYPE_MTP, n_ctx=target.n_ctx(), n_rs_seq=0,
                           n_batch=target.n_batch(), n_ubatch=target.n_ubatch(), n_seq_max=1,
                           n_outputs_max=1, n_outputs_max_per_seq=1)
            self._draft = LlamaContext(model, ctx_other=target, **dparams)
            if self._mem_shared():
                raise SpeculativeError(
                    "this MTP draft context shares the target's memory (gemma4-assistant style heads run in "
                    "one graph): that mode is not implemented here; use a model with its own NextN layers")
            share_threadpools(target, self._draft)
            C.llama_set_embeddings_nextn(target.ptr, True, False)   # h for every verified position
            # h of every entry where the graph computes it for all (read by batch index), else of the
            # output only; elsewhere a batch's last row is not known to be right: no batch that needs it
            arch = model.metadata.get("general.architecture")
            unmasked = arch in NEXTN_H_ALL_ROWS_ARCHS
            self._h_last_exact = unmasked or arch in NEXTN_H_OUTPUT_ROWS_ARCHS
            C.llama_set_embeddings_nextn(self._draft.ptr, True, not unmasked)
            self._tbatch = LlamaBatchExt(target)
            self._dbatch = LlamaBatchExt(self._draft)
            n_embd = int(model.n_embd_out())
            self._traw = RawExtBatch(self._tbatch, target, n_embd)
            self._ckpt = SeqCheckpoint(target, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            self._draw = RawExtBatch(self._dbatch, self._draft, n_embd)
            # the other types of a combined configuration, asked before the MTP head (llama.cpp's order)
            self._drafters = build_drafters(model, config, target, prompt_lookup, wrap, draft_model)
        except BaseException:
            self.close()
            raise

        self.n_embd = int(model.n_embd_out())
        self.n_ctx = target.n_ctx()
        self.n_batch = target.n_batch()
        self._draft_ubatch = self._draft.n_ubatch()
        if target.n_ubatch() < config.draft_n_max + 1:
            self.close()
            raise SpeculativeError(
                f"the target context's n_ubatch={target.n_ubatch()} cannot hold one verify batch of "
                f"{config.draft_n_max + 1} tokens: raise n_ubatch or lower draft_n_max")
        if model.is_recurrent() or model.is_hybrid():
            # recurrent state rolls back at most n_rs_seq positions (as resolved by llama.cpp)
            self.rollback_capacity = int(C.llama_n_rs_seq(target.ptr))
        else:
            self.rollback_capacity = DRAFT_N_MAX_LIMIT + 1
        self._k_cap = config.draft_n_max
        self._drafted_here = False  # whether this step's draft came from the MTP head
        self._rows: np.ndarray = np.zeros((0, self.n_embd), dtype=np.float32)  # h rows of the last verify
        self._topk = min(DRAFT_TOP_K, model.n_vocab)
        self._ready(warm=True)

    def _warm_up(self) -> None:
        """Warm up the contexts this decoder created (:func:`~llama_cpp.speculative.engine.warm_up`): the
        target when it owns it, the MTP draft context always; a caller's target is left alone."""
        if self._owns_target:
            warm_up(self.model, self._target, lambda toks: self._traw.decode(toks, 0, "last"))
        zeros = np.zeros((2, self.n_embd), dtype=np.float32)
        warm_up(self.model, self._draft, lambda toks: self._draw.decode(toks, 0, "last", zeros[:len(toks)]))

    # -- lifetime ---------------------------------------------------------------------------
    @property
    def draft(self) -> Any:
        return self._draft

    def close(self) -> None:
        """Free the draft context (and the target context if this decoder created it)."""
        close_drafters(getattr(self, "_drafters", []))
        self._drafters = []
        for name in ("_tbatch", "_dbatch"):
            b = getattr(self, name, None)
            if b is not None:
                b.close()
                setattr(self, name, None)
        if self._draft is not None:
            self._draft.close()
            self._draft = None
        if self._target is not None and self._owns_target:
            self._target.close()
        self._target = None

    def _live(self) -> tuple[Any, Any]:
        if self._target is None or self._draft is None:

            raise ClosedError("this MTPDecoder is closed; create a new one")
        return self._target, self._draft

    def _reset_state(self) -> None:
        super()._reset_state()
        self._pending_h = np.zeros(self.n_embd, dtype=np.float32)  # h_{n_past-1}
        self._n_dft = 0                   # positions the draft memory holds (0..n_dft-1)
        # the catch-up pairs (x_p, h_{p-1}) at n_dft.. not yet decoded: the next draft decodes them
        # in its own batch, which saves one draft decode per step (per head when chained)
        self._pend_tok: list[int] = []
        self._pend_rows: list[np.ndarray] = []

    def _clear_memories(self) -> None:
        self._target.memory_clear(True)
        self._draft.memory_clear(True)

    # -- native helpers -----------------------------------------------------------------------
    def _target_rows(self, n: int) -> np.ndarray:
        ptr = self.bindings.llama_get_embeddings_nextn(self._target.ptr)
        if not ptr:
            raise SpeculativeError("the target context returned no NextN hidden states")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    def _mem_shared(self) -> bool:
        """llama.cpp's ``is_mem_shared``: the draft context kept the target as its ``ctx_other``."""
        fn = self.bindings.__bindings__.functions.get("llama_get_ctx_other")
        if fn is None or not fn.available():
            return False
        other = self.bindings.llama_get_ctx_other(self._draft.ptr)
        addr = lambda p: ctypes.cast(p, ctypes.c_void_p).value if p else None  # noqa: E731
        return other is not None and addr(other) == addr(self._target.ptr)

    def _draft_row(self, i: int) -> np.ndarray:
        ptr = self.bindings.llama_get_embeddings_nextn_ith(self._draft.ptr, int(i))
        if not ptr:
            raise SpeculativeError(f"the draft context returned no hidden state for output {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def _decode_target(self, tokens: Sequence[int], pos0: int, outputs: bool) -> np.ndarray:
        """Decode ``tokens`` at ``pos0..`` on the target in one batch; return their h rows."""
        self._traw.decode(tokens, pos0, outputs)
        return self._target_rows(len(tokens))

    def _decode_draft_pairs(self, tokens: Sequence[int], rows: Sequence[np.ndarray], pos0: int) -> None:
        """Feed ``(x_p, h_{p-1})`` pairs to the draft context (its KV only, no outputs).

        Chained heads: once per head, each writing its own layer's KV at ``pos0..`` (llama.cpp's
        ``process``: the positions are removed and decoded again under each head; the cells come
        back in the same order, so every earlier head's layer keeps what it wrote there).
        """
        n = len(tokens)
        if not self._chain:
            for s in range(0, n, self.n_batch):
                e = min(n, s + self.n_batch)
                self._draw.decode(tokens[s:e], pos0 + s, False, rows[s:e])
            self._n_dft = pos0 + n
            return
        chain_pairs(self._draft, self._draw, tokens, rows, pos0, self._n_used, self.n_batch)
        self._n_dft = pos0 + n

    def _flush_pairs(self) -> None:
        """Decode the pending catch-up pairs on their own (every head)."""
        if self._pend_tok:
            toks, rows = self._pend_tok, self._pend_rows
            self._pend_tok, self._pend_rows = [], []
            self._decode_draft_pairs(toks, rows, self._n_dft)

    def _extend(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after the target's memory and catch the draft context up."""
        pos = len(self._kv)
        for s in range(0, len(tokens), self.n_batch):
            chunk = list(tokens[s:s + self.n_batch])
            p0 = pos + s
            rows = self._decode_target(chunk, p0, outputs=False)
            # pair x_p with h_{p-1}; positions the draft memory already holds are skipped
            pair_rows = [self._pending_h] + [rows[j] for j in range(len(chunk) - 1)]
            first = max(self._n_dft - p0, 0)
            if first < len(chunk):
                self._decode_draft_pairs(chunk[first:], pair_rows[first:], p0 + first)
            self._pending_h = rows[-1]
            self._kv.extend(chunk)

    # -- public API ---------------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int]) -> None:
        """Make the sequence ``tokens``: all but the last are evaluated, the last is pending.

        The common prefix with the current history is kept when both memories can drop the rest
        (always for attention-only models; for recurrent/hybrid targets only a pure extension
        or a rollback within ``n_rs_seq``), otherwise both contexts are cleared and re-filled.
        """
        tgt, dft = self._live()
        toks = checked_prompt(self.model, tokens, self.n_ctx)
        t0 = time.perf_counter()
        old_hist = self.history
        if self._dirty:
            tgt.memory_clear(True)
            dft.memory_clear(True)
            self._reset_state()
        self._flush_pairs()
        body = toks[:-1]
        kv = self._kv
        L = common_prefix(kv, body)
        if L < len(kv):
            # h_{L-1} is needed again: re-evaluate token L-1 on the target; the draft keeps < L
            # (its h row pairs with token L in the draft, which already holds position L-1)
            keep = L - 1
            if keep > 0 and self._n_dft >= L and tgt.seq_rm(0, keep, -1):
                if not dft.seq_rm(0, L, -1):
                    raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
                del self._kv[keep:]
                self._n_dft = L
                # never paired: the draft skips position keep, which it holds already
                self._pending_h = np.zeros(self.n_embd, dtype=np.float32)
            else:
                tgt.memory_clear(True)
                dft.memory_clear(True)
                self._reset_state()
        rest = body[len(self._kv):]
        if rest:
            self._extend(rest)
        self._id_last = toks[-1]
        if self._drafters:
            tell_drafters(self._drafters, old_hist, body)
        self.stats.prefill_tokens += len(rest)
        self.stats.t_prefill += time.perf_counter() - t0

    def _confident(self, logits: np.ndarray, best: int) -> bool:
        """Whether the draft's top token clears ``draft_p_min`` (its share of the top-k softmax)."""
        p_min = self.config.draft_p_min
        if p_min <= 0.0:
            return True
        k = self._topk
        top = np.partition(logits, -k)[-k:] if k < logits.shape[0] else logits
        p = 1.0 / float(np.exp(top.astype(np.float64) - float(logits[best])).sum())
        return p >= p_min

    def _propose(self, k_max: int) -> list[int]:
        """Draft up to ``k_max`` tokens from ``(id_last, h_{n_past-1})`` (greedy on the MTP head)."""
        dft = self._draft
        P = len(self._kv)
        n_pend = len(self._pend_tok)
        # the pending pairs open the first draft batch (each head's, when chained) unless the
        # batch would not fit one micro-batch
        over = n_pend + (min(k_max, self.n_heads) if self._chain else 1) > self._draft_ubatch
        # a draft of several tokens reads the hidden row of its first batch's last entry
        if n_pend and (over or (k_max > 1 and not self._h_last_exact)):
            self._flush_pairs()
            n_pend = 0
        if n_pend:
            if self._n_dft + n_pend != P:
                raise SpeculativeError(f"internal error: draft memory holds {self._n_dft} + {n_pend} of {P} positions")
        else:
            if self._n_dft > P and not dft.seq_rm(0, P, -1):
                raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
            self._n_dft = min(self._n_dft, P)
            if self._n_dft < P:
                raise SpeculativeError(f"internal error: draft memory holds {self._n_dft} of {P} positions")
        toks: list[int] = self._pend_tok + [self._id_last]  # type: ignore[list-item]
        rows: list[np.ndarray] = self._pend_rows + [self._pending_h]
        self._pend_tok, self._pend_rows = [], []
        if self._chain:
            return self._propose_chain(P, k_max, toks, rows)
        cfg = self.config
        out: list[int] = []
        raw = self._draw
        base = P - n_pend
        while True:
            raw.decode(toks, base, "last", rows)
            last = len(toks) - 1
            self._n_dft = base + len(toks)
            logits = dft.logits_ith(last)
            best = int(np.argmax(logits))
            if not self._confident(logits, best):
                break
            out.append(best)
            if len(out) >= k_max:
                break
            base, toks, rows = P + len(out), [best], [self._draft_row(last)]
        if len(out) < cfg.draft_n_min:
            out = []
        return out

    def _propose_chain(self, P: int, k_max: int, toks: list[int], rows: list[np.ndarray]) -> list[int]:
        """llama.cpp's chained draft: step ``i`` runs head ``i`` over the whole draft so far.

        Each head has its own layer (and KV), which the catch-up filled only below ``P``: so step
        ``i`` removes the draft region and decodes ``[id_last, d_0 .. d_{i-1}]`` at ``P..`` with
        the hidden rows ``[h_{P-1}, h'_0 .. h'_{i-1}]`` (``h'_j``: head ``j``'s output at its last row).
        ``toks``/``rows`` begin with the pending catch-up pairs (at ``n_dft..P-1``, then
        ``(id_last, h_{P-1})``): each head's batch writes them into its layer first, and the heads
        the draft does not reach get them alone.
        """
        base = self._n_dft
        out, self._n_dft = chain_draft(self._draft, self._draw, toks, rows, base, min(k_max, self.n_heads), P - base,
                                       self._n_used, self._confident, self._draft_row)
        if len(out) < self.config.draft_n_min:
            out = []
        return out

    # -- the verify loop's hooks ------------------------------------------------------------------
    _advance_is_catchup = True

    def _draft_step(self, k_max: int) -> tuple[list[int], Any, str | None]:
        """The other types first (llama.cpp's order); the MTP head drafts (and decodes
        ``(id_last, h_prev)`` at ``P``) only when none of them did."""
        draft: list[int] = []
        src = None
        if self._drafters and k_max > 0:
            draft, src = propose(self._drafters, self._kv, self._id_last, k_max, self.model.n_vocab)  # type: ignore[arg-type]
        k_mtp = min(k_max, self.draft_n_max)
        self._drafted_here = src is None and k_mtp >= max(self.config.draft_n_min, 1)
        if src is None:
            return (self._propose(k_mtp) if self._drafted_here else []), None, "draft-mtp"
        return draft, src, src.kind

    def _verify_decode(self, tokens: list[int], pos0: int) -> None:
        self._rows = self._decode_target(tokens, pos0, outputs=True)

    def _replay(self, tokens: list[int], pos0: int, last_output: bool) -> None:
        if last_output:
            self._traw.decode(tokens, pos0, "last")
            self._rows = self._target_rows(len(tokens))
        else:
            self._rows = self._decode_target(tokens, pos0, outputs=False)

    def _advance(self, pos0: int, id_last: int, out: list[int]) -> None:
        """Also catch the draft memory up: it keeps ``< pos0`` (+ ``pos0`` itself if drafting decoded
        ``(id_last, h_prev)`` there; chained heads decode ``pos0`` again under every head, as
        llama.cpp's ``process()`` does); the accepted pairs wait for the next draft's first batch."""
        P, n_keep, rows, dft = pos0, len(out), self._rows, self._draft
        pair_tok = [id_last] + out[:-1]
        pair_h = [self._pending_h] + [rows[j] for j in range(n_keep - 1)]
        if self._pend_tok:  # the MTP head did not draft: these pairs wait with the earlier ones
            self._pend_tok += pair_tok
            self._pend_rows += pair_h
        else:
            keep_dft = P + 1 if self._drafted_here and not self._chain else P
            if self._n_dft > keep_dft and not dft.seq_rm(0, keep_dft, -1):
                raise SpeculativeError("the MTP draft context could not drop a suffix of its memory")
            self._n_dft = min(self._n_dft, keep_dft)
            first = self._n_dft - P
            self._pend_tok, self._pend_rows = pair_tok[first:], pair_h[first:]
        self._pending_h = rows[n_keep - 1]
        self._kv.extend(pair_tok)
        self._id_last = out[-1]

    # -- state ----------------------------------------------------------------------------------
    def save_state(self) -> MTPState:
        """Snapshot both contexts' sequence state and the decoder's bookkeeping."""
        tgt, dft = self._live()
        if self._dirty:
            raise SpeculativeError("the target context was changed outside the decoder: prefill() first")
        self._flush_pairs()
        states = []
        for ctx in (tgt, dft):
            full = SeqCheckpoint(ctx, 0, 0)
            full.save()
            states.append(full.data())
        return MTPState(target=states[0], draft=states[1], kv_tokens=tuple(self._kv),
                        id_last=self._id_last, pending_h=self._pending_h.astype(np.float32).tobytes(),
                        n_draft_past=self._n_dft, heads=self._n_used if self._chain else 0)

    def load_state(self, state: MTPState) -> None:
        """Restore a snapshot taken by :meth:`save_state` on a decoder of the same model and sizes."""
        tgt, dft = self._live()
        if not isinstance(state, MTPState):
            raise TypeError(f"expected an MTPState, got {type(state).__name__}")
        h = np.frombuffer(state.pending_h, dtype=np.float32)
        if h.shape != (self.n_embd,):
            raise SpeculativeError(f"the state's hidden row has {h.size} floats; this model uses {self.n_embd}")
        if len(state.kv_tokens) >= self.n_ctx:
            raise ContextOverflowError(f"the state holds {len(state.kv_tokens)} tokens; n_ctx is {self.n_ctx}")
        if self._chain and 0 < state.heads < self._n_used:
            raise SpeculativeError(
                f"the state's draft memory holds {state.heads} of the {self.n_heads} NextN heads (saved by a decoder "
                f"with draft_n_max={state.heads}); this decoder drafts with {self._n_used}: load it into a decoder "
                f"with draft_n_max <= {state.heads}, or prefill the tokens instead")
        old_hist = self.history
        tgt.memory_clear(True)
        dft.memory_clear(True)
        self._reset_state()
        if state.kv_tokens:
            tgt.state_seq_set(state.target, 0)
            dft.state_seq_set(state.draft, 0)
        self._kv = list(state.kv_tokens)
        self._id_last = state.id_last
        self._pending_h = h.copy()
        self._n_dft = int(state.n_draft_past)
        if self._drafters:
            tell_drafters(self._drafters, old_hist, self._kv)


# the package's path, as before the split (reprs, pickles): llama_cpp.speculative re-exports them
for _cls in (MTPDecoder,):
    _cls.__module__ = "llama_cpp.speculative"

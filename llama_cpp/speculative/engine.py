"""The decoder for drafters that need nothing from the target but its tokens (:class:`DraftDecoder`)
and what every decoder shares with it: telling drafters the history, asking them in order
(:func:`propose`), warming contexts up, sharing threadpools.

:class:`DraftDecoder` runs the n-gram types, ``draft-simple``, ``draft-eagle3``, ``draft-dflash``,
``draft-dspark``, ``draft-mtp`` (in its :class:`~llama_cpp.speculative.MTPDecoder` subclass), prompt lookup and
upstream's ``LlamaDraftModel`` objects (and any list of them, as llama.cpp's ``common_speculative``
does: the drafters are asked in llama.cpp's priority order and the first non-empty draft is
verified) through the one verify loop of :class:`~llama_cpp.speculative.decoder.SpeculativeDecoder`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import ClosedError, ContextOverflowError, SpeculativeError
from ..llama_cpp import LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import RawBatch, SeqCheckpoint, common_prefix
from .decoder import GREEDY_ROWS_MIN_VOCAB, SpeculativeDecoder, verify_draft
from .drafter import Drafter

log = logging.getLogger("llama_cpp.speculative")

_NO_LIMIT = 1 << 30



def tell_drafters(drafters: Sequence[Drafter], old: Sequence[int], new: Sequence[int]) -> None:
    """The history is now ``new`` (it was ``old``): drafters forget what no longer holds, then
    begin a generation after ``new``."""
    L = common_prefix(old, new)
    if L < len(old):
        for d in drafters:
            d.rewind(L)
    for d in drafters:
        d.begin(new)


def close_drafters(drafters: Sequence[Drafter]) -> None:
    """Free each drafter's native resources (``close``)."""
    for d in drafters:
        d.close()


def share_threadpools(target: Any, ctx: Any) -> bool:
    """Run ``ctx``'s graphs on ``target``'s CPU threadpools (kept alive while ``ctx`` lives).

    Each context's pool polls for work after every graph (ggml's default ``poll`` 50). A draft
    context with a pool of its own therefore computes while the target's workers still spin, and
    the other way round: on a machine with as many cores as threads every barrier then waits for
    a descheduled thread, and a step costs tens of times a plain decode (see "Speculative
    decoding speed" in docs/architecture.md). The contexts never compute at the same time, so one
    set of workers serves both. False (nothing changed) when the target has no pool or the
    thread counts differ.
    """
    tref, dref = getattr(target, "native_ref", None), getattr(ctx, "native_ref", None)
    tp, dp = getattr(target, "params", None), getattr(ctx, "params", None)
    if tref is None or dref is None or tp is None or dp is None:
        return False
    if (tp.n_threads, tp.n_threads_batch) != (dp.n_threads, dp.n_threads_batch):
        return False
    pools = [p for p in tref.parents if p.name == "threadpool" and p.ptr is not None]
    if not pools:
        return False
    for p in pools:
        dref.hold(p)  # released when ctx is freed
    ctx.bindings.llama_attach_threadpool(ctx.ptr, pools[0].ptr, pools[1].ptr if len(pools) > 1 else None)
    return True


def propose(drafters: Sequence[Drafter], kv: list[int], id_last: int, k_max: int,
            n_vocab: int) -> tuple[list[int], Drafter | None]:
    """The first non-empty draft of ``drafters`` (cut to ``k_max`` tokens and to valid ids) and its drafter."""
    for d in drafters:
        toks = d.draft(kv, id_last, k_max) if d.takes_limit else d.draft(kv, id_last)  # type: ignore[call-arg]
        if toks:
            toks = [int(t) for t in toks[:k_max]]
            for j, t in enumerate(toks):
                if not 0 <= t < n_vocab:
                    del toks[j:]
                    break
            if toks:
                return toks, d
    return [], None


def warm_up(model: Any, ctx: Any, decode: Callable[[list[int]], None]) -> None:
    """What llama.cpp's ``common_init_from_params`` does to a context before any tool runs: one
    decode of ``[bos, eos]`` with an output, then a clear memory, a synchronize and a perf reset.

    A context's first decode with outputs costs several plain steps (on the tiny fixtures, 1.3 ms
    against 0.2 ms): paid when a decoder or drafter creates the context rather than in the first
    generation's first step. ``decode(tokens)`` decodes ``tokens`` (of ``model``'s vocabulary) at
    position 0 with the last one an output. Only for contexts the caller created itself.
    """
    n_vocab = int(model.n_vocab)
    toks = [t for t in (model.token_bos(), model.token_eos()) if 0 <= t < n_vocab] or [0]
    decode(toks[:max(1, int(ctx.n_batch()))])
    ctx.memory_clear(True)
    ctx.synchronize()
    ctx.perf_reset()


def context_params_of(ctx_params: Any, target: Any) -> dict[str, Any]:
    """``ctx_params`` (a mapping or None) completed with the sizes of ``target`` (when given): what
    the checks of a decoder over a borrowed target context read."""
    params = dict(ctx_params or {})
    if target is not None:
        params.setdefault("n_ctx", target.n_ctx())
        params.setdefault("n_batch", target.n_batch())
        params.setdefault("n_ubatch", target.n_ubatch())
        params.setdefault("n_seq_max", target.n_seq_max())
    return params


@dataclasses.dataclass(frozen=True)
class DraftState:
    """A snapshot of a :class:`DraftDecoder`: the target's sequence state and the pending token."""

    target: bytes
    kv_tokens: tuple[int, ...]
    id_last: int | None


def checked_prompt(model: Any, tokens: Sequence[int], n_ctx: int) -> list[int]:
    """``tokens`` as ints, checked against the vocabulary and ``n_ctx`` before any decode."""
    toks = [int(t) for t in tokens]
    if not toks:
        raise ValueError("prefill needs at least one token")
    model.check_tokens(toks, "prompt token")
    if len(toks) > n_ctx:
        raise ContextOverflowError(f"{len(toks)} tokens exceed n_ctx={n_ctx}: shorten the input or raise n_ctx")
    return toks


class DraftDecoder(SpeculativeDecoder):
    """Speculative decoding with token-level drafters over one sequence of one target context.

    ``drafters`` are :class:`~llama_cpp.speculative.drafter.Drafter` objects (see
    :mod:`llama_cpp.speculative.ngram`, :mod:`llama_cpp.speculative.draft`, :mod:`llama_cpp.speculative.eagle3`,
    :mod:`llama_cpp.speculative.dflash`); those that ``observe`` see every target decode. The decoder owns them.
    """

    def __init__(self, model: Any, target: Any, config: Any, drafters: Sequence[Any], *,
                 owns_target: bool = False) -> None:
        self._target = None
        self._drafters = list(drafters)
        self._raw = None
        if not self._drafters:
            raise SpeculativeError("no drafter for this speculative configuration")
        if target.n_seq_max() != 1:
            self.close()
            raise SpeculativeError("the target context must have n_seq_max=1")
        self.config = config
        self.model = model
        self._target = target
        self._owns_target = owns_target
        self.bindings = model.bindings
        self._raw = RawBatch(target)
        self._ckpt = SeqCheckpoint(target, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        self.n_ctx = target.n_ctx()
        self.n_batch = target.n_batch()
        self.n_vocab = int(model.n_vocab)
        # one verify batch must fit one micro-batch (a recurrent rollback spans one decode)
        self.n_max = min(max(int(d.n_max) for d in self._drafters), target.n_ubatch() - 1)
        self._k_cap = self.n_max
        if model.is_recurrent() or model.is_hybrid():
            self.rollback_capacity = int(self.bindings.llama_n_rs_seq(target.ptr))
        else:
            self.rollback_capacity = _NO_LIMIT
        # drafters that read the target's per-token outputs (EAGLE3) see every target decode
        observers = [d.observe for d in self._drafters if d.observes]
        self._after = None
        if observers:
            def after(tokens: Sequence[int], pos0: int) -> None:
                for f in observers:
                    f(tokens, pos0)
            self._after = after
        self._ready(warm=owns_target)

    def _warm_up(self) -> None:
        """Warm the fresh target context up (:func:`warm_up`)."""
        warm_up(self.model, self._target, lambda toks: self._raw.decode(toks, 0, "last"))

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Free the drafters' resources (and the target context if this decoder created it)."""
        close_drafters(self._drafters)
        self._drafters = []
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._target is not None and self._owns_target:
            self._target.close()
        self._target = None

    def _live(self) -> Any:
        if self._target is None:

            raise ClosedError("this speculative decoder is closed; create a new one")
        return self._target

    def _clear_memories(self) -> None:
        self._target.memory_clear(True)

    # -- target ---------------------------------------------------------------------------------
    def _decode(self, tokens: Sequence[int], pos0: int, outputs: bool) -> None:
        self._raw.decode(tokens, pos0, "all" if outputs else "none", self._after)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Make the sequence ``tokens``: all but the last are evaluated, the last is pending."""
        tgt = self._live()
        toks = checked_prompt(self.model, tokens, self.n_ctx)
        t0 = time.perf_counter()
        old_hist = self.history
        if self._dirty:
            tgt.memory_clear(True)
            self._kv = []
            self._dirty = False
        body = toks[:-1]
        kv = self._kv
        L = common_prefix(kv, body)
        if L < len(kv):
            if L > 0 and tgt.seq_rm(0, L, -1):
                del kv[L:]
            else:
                tgt.memory_clear(True)
                kv.clear()
        rest = body[len(kv):]
        if rest:
            try:
                self._decode(rest, len(kv), outputs=False)
            except BaseException:
                # the target may hold part of ``rest`` (or a drafter's observer failed after it did):
                # start from a clear memory next time rather than decode over those positions
                self._dirty = True
                raise
            kv.extend(rest)
        self._id_last = toks[-1]
        tell_drafters(self._drafters, old_hist, body)
        self.stats.prefill_tokens += len(rest)
        self.stats.t_prefill += time.perf_counter() - t0

    # -- the verify loop's hooks ------------------------------------------------------------------
    def _draft_step(self, k_max: int) -> tuple[list[int], Any, str | None]:
        if k_max <= 0:
            return [], None, None
        draft, src = propose(self._drafters, self._kv, self._id_last, k_max, self.n_vocab)  # type: ignore[arg-type]
        return draft, src, src.kind if src is not None else None

    def _verify_decode(self, tokens: list[int], pos0: int) -> None:
        self._decode(tokens, pos0, outputs=True)

    def _replay(self, tokens: list[int], pos0: int, last_output: bool) -> None:
        self._raw.decode(tokens, pos0, "last" if last_output else "none", self._after)

    # -- state ----------------------------------------------------------------------------------
    def save_state(self) -> DraftState:
        tgt = self._live()
        if self._dirty:
            raise SpeculativeError("the target context was changed outside the decoder: prefill() first")
        full = SeqCheckpoint(tgt, 0, 0)
        full.save()
        return DraftState(target=full.data(), kv_tokens=tuple(self._kv), id_last=self._id_last)

    def load_state(self, state: DraftState) -> None:
        tgt = self._live()
        if not isinstance(state, DraftState):
            raise TypeError(f"expected a DraftState, got {type(state).__name__}")
        if len(state.kv_tokens) >= self.n_ctx:
            raise ContextOverflowError(f"the state holds {len(state.kv_tokens)} tokens; n_ctx is {self.n_ctx}")
        self.model.check_tokens(list(state.kv_tokens), "state token")
        old = self.history
        tgt.memory_clear(True)
        self._reset_state()
        if state.kv_tokens:
            tgt.state_seq_set(state.target, 0)
        self._kv = list(state.kv_tokens)
        self._id_last = state.id_last
        tell_drafters(self._drafters, old, self._kv)


__all__ = ["GREEDY_ROWS_MIN_VOCAB", "DraftDecoder", "DraftState", "close_drafters", "context_params_of", "propose", "tell_drafters",
           "verify_draft", "warm_up"]

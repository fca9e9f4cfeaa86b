"""The verify loop for drafters that need nothing from the target but its tokens.

:class:`DraftDecoder` runs the n-gram types, ``draft-simple`` and ``draft-eagle3`` (and any list of them, as
llama.cpp's ``common_speculative`` does: the drafters are asked in llama.cpp's priority order
and the first non-empty draft is verified). One step, like ``llama-speculative-simple``:

- ask the drafters for up to ``k`` tokens after the history and the pending token ``id_last``;
- decode ``[id_last, d_0..d_{k-1}]`` on the target as one batch, every row an output;
- draw each emitted token with the caller's target sampler from its row and accept draft token
  ``j`` iff it equals the token drawn at row ``j`` (*sample and match*: the output is exactly
  plain decoding's, greedy or seeded);
- remove the rejected positions from the target's memory, or, where it cannot (recurrent state
  with fewer ``n_rs_seq`` snapshots than the rejected suffix), restore the sequence checkpoint
  taken before the verify and replay the kept tokens.

The decoder offers the interface ``Llama`` drives (``prefill``, ``generate``, ``reset``,
``invalidate``, ``kv_tokens``, ``save_state``/``load_state``, ``close``, ``stats``), the same as
:class:`~llama_cpp.speculative.MTPDecoder`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._errors import ContextOverflowError, SpeculativeError
from ..llama_cpp import LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import GreedyRows, RawBatch, SeqCheckpoint, common_prefix, greedy_chain
from .stats import SpeculativeStats

log = logging.getLogger("llama_cpp.speculative")

_NO_LIMIT = 1 << 30

#: The smallest vocabulary on which a greedy chain's verify rows are picked by one numpy argmax
#: (:class:`~llama_cpp.speculative.batch.GreedyRows`). Numpy's fixed cost, run cold after a decode, is
#: about 12 us a step; ``llama_sampler_sample`` costs 2.3 us a row on 1.8k tokens (the tiny
#: fixtures: per row is cheaper) and 285 us a row on 262k (gemma-3: the argmax takes 40).
GREEDY_ROWS_MIN_VOCAB = 16384


def tell_drafters(drafters: Sequence[Any], old: Sequence[int], new: Sequence[int]) -> None:
    """The history is now ``new`` (it was ``old``): drafters forget what no longer holds, then
    begin a generation after ``new``."""
    L = common_prefix(old, new)
    if L < len(old):
        for d in drafters:
            rewind = getattr(d, "rewind", None)
            if rewind is not None:
                rewind(L)
    for d in drafters:
        d.begin(new)


def close_drafters(drafters: Sequence[Any]) -> None:
    """Free each drafter that holds native resources (``close``); the others have none."""
    for d in drafters:
        close = getattr(d, "close", None)
        if close is not None:
            close()


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
    tref, dref = getattr(target, "_ref", None), getattr(ctx, "_ref", None)
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
    ctx._C.llama_attach_threadpool(ctx.ptr, pools[0].ptr, pools[1].ptr if len(pools) > 1 else None)
    return True


def propose(drafters: Sequence[Any], kv: list[int], id_last: int, k_max: int, n_vocab: int) -> tuple[list[int], Any]:
    """The first non-empty draft of ``drafters`` (cut to ``k_max`` tokens and to valid ids) and its drafter."""
    for d in drafters:
        toks = d.draft(kv, id_last, k_max) if getattr(d, "takes_limit", False) else d.draft(kv, id_last)
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


def verify_draft(sample: Callable[[int], int], draft: Sequence[int],
                 is_eog: Callable[[int], bool]) -> tuple[list[int], int]:
    """The tokens one verify batch yields and how many drafted ones they accept: the sampler picks
    at each row in turn and the walk stops at the first miss (or an accepted end of generation);
    the last token is always the target's own."""
    out: list[int] = []
    n_acc = 0
    k = len(draft)
    for i in range(k + 1):
        t = sample(i)
        out.append(t)
        if i < k and t == draft[i]:
            n_acc += 1
            if is_eog(t):
                break
            continue
        break
    return out, n_acc


class DraftDecoder:
    """Speculative decoding with token-level drafters over one sequence of one target context.

    ``drafters`` are objects with ``n_max``, ``begin(prompt)``, ``draft(prompt, id_last)``,
    ``accept(n_accepted)``, ``reset()`` and optionally ``rewind(n_keep)``, ``close()`` and
    ``observe(tokens, pos0)``, called after every target decode of ``tokens`` at ``pos0..`` (see
    :mod:`llama_cpp.speculative.ngram`, :mod:`llama_cpp.speculative.draft`, :mod:`llama_cpp.speculative.eagle3`).
    The decoder owns them.
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
        self._C = model._C
        self._raw = RawBatch(target)
        self._ckpt = SeqCheckpoint(target, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        self.n_ctx = target.n_ctx()
        self.n_batch = target.n_batch()
        self.n_vocab = int(model.n_vocab)
        # one verify batch must fit one micro-batch (a recurrent rollback spans one decode)
        self.n_max = min(max(int(d.n_max) for d in self._drafters), target.n_ubatch() - 1)
        if model.is_recurrent() or model.is_hybrid():
            self.rollback_capacity = int(self._C.llama_n_rs_seq(target.ptr))
        else:
            self.rollback_capacity = _NO_LIMIT
        # drafters that read the target's per-token outputs (EAGLE3) see every target decode
        observers = [d.observe for d in self._drafters if callable(getattr(d, "observe", None))]
        self._after = None
        if observers:
            def after(tokens: Sequence[int], pos0: int) -> None:
                for f in observers:
                    f(tokens, pos0)
            self._after = after
        self.stats = SpeculativeStats()
        self._eog: dict[int, bool] = {}
        self._reset_state()
        if owns_target:
            try:
                self._warm_up()
            except BaseException:
                self.close()
                raise

    def _warm_up(self) -> None:
        """Warm the fresh target context up (:func:`warm_up`)."""
        warm_up(self.model, self._target, lambda toks: self._raw.decode(toks, 0, "last"))

    # -- lifetime ---------------------------------------------------------------------------
    @property
    def target(self) -> Any:
        return self._target

    @property
    def drafters(self) -> list[Any]:
        return list(self._drafters)

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

    def __enter__(self) -> DraftDecoder:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> Any:
        if self._target is None:
            from .._errors import ClosedError

            raise ClosedError("this speculative decoder is closed; create a new one")
        return self._target

    def _reset_state(self) -> None:
        self._kv: list[int] = []          # tokens in the target memory
        self._id_last: int | None = None  # the pending token, not yet decoded
        self._seen = 0                    # history length the drafters were told about
        self._dirty = False

    def reset(self) -> None:
        """Forget the history (target memory and the drafters' tables)."""
        tgt = self._live()
        tgt.memory_clear(True)
        for d in self._drafters:
            d.reset()
        self._reset_state()

    def invalidate(self) -> None:
        """Someone else decoded into the target context: the next :meth:`prefill` starts over."""
        self._dirty = True

    @property
    def kv_tokens(self) -> list[int]:
        return list(self._kv)

    @property
    def history(self) -> list[int]:
        return self._kv + ([self._id_last] if self._id_last is not None else [])

    @property
    def n_past(self) -> int:
        return len(self._kv)

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

    # -- generation -------------------------------------------------------------------------
    def _is_eog(self, t: int) -> bool:
        """``llama_vocab_is_eog``, remembered per token (asked for every emitted token)."""
        v = self._eog.get(t)
        if v is None:
            v = self._eog[t] = bool(self._C.llama_vocab_is_eog(self.model.vocab, t))
        return v

    def _sample_fn(self, sampler: Any) -> Callable[[int], int]:
        tgt = self._target
        if callable(getattr(sampler, "sample", None)):
            C, chain, ctx_ptr = self._C, sampler.ptr, tgt.ptr
            return lambda i: int(C.llama_sampler_sample(chain, ctx_ptr, i))
        if callable(sampler):
            return lambda i: int(sampler(tgt, i))
        raise TypeError("sampler must be a LlamaSampler or a callable (context, batch_index) -> token")

    def generate(self, sampler: Any, max_tokens: int) -> Iterator[int]:
        """Yield up to ``max_tokens`` tokens; stops after an end-of-generation token (yielded).

        ``sampler`` is the target sampler chain (a ``LlamaSampler``) or a callable
        ``(target_context, batch_index) -> token`` that samples and accepts one token from that
        output row; it is called once per emitted token, in order.
        """
        tgt = self._live()
        if self._id_last is None or self._dirty:
            raise SpeculativeError("call prefill(tokens) before generate(): the decoder has no (valid) history")
        max_tokens = int(max_tokens)
        sample = self._sample_fn(sampler)
        # a greedy chain's picks for the verify rows come from one argmax over them (GreedyRows)
        greedy = None
        if self.n_vocab >= GREEDY_ROWS_MIN_VOCAB and greedy_chain(sampler):
            greedy = GreedyRows(tgt, self.n_vocab)
        accept, chain = self._C.llama_sampler_accept, getattr(sampler, "ptr", None)
        st = self.stats
        is_eog = self._is_eog
        clock = time.perf_counter
        produced = 0
        t_start: float | None = clock()
        try:
            while produced < max_tokens:
                P = len(self._kv)
                room = self.n_ctx - 1 - P
                if room < 0:
                    return
                k_max = min(self.n_max, room, max_tokens - produced - 1)
                t0 = clock()
                draft, src = propose(self._drafters, self._kv, self._id_last, k_max, self.n_vocab) if k_max > 0 else ([], None)
                k = len(draft)
                t1 = clock()
                st.t_draft += t1 - t0

                ckpt = None
                if k > self.rollback_capacity:
                    ckpt = self._ckpt
                    ckpt.save()
                    st.checkpoints += 1
                id_last = self._id_last
                self._decode([id_last] + draft, P, outputs=True)
                st.steps += 1
                picks = greedy.pick(k + 1) if greedy is not None else None
                if picks is None:
                    out, n_acc = verify_draft(sample, draft, is_eog)
                else:
                    out, n_acc = verify_draft(picks.__getitem__, draft, is_eog)
                    for t in out:
                        accept(chain, t)  # as llama_sampler_sample does (the chain counts its tokens)
                t2 = clock()
                st.t_verify += t2 - t1
                st._count_draft(k, n_acc, getattr(src, "kind", None))

                n_keep = len(out)  # the memory keeps [id_last] + out[:-1] at P..P+n_keep-1
                if n_keep < k + 1:
                    if ckpt is not None:
                        ckpt.restore()
                        if not tgt.seq_rm(0, P, -1):
                            raise SpeculativeError("could not clear the verify batch after restoring a checkpoint")
                        st.rollbacks_checkpoint += 1
                        st.replayed_tokens += n_keep
                        if not is_eog(out[-1]) and produced + n_keep < max_tokens:
                            # the replay decodes the token just drawn too, so its row gives the next
                            # token for free (as llama-speculative-simple's re-verified draft does)
                            self._raw.decode([id_last] + out, P, "last", self._after)
                            out.append(sample(-1))
                        else:
                            self._decode([id_last] + out[:-1], P, outputs=False)
                    elif tgt.seq_rm(0, P + n_keep, -1):
                        st.rollbacks_partial += 1
                    else:
                        raise SpeculativeError(
                            f"the target memory refused to roll back {k + 1 - n_keep} positions and no checkpoint "
                            "was taken (n_rs_seq too small for this model)")
                if src is not None:
                    src.accept(n_acc)
                self._kv.append(id_last)
                self._kv.extend(out[:-1])
                self._id_last = out[-1]
                st.t_rollback += clock() - t2

                produced += len(out)
                st.generated += len(out)
                st.t_generate += clock() - t_start
                t_start = None
                yield from out
                t_start = clock()
                if is_eog(out[-1]):
                    return
        except GeneratorExit:
            raise
        except BaseException:
            self._dirty = True
            raise
        finally:
            if t_start is not None:
                st.t_generate += clock() - t_start

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


__all__ = ["DraftDecoder", "DraftState", "close_drafters", "propose", "tell_drafters", "warm_up"]

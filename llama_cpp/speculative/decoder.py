"""The one verify loop: :class:`SpeculativeDecoder`, which every decoder over one target sequence runs
(:class:`~llama_cpp.speculative.engine.DraftDecoder`, its :class:`~llama_cpp.speculative.MTPDecoder` and
their media subclasses).

One step, like ``llama-speculative-simple``:

- ask for up to ``k`` tokens after the history and the pending token ``id_last``
  (:meth:`SpeculativeDecoder._draft_step`: the drafters in priority order, the MTP head among them);
- decode ``[id_last, d_0..d_{k-1}]`` on the target as one batch, every row an output;
- draw each emitted token with the caller's target sampler from its row and accept draft token
  ``j`` iff it equals the token drawn at row ``j`` (:func:`verify_draft`, *sample and match*: the
  output is exactly plain decoding's, greedy or seeded);
- remove the rejected positions from the target's memory, or, where it cannot (recurrent state
  with fewer ``n_rs_seq`` snapshots than the rejected suffix), restore the sequence checkpoint
  taken before the verify and replay the kept tokens;
- :meth:`SpeculativeDecoder._advance` the history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._errors import SpeculativeError
from .batch import GreedyRows, SeqCheckpoint, greedy_chain
from .stats import SpeculativeStats

#: The smallest vocabulary on which a greedy chain's verify rows are picked by one numpy argmax
#: (:class:`~llama_cpp.speculative.batch.GreedyRows`). Numpy's fixed cost, run cold after a decode, is
#: about 12 us a step; ``llama_sampler_sample`` costs 2.3 us a row on 1.8k tokens (the tiny
#: fixtures: per row is cheaper) and 285 us a row on 262k (gemma-3: the argmax takes 40).
GREEDY_ROWS_MIN_VOCAB = 16384


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


def sample_fn(C: Any, target: Any, sampler: Any) -> Callable[[int], int]:
    """``sampler`` (a ``LlamaSampler`` or a callable ``(context, batch_index) -> token``) as a function
    of the target's output row."""
    if callable(getattr(sampler, "sample", None)):
        chain, ctx_ptr = sampler.ptr, target.ptr
        return lambda i: int(C.llama_sampler_sample(chain, ctx_ptr, i))
    if callable(sampler):
        return lambda i: int(sampler(target, i))
    raise TypeError("sampler must be a LlamaSampler or a callable (context, batch_index) -> token")


class SpeculativeDecoder:
    """The verify loop and the history over one sequence (seq 0) of one target context.

    A subclass sets ``model``, ``config``, ``stats``, ``n_ctx``, ``rollback_capacity``, ``bindings``,
    ``_target``, ``_drafters``, ``_ckpt`` (a partial :class:`SeqCheckpoint` of the target) and
    ``_k_cap`` (the longest draft), calls :meth:`_ready` last, and provides :meth:`_draft_step`, :meth:`_verify_decode`,
    :meth:`_replay`, :meth:`_clear_memories`, :meth:`_warm_up` and ``_live``; :meth:`_advance` and
    :meth:`_reset_state` are extended where the subclass keeps more per position.
    """

    model: Any
    config: Any
    stats: SpeculativeStats
    n_ctx: int
    rollback_capacity: int
    bindings: Any
    _target: Any
    _drafters: list[Any]
    _ckpt: SeqCheckpoint
    _k_cap: int
    _eog: dict[int, bool]

    def _ready(self, warm: bool) -> None:
        """A constructor's last step: fresh stats and history, then (``warm``) :meth:`_warm_up`,
        closing the decoder if it fails."""
        self.stats = SpeculativeStats()
        self._eog = {}
        self._reset_state()
        if warm:
            try:
                self._warm_up()
            except BaseException:
                self.close()
                raise

    # -- subclass hooks ------------------------------------------------------------------------
    def _live(self) -> Any:
        raise NotImplementedError

    def _warm_up(self) -> None:
        """Warm up the contexts the decoder created (:func:`~llama_cpp.speculative.engine.warm_up`)."""
        raise NotImplementedError

    def _clear_memories(self) -> None:
        """Clear every memory the decoder holds (the target's and any draft context's)."""
        raise NotImplementedError

    def _draft_step(self, k_max: int) -> tuple[list[int], Any, str | None]:
        """Up to ``k_max`` draft tokens after the history, the drafter that made them (None when the
        decoder drafted itself or nothing drafted) and its kind for the stats."""
        raise NotImplementedError

    def _verify_decode(self, tokens: list[int], pos0: int) -> None:
        """Decode the verify batch ``tokens`` at ``pos0..`` on the target, every row an output."""
        raise NotImplementedError

    def _replay(self, tokens: list[int], pos0: int, last_output: bool) -> None:
        """Decode the kept ``tokens`` again at ``pos0..`` after a checkpoint restore (the last row an
        output when ``last_output``)."""
        raise NotImplementedError

    def _advance(self, pos0: int, id_last: int, out: list[int]) -> None:
        """The target memory now holds ``[id_last] + out[:-1]`` at ``pos0..``; ``out[-1]`` is pending."""
        self._kv.append(id_last)
        self._kv.extend(out[:-1])
        self._id_last = out[-1]

    # -- history -------------------------------------------------------------------------------
    def _reset_state(self) -> None:
        self._kv: list[int] = []          # tokens in the target memory, positions 0..n_past-1
        self._id_last: int | None = None  # the pending token (position n_past), not yet decoded
        self._dirty = False               # the target memory was changed behind our back

    def reset(self) -> None:
        """Forget the history (the memories and the drafters' tables)."""
        self._live()
        self._clear_memories()
        for d in self._drafters:
            d.reset()
        self._reset_state()

    def invalidate(self) -> None:
        """Someone else decoded into the target context: the next :meth:`prefill` starts over."""
        self._dirty = True

    @property
    def target(self) -> Any:
        """The target context; its logits are those of the last verify batch."""
        return self._target

    @property
    def drafters(self) -> list[Any]:
        """The drafters, in priority order."""
        return list(self._drafters)

    @property
    def kv_tokens(self) -> list[int]:
        """The tokens held in the target's memory (the history without the pending token)."""
        return list(self._kv)

    @property
    def history(self) -> list[int]:
        """Every token of the sequence so far: :attr:`kv_tokens` plus the pending last token."""
        return self._kv + ([self._id_last] if self._id_last is not None else [])

    @property
    def n_past(self) -> int:
        return len(self._kv)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> SpeculativeDecoder:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _is_eog(self, t: int) -> bool:
        """``llama_vocab_is_eog``, remembered per token (asked for every emitted token)."""
        v = self._eog.get(t)
        if v is None:
            v = self._eog[t] = bool(self.bindings.llama_vocab_is_eog(self.model.vocab, t))
        return v

    # -- the loop ------------------------------------------------------------------------------
    def generate(self, sampler: Any, max_tokens: int) -> Iterator[int]:
        """Yield up to ``max_tokens`` tokens; stops after an end-of-generation token (yielded).

        ``sampler`` is the target sampler chain (a :class:`~llama_cpp._internals.LlamaSampler`:
        ``llama_sampler_sample`` draws and accepts) or a callable ``(target_context, batch_index)
        -> token`` that samples and accepts one token from that output row. It is called once per
        emitted token, in order. Tokens of one step are yielded after the step's bookkeeping, so
        the history stays consistent however far the caller iterates. Generation also ends when
        the context is full.
        """
        self._live()
        tgt = self._target
        if self._id_last is None or self._dirty:
            raise SpeculativeError("call prefill(tokens) before generate(): the decoder has no (valid) history")
        max_tokens = int(max_tokens)
        sample = sample_fn(self.bindings, tgt, sampler)
        n_vocab = int(self.model.n_vocab)
        # a greedy chain's picks for the verify rows come from one argmax over them (GreedyRows)
        greedy = GreedyRows(tgt, n_vocab) if n_vocab >= GREEDY_ROWS_MIN_VOCAB and greedy_chain(sampler) else None
        accept, chain = self.bindings.llama_sampler_accept, getattr(sampler, "ptr", None)
        st = self.stats
        is_eog = self._is_eog
        clock = time.perf_counter
        produced = 0
        t_start: float | None = clock()  # None while suspended at a yield
        try:
            while produced < max_tokens:
                P = len(self._kv)
                room = self.n_ctx - 1 - P  # the verify batch fills positions P..P+k
                if room < 0:
                    return
                k_max = min(self._k_cap, room, max_tokens - produced - 1)
                t0 = clock()
                draft, src, kind = self._draft_step(k_max)
                k = len(draft)
                t1 = clock()
                st.t_draft += t1 - t0

                ckpt = None
                if k > self.rollback_capacity:
                    ckpt = self._ckpt
                    ckpt.save()
                    st.checkpoints += 1
                id_last: int = self._id_last  # type: ignore[assignment]
                self._verify_decode([id_last] + draft, P)
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
                st.count_draft(k, n_acc, kind)

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
                            self._replay([id_last] + out, P, True)
                            out.append(sample(-1))
                        else:
                            self._replay([id_last] + out[:-1], P, False)
                    elif tgt.seq_rm(0, P + n_keep, -1):
                        st.rollbacks_partial += 1
                    else:
                        raise SpeculativeError(
                            f"the target memory refused to roll back {k + 1 - n_keep} positions and no checkpoint "
                            "was taken (n_rs_seq too small for this model)")
                if src is not None:
                    src.accept(n_acc)
                self._advance(P, id_last, out)
                st.t_rollback += clock() - t2

                produced += len(out)
                st.generated += len(out)
                st.t_generate += clock() - t_start
                t_start = None
                yield from out
                t_start = clock()
                if is_eog(out[-1]):
                    return
        except GeneratorExit:  # the consumer stopped at a yield: the bookkeeping is complete
            raise
        except BaseException:
            self._dirty = True  # failed mid-step: the next prefill starts over
            raise
        finally:
            if t_start is not None:
                st.t_generate += clock() - t_start


__all__ = ["GREEDY_ROWS_MIN_VOCAB", "SpeculativeDecoder", "sample_fn", "verify_draft"]

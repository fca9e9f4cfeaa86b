"""A slot engine's speculative side: each generating slot's draft for a step, and the verify of its
rows (the accept walk is :func:`llama_cpp.speculative.slots.verify_rows`, shared with the serial
decoders), with the rollback of rejected rows, partial or from a checkpoint."""

from __future__ import annotations

import logging
from typing import Any

from ...speculative.slots import DrafterFailed, remove_rejected, verify_rows
from .state import Slot

log = logging.getLogger("llama_cpp.server")


class SlotSpeculating:
    """The methods :class:`~.slots.SlotEngine` speculates with (its ``spec``, ``ctx``, ``cached``,
    ``_active``, ``n_batch``, ``n_ctx_slot``, ``_accept`` and ``_eog``)."""

    spec: Any
    ctx: Any
    cached: list[list[int]]
    _active: list[Slot]
    n_batch: int
    n_ctx_slot: int

    _out: Any

    def _accept(self, s: Slot, tok: int, row: Any) -> None:
        raise NotImplementedError

    def _release(self, s: Slot, active: bool = True, keep_cache: bool = False) -> None:
        raise NotImplementedError

    def _eog(self, tok: int) -> bool:
        raise NotImplementedError

    def _pend_last(self, s: Slot) -> None:
        """The prompt but its last token is in the memory: that token is the slot's pending one."""
        prompt = s.req.prompt_tokens
        s.kv = list(prompt[:-1])
        s.pos = s.end
        s.next_tok = prompt[-1]


    def _drafts(self, active: list[Slot]) -> dict[int, tuple[list[int], Any]]:
        """Each generating slot of ``active`` (this step's)'s draft (by sequence), within the context and
        the batch. A slot whose drafter failed (:class:`~llama_cpp.speculative.slots.DrafterFailed`) ends
        with that error and leaves ``active``; the others go on."""
        # a slot replaying rolled-back tokens drafts again once they are in the memory (a checkpoint is taken
        # before a step's rows, so drafting now would grow the replay with every rejection)
        gen = [s for s in active if s.next_tok is not None and s.spec is not None and not s.replay]
        if not gen:
            return {}
        n_rows = sum(1 + len(s.replay) for s in active if s.next_tok is not None)
        share = (self.n_batch - n_rows) // len(gen)
        items = []
        for s in gen:
            # the last draft row stays inside the slot's context and within max_tokens, as plain decoding stops
            k_max = min(self.spec.n_max, share, self.n_ctx_slot - 1 - s.pos, s.req.max_tokens - s.produced - 1)
            items.append((s.spec, s.seq, s.kv, s.next_tok, max(0, k_max)))
        out: dict[int, tuple[list[int], Any]] = {}
        for s, d in zip(gen, self.spec.propose(items)):
            if isinstance(d, DrafterFailed):
                log.warning("request in slot %d failed: %s", s.seq, d)
                self._out.put(s.job, "error", d)
                self._release(s)
                if s in active:  # (active may be the engine's own list, which _release left already)
                    active.remove(s)
            else:
                out[s.seq] = d
        return out

    def _verify(self, s: Slot, first: int, draft: list[int], src: Any, start: int) -> None:
        """Slot ``s``'s verify rows (from position ``start``: its replayed tokens, its pending token, its
        draft): pick at each draft row until the draft is left, roll the rejected rows back, then hand
        the tokens to :meth:`_accept` one by one, as plain steps would."""
        pos0 = s.pos - 1  # the pending token's position
        toks, rows, n_acc = verify_rows(s.pick, self.ctx, first, draft, self._eog)
        n_keep = len(toks)  # the pending token and the accepted drafts: rows pos0..pos0+n_keep-1 hold
        replay: list[int] = []
        rollback = None
        if n_keep < len(draft) + 1:
            ckpts = self.spec.checkpoints
            if ckpts is None:
                remove_rejected(self.ctx, s.seq, pos0 + n_keep)
                rollback = "partial"
            else:
                # back to the state before this step's rows; the kept ones are decoded again next step
                ckpts[s.seq].restore()
                remove_rejected(self.ctx, s.seq, start)
                replay = s.kv[start:] + toks[:n_keep - 1]
                rollback = "checkpoint"
        self.spec.accepted(s.spec, src, len(draft), n_acc, n_keep, rollback, len(replay))
        for j, tok in enumerate(toks):
            if j:
                s.kv.append(toks[j - 1])  # the accepted draft token at this row is in the memory
                s.pos += 1
                s.next_tok = None
            self._accept(s, tok, rows[j])
            if s.job.done:
                break
        held = start if replay else pos0 + n_keep  # positions the memory holds now
        if not s.job.done:
            s.replay = replay
        elif s.pos < held and not self.ctx.closed:
            # finished before its last accepted rows: they must not outlive the request in the cache
            if not self.ctx.seq_rm(s.seq, s.pos, -1):
                self.ctx.seq_rm(s.seq, -1, -1)
                self.cached[s.seq] = []
        elif s.pos > held:
            self.cached[s.seq] = self.cached[s.seq][:held]


__all__ = ["SlotSpeculating"]

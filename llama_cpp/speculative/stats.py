"""Counters of speculative generation (shared by every speculative decoder)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class SpeculativeStats:
    """Counters of one generation (or several, until :meth:`reset`).

    ``steps`` counts target verify decodes; ``drafted``/``accepted`` count draft tokens;
    ``drafted_at[j]``/``accepted_at[j]`` count them per draft position ``j``, and
    ``drafted_by``/``accepted_by`` per speculative type (several types can be combined). A rollback
    removes
    rejected positions either by partial memory removal (``rollbacks_partial``) or by restoring
    a sequence checkpoint and replaying the accepted tokens (``rollbacks_checkpoint``).
    Times are wall seconds.
    """

    steps: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = dataclasses.field(default_factory=list)
    accepted_at: list[int] = dataclasses.field(default_factory=list)
    drafted_by: dict[str, int] = dataclasses.field(default_factory=dict)
    accepted_by: dict[str, int] = dataclasses.field(default_factory=dict)
    draft_steps: int = 0
    rollbacks_partial: int = 0
    rollbacks_checkpoint: int = 0
    checkpoints: int = 0
    replayed_tokens: int = 0
    prefill_tokens: int = 0
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    #: kept for compatibility: the MTP draft memory's catch-up runs inside the draft (counted in ``t_draft``)
    t_catchup: float = 0.0
    t_rollback: float = 0.0
    t_generate: float = 0.0

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)

    def count_draft(self, n_drafted: int, n_accepted: int, kind: str | None = None) -> None:
        """Count one verified draft: ``n_drafted`` tokens proposed, the first ``n_accepted`` of them
        taken by the target; ``kind`` is the drafter that proposed them (the per-type counts)."""
        if kind is not None and n_drafted:
            self.drafted_by[kind] = self.drafted_by.get(kind, 0) + n_drafted
            self.accepted_by[kind] = self.accepted_by.get(kind, 0) + n_accepted
        d_at, a_at = self.drafted_at, self.accepted_at
        if len(d_at) < n_drafted:
            d_at.extend([0] * (n_drafted - len(d_at)))
            a_at.extend([0] * (n_drafted - len(a_at)))
        for j in range(n_drafted):
            d_at[j] += 1
        for j in range(min(n_accepted, n_drafted)):
            a_at[j] += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        if n_drafted:
            self.draft_steps += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_rate_at(self) -> list[float]:
        """Per draft position ``j``: the share of drafts reaching ``j`` whose token ``j`` was accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def mean_accepted_length(self) -> float:
        """Mean accepted draft tokens per step that drafted."""
        return self.accepted / self.draft_steps if self.draft_steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per target verify decode (1.0 = no gain over plain decoding)."""
        return self.generated / self.steps if self.steps else 0.0

    @property
    def rollbacks(self) -> int:
        return self.rollbacks_partial + self.rollbacks_checkpoint

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of generation (prefill excluded)."""
        return self.generated / self.t_generate if self.t_generate > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, acceptance_rate_at=self.acceptance_rate_at,
                 mean_accepted_length=self.mean_accepted_length, tokens_per_step=self.tokens_per_step,
                 rollbacks=self.rollbacks, tokens_per_second=self.tokens_per_second)
        return d

    def __str__(self) -> str:
        per = " ".join(f"{r:.2f}" for r in self.acceptance_rate_at)
        return (f"generated {self.generated} tokens in {self.steps} steps ({self.tokens_per_step:.2f}/step, "
                f"{self.tokens_per_second:.1f} tok/s); drafted {self.drafted}, accepted {self.accepted} "
                f"({100 * self.acceptance_rate:.1f}%, per position [{per}], mean accepted length "
                f"{self.mean_accepted_length:.2f}); rollbacks {self.rollbacks_partial} partial + "
                f"{self.rollbacks_checkpoint} checkpoint; time draft {self.t_draft:.3f}s verify "
                f"{self.t_verify:.3f}s rollback {self.t_rollback:.3f}s")


__all__ = ["SpeculativeStats"]

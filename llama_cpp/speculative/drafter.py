"""What a token drafter is (:class:`Drafter`): the interface the verify loop
(:class:`~llama_cpp.speculative.decoder.SpeculativeDecoder`), the server's slots and the media decoders
call. The n-gram types, prompt lookup, upstream's ``LlamaDraftModel`` objects, ``draft-simple``, ``draft-eagle3``,
``draft-mtp`` (:class:`~llama_cpp.speculative.nextn.NextNDrafter`), ``draft-dflash`` and ``draft-dspark``
are drafters (the server's slots run ``draft-simple`` and ``draft-mtp`` through their batched objects).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Drafter(Protocol):
    """A drafter for one sequence (one per decoder, or one per server slot for the per-slot types).

    The verify loop calls ``begin`` with the history after a prefill, ``draft`` once per step (the
    first non-empty draft of the drafters, in priority order, is verified; with ``takes_limit`` it
    gets the step's budget as a third argument) and ``accept`` with how many of that draft's tokens
    the target took; ``rewind(n_keep)`` when the history was cut back to ``n_keep`` tokens;
    ``observe(tokens, pos0, first)`` after every target decode of ``tokens`` at ``pos0..`` when
    ``observes`` (drafters that read the target's layer features; ``first``: the batch entry of
    ``tokens[0]``, as the server's slots decode many sequences in one batch); ``close()`` frees
    native resources. :class:`DrafterBase` gives the defaults most drafters keep.
    """

    #: the type name counted in :class:`~llama_cpp.speculative.SpeculativeStats` (``drafted_by``)
    kind: str
    #: the longest draft it proposes
    n_max: int
    takes_limit: bool
    observes: bool

    def begin(self, prompt: Sequence[int]) -> None: ...

    def draft(self, prompt: list[int], id_last: int) -> list[int]: ...

    def accept(self, n_accepted: int) -> None: ...

    def reset(self) -> None: ...

    def rewind(self, n_keep: int) -> None: ...

    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None: ...

    def close(self) -> None: ...


#: the ``n_max`` of a drafter that proposes as many tokens as its object returns (``llama-draft-model``):
#: the decoder's verify batch (``n_ubatch - 1`` tokens) bounds it
UNBOUNDED_DRAFT = 1 << 30


class DrafterBase:
    """The defaults of :class:`Drafter`: no step budget, no target features, nothing to keep on a
    rewind beyond what ``begin`` is told next, nothing to free."""

    takes_limit = False
    observes = False

    def rewind(self, n_keep: int) -> None:
        """The history was cut back to ``n_keep`` tokens (``begin`` follows with the new one)."""

    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None:
        """The target decoded ``tokens`` at ``pos0..`` (read only when ``observes``)."""

    def close(self) -> None:
        """Free native resources."""


class StatelessDrafter(DrafterBase):
    """A drafter that keeps nothing between drafts (each draft is computed from the history it is
    given): ``begin``, ``reset`` and ``accept`` have nothing to do."""

    def begin(self, prompt: Sequence[int]) -> None:
        """Nothing to set up: each draft reads the history it is given."""

    def reset(self) -> None:
        """Nothing kept."""

    def accept(self, n_accepted: int) -> None:
        """Nothing kept."""


__all__ = ["UNBOUNDED_DRAFT", "Drafter", "DrafterBase", "StatelessDrafter"]

"""What a token drafter is (:class:`Drafter`): the interface the verify loop
(:class:`~llama_cpp.speculative.decoder.SpeculativeDecoder`), the server's slots and the media decoders
call. The n-gram types, prompt lookup, ``draft-simple``, ``draft-eagle3``, ``draft-dflash`` and
``draft-dspark`` are drafters; ``draft-mtp``'s NextN head drafts inside its decoder, over the target's
NextN rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Drafter(Protocol):
    """A drafter for one sequence (one per decoder, or one per server slot for the per-slot types).

    The verify loop calls ``begin`` with the history after a prefill, ``draft`` once per step (the
    first non-empty draft of the drafters, in priority order, is verified) and ``accept`` with how
    many of that draft's tokens the target took. Optional, probed by name: ``rewind(n_keep)`` (the
    history was cut back to ``n_keep`` tokens), ``observe(tokens, pos0)`` (the target just decoded
    ``tokens`` at ``pos0..``: drafters that read its layer features), ``close()`` (native resources)
    and ``takes_limit`` (``draft`` takes the step's budget as a third argument).
    """

    #: the type name counted in :class:`~llama_cpp.speculative.SpeculativeStats` (``drafted_by``)
    kind: str
    #: the longest draft it proposes
    n_max: int

    def begin(self, prompt: Sequence[int]) -> None: ...

    def draft(self, prompt: list[int], id_last: int) -> list[int]: ...

    def accept(self, n_accepted: int) -> None: ...

    def reset(self) -> None: ...


__all__ = ["Drafter"]

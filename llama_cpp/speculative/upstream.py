"""Upstream llama-cpp-python's draft models as a drafter: :class:`LlamaDraftModelDrafter`, the type
``llama-draft-model``.

Any :class:`~llama_cpp.llama_speculative.LlamaDraftModel` given as ``Llama(draft_model=...)`` (other
than ``LlamaPromptLookupDecoding``, which drafts as ``prompt-lookup``) is asked each step for the
tokens after the history, the pending token included, as upstream's ``Llama.generate`` asks it; the
one verify loop (:class:`~llama_cpp.speculative.decoder.SpeculativeDecoder`) checks the answer, so the
output is plain decoding's, on any memory the loop can roll back (recurrent and hybrid included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import CallbackError, SpeculativeError
from .drafter import UNBOUNDED_DRAFT, StatelessDrafter


class LlamaDraftModelDrafter(StatelessDrafter):
    """``fn`` (a ``LlamaDraftModel``: ``fn(input_ids) -> token ids``) as a drafter: each draft is what
    ``fn`` returns for the sequence so far, cut to the step's budget. Its exception, or an answer that
    is not token ids of ``model``'s vocabulary, fails the generation naming the object."""

    kind = "llama-draft-model"
    takes_limit = True
    n_max = UNBOUNDED_DRAFT  # as many as the object returns: the verify batch bounds it

    def __init__(self, model: Any, fn: Callable[..., Any] | None) -> None:
        if fn is None or not callable(fn):
            raise SpeculativeError("spec_type 'llama-draft-model' drafts with a LlamaDraftModel object: pass it as "
                                   "Llama(draft_model=...)")
        self.model = model
        self.fn = fn

    def draft(self, prompt: list[int], id_last: int, k_max: int) -> list[int]:  # type: ignore[override]
        name = type(self.fn).__name__
        try:
            out = self.fn(np.asarray([*prompt, id_last], dtype=np.intc))
        except Exception as exc:
            raise CallbackError(f"draft_model {name} raised {type(exc).__name__}: {exc}") from exc
        try:
            proposal = [int(t) for t in np.asarray(out).reshape(-1)[:k_max]]
        except (TypeError, ValueError) as exc:
            raise CallbackError(f"draft_model {name} returned {type(out).__name__}, not an array of token ids") from exc
        self.model.check_tokens(proposal, "draft token")
        return proposal


__all__ = ["LlamaDraftModelDrafter"]

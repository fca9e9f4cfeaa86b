"""Draft models for ``Llama(draft_model=...)``, as in llama-cpp-python.

A draft model proposes the tokens that follow a history; ``Llama`` verifies the proposal in one
batch and keeps only what its own sampler picks, so the output is the same as without the draft.
The object drafts as a type of :mod:`llama_cpp.speculative` (``prompt-lookup`` for
:class:`LlamaPromptLookupDecoding`, ``llama-draft-model`` for any other, see
:mod:`llama_cpp.speculative.upstream`), verified by the one loop that also runs llama.cpp's n-gram,
draft-model and MTP types (``Llama(speculative=SpecConfig(...))``).
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import numpy.typing as npt


class LlamaDraftModel(abc.ABC):
    """``draft(input_ids) -> proposed next token ids`` (``np.intc`` arrays; may be empty)."""

    @abc.abstractmethod
    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        raise NotImplementedError


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt lookup: find the history's last n-gram earlier in the history and propose what followed it.

    Longer n-grams are tried first (``max_ngram_size`` down to 1), the earliest occurrence with a
    continuation wins, and at most ``num_pred_tokens`` tokens are proposed.
    """

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        if int(max_ngram_size) < 1 or int(num_pred_tokens) < 1:
            raise ValueError(f"max_ngram_size ({max_ngram_size}) and num_pred_tokens ({num_pred_tokens}) "
                             "must be at least 1")
        self.max_ngram_size = int(max_ngram_size)
        self.num_pred_tokens = int(num_pred_tokens)

    @staticmethod
    def find_candidate_pred_tokens(input_ids: npt.NDArray[np.intc], max_ngram_size: int,
                                   num_pred_tokens: int) -> npt.NDArray[np.intc]:
        ids = np.asarray(input_ids).reshape(-1)
        n = ids.shape[0]
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            tail = ids[n - size:]
            windows = np.lib.stride_tricks.sliding_window_view(ids[: n - 1], size)  # excludes the tail itself
            hits = np.nonzero((windows == tail).all(axis=1))[0]
            for start in hits + size:
                if start < n:
                    return ids[start: min(start + num_pred_tokens, n)].astype(np.intc)
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)


__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]

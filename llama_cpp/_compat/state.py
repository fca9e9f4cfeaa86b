"""``LlamaState`` (what ``Llama.save_state`` returns and prompt caches hold) and the token-prefix
measure both use. Kept apart from ``llama.py`` so that ``llama_cache`` needs no ``Llama``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass
class LlamaState:
    """A saved context: the evaluated tokens, the last logits row, llama.cpp's memory bytes and the
    seed. Positional fields are upstream llama-cpp-python's, in its order."""

    input_ids: np.ndarray
    scores: np.ndarray | None
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int
    speculative: Any = None  # the MTP decoder's MTPState (Llama(speculative=...)); never written to disk
    fingerprint: str | None = None  # the model it was saved from; a state of another model is refused
    made_from: dict[str, Any] | None = None  # model and context settings (llama_cpp._safety.state_integrity)
    digest: str | None = None  # keyed check of all the above and the bytes; a mismatch is refused

    @property
    def tokens(self) -> list[int]:
        """The tokens this state holds in the context's memory."""
        return [int(t) for t in np.asarray(self.input_ids)[: self.n_tokens]]


def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.nonzero(x != y)[0]
    return int(diff[0]) if diff.size else n


__all__ = ["LlamaState", "longest_token_prefix"]


LlamaState.__module__ = "llama_cpp.llama"  # upstream's path (LlamaDiskCache pickles it; llama re-exports it)

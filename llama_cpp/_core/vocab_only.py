"""``VocabOnlyContext``: what ``Llama._ctx`` is for a ``vocab_only`` model (llama.cpp makes no
context without weights)."""

from __future__ import annotations

from typing import Any

from .model import LlamaModel


class VocabOnlyContext:
    """``Llama._ctx`` of a ``vocab_only`` model. llama.cpp makes no context without weights, so this
    keeps the sizes and the vocabulary handle (``ctx``, never None); generation refuses it."""

    def __init__(self, model: LlamaModel, n_ctx: int, n_batch: int) -> None:
        self.ctx: Any = model.vocab
        self._n_ctx, self._n_batch = int(n_ctx), int(n_batch)

    def n_ctx(self) -> int:
        return self._n_ctx

    def n_batch(self) -> int:
        return self._n_batch

    def close(self) -> None:
        self.ctx = None


VocabOnlyContext.__module__ = "llama_cpp.llama"  # its public path (llama_cpp.llama re-exports it)

__all__ = ["VocabOnlyContext"]

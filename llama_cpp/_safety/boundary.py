"""What ``Llama`` calls at its boundaries (one import for the facade): argument types, the
isolated load, and sealing, checking and restoring saved states."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import isolated_load, state_integrity
from .arguments import check as check_args
from .state_integrity import check_before_load, model_fingerprint, seal

__all__ = ["check_args", "check_before_load", "model_fingerprint", "restore_state", "seal", "verify_load"]


def verify_load(path: str, isolate: bool | None, kv_overrides: Mapping[str, Any] | None, load_mtp: bool,
                embedding: bool, vocab_only: bool) -> None:
    """The isolated load of ``path`` when ``isolate`` (or ``LLAMA_CPP_ISOLATE_LOAD``) says so."""
    if isolated_load.enabled(isolate):
        isolated_load.verify_model_file(path, {"kv_overrides": dict(kv_overrides or {}), "load_mtp": bool(load_mtp),
                                               "embedding": bool(embedding), "vocab_only": bool(vocab_only)})


def restore_state(ctx: Any, state: Any, n_tokens: int) -> None:
    """llama.cpp's restore of ``state``'s memory, then the check that it holds exactly
    ``n_tokens`` positions; on any refusal the memory is cleared (the caller clears its history)."""
    try:
        ctx.state_set(bytes(state.llama_state))
    except Exception:
        ctx.memory_clear(True)  # llama.cpp cleared part of it before refusing
        raise
    state_integrity.check_after_load(ctx, n_tokens)

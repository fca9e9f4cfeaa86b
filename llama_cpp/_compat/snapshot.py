"""``Llama.save_state`` / ``load_state``: the KV memory and token history as a sealed
:class:`~llama_cpp.llama.LlamaState` (the speculative decoder's own state where it runs), and its
checked restore (model fingerprint, token ids, context size)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import ContextError, ContextOverflowError, LlamaError
from .._safety import boundary as _boundary
from .state import LlamaState


def save_state(llama: Any) -> LlamaState:
    """Snapshot the KV cache and token history (``scores`` holds the last logits row)."""
    ctx = llama.native_context()
    data = ctx.state_get()
    scores = None
    if llama._input_ids and llama._fresh:
        scores = np.array(ctx.logits_ith(-1), dtype=np.single)[None, :]
    spec = None
    if llama._spec is not None and llama._input_ids and llama._spec.kv_tokens == llama._input_ids:
        spec = llama._spec.save_state()
    return _boundary.seal(llama, LlamaState(
        input_ids=llama.input_ids.copy(), scores=scores, n_tokens=len(llama._input_ids), llama_state=data,
        llama_state_size=len(data), seed=llama._seed, speculative=spec, fingerprint=llama._state_fingerprint()))


def load_state(llama: Any, state: LlamaState) -> None:
    """Restore a ``save_state`` snapshot into ``llama`` (see ``Llama.load_state``)."""
    ctx = llama.native_context()
    if llama._spec is not None and getattr(state, "speculative", None) is not None:
        # the decoder restores both contexts, its pending token and hidden row
        llama._spec.load_state(state.speculative)
        llama._input_ids = llama._spec.kv_tokens
        llama._seed = state.seed
        llama._fresh = False
        return
    if getattr(state, "fingerprint", None) and state.fingerprint != llama._state_fingerprint():
        raise ContextError("this state was saved from another model (or another file of it): load it into "
                           "a Llama of the model that saved it")
    _boundary.check_before_load(llama, state)
    tokens = [int(t) for t in np.asarray(state.input_ids)[: int(state.n_tokens)]]
    llama._model.check_tokens(tokens, "state token")
    if len(tokens) > ctx.n_ctx():
        raise ContextOverflowError(f"the state holds {len(tokens)} tokens; this context holds "
                                   f"n_ctx={ctx.n_ctx()}: load it into a Llama with a larger n_ctx")
    llama._fresh = False
    if llama._spec is not None:
        llama._spec.invalidate()
    try:  # on a refusal the memory is cleared: the history must say so too
        _boundary.restore_state(ctx, state, len(tokens))
    except LlamaError:
        llama._input_ids = []
        raise
    llama._input_ids = tokens
    llama._seed = int(state.seed)
    if tokens and not (llama._is_recurrent or llama._is_hybrid):
        llama._refresh_logits()  # one token; recurrent memory would be rebuilt, so it waits for a need


__all__ = ["load_state", "save_state"]

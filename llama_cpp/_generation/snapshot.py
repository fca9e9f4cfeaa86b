"""``Llama.save_state`` / ``load_state``: the KV memory and token history as a sealed
:class:`~llama_cpp.llama.LlamaState` (the speculative decoder's own state where it runs), and its
checked restore (model fingerprint, token ids, context size), on the ``Llama``'s
:class:`~llama_cpp._generation.sequence.GenerationSequence`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._compat.state import LlamaState
from .._errors import ContextError, ContextOverflowError, LlamaError
from .._safety import boundary as _boundary
from .sequence import GenerationSequence


def save_state(llama: Any) -> LlamaState:
    """Snapshot the KV cache and token history (``scores`` holds the last logits row)."""
    ctx = llama.native_context()
    seq: GenerationSequence = llama.sequence
    data = ctx.state_get()
    scores = None
    if seq.tokens and seq.fresh:
        scores = np.array(ctx.logits_ith(-1), dtype=np.single)[None, :]
    spec = None
    if seq.spec is not None and seq.tokens and seq.spec.kv_tokens == seq.tokens:
        spec = seq.spec.save_state()
    return _boundary.seal(llama, LlamaState(
        input_ids=llama.input_ids.copy(), scores=scores, n_tokens=len(seq.tokens), llama_state=data,
        llama_state_size=len(data), seed=seq.seed, speculative=spec, fingerprint=_boundary.model_fingerprint(llama)))


def load_state(llama: Any, state: LlamaState) -> None:
    """Restore a ``save_state`` snapshot into ``llama`` (see ``Llama.load_state``)."""
    ctx = llama.native_context()
    seq: GenerationSequence = llama.sequence
    if seq.spec is not None and getattr(state, "speculative", None) is not None:
        # the decoder restores both contexts, its pending token and hidden row
        seq.spec.load_state(state.speculative)
        seq.tokens = seq.spec.kv_tokens
        seq.seed = state.seed
        seq.fresh = False
        return
    if getattr(state, "fingerprint", None) and state.fingerprint != _boundary.model_fingerprint(llama):
        raise ContextError("this state was saved from another model (or another file of it): load it into "
                           "a Llama of the model that saved it")
    _boundary.check_before_load(llama, state)
    tokens = [int(t) for t in np.asarray(state.input_ids)[: int(state.n_tokens)]]
    seq.model.check_tokens(tokens, "state token")
    if len(tokens) > ctx.n_ctx():
        raise ContextOverflowError(f"the state holds {len(tokens)} tokens; this context holds "
                                   f"n_ctx={ctx.n_ctx()}: load it into a Llama with a larger n_ctx")
    seq.fresh = False
    if seq.spec is not None:
        seq.spec.invalidate()
    try:  # on a refusal the memory is cleared: the history must say so too
        _boundary.restore_state(ctx, state, len(tokens))
    except LlamaError:
        seq.tokens = []
        raise
    seq.tokens = tokens
    seq.seed = int(state.seed)
    if tokens and not seq.rebuilds_memory:
        seq.refresh_logits(llama.logits_all)  # one token; recurrent memory would be rebuilt, so it waits for a need


__all__ = ["load_state", "save_state"]

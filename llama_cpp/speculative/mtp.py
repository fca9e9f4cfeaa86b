""":class:`MTPDecoder`: greedy-exact MTP speculative decoding with the model's own NextN head(s), the
:class:`~llama_cpp.speculative.nextn.NextNDrafter`, through the one verify loop (the algorithm is
described in :mod:`llama_cpp.speculative`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._core.context import LlamaContext
from .._errors import ContextOverflowError, SpeculativeError
from .batch import SeqCheckpoint, check_snapshot_ubatch
from .config import INHERITED_PARAMS, MTPState, SpecConfig
from .drafters import build_drafters
from .engine import DraftDecoder, context_params_of, tell_drafters
from .model_files import check_context_params, target_context_params
from .nextn import NextNDrafter, check_nextn
from .registry import TypeSpec


class MTPDecoder(DraftDecoder):
    """Greedy-exact MTP speculative decoding over one sequence of one model.

    ``MTPDecoder(model, ctx_params, config)`` creates the target context (``ctx_params`` are
    ``llama_context_params`` fields, as for :class:`~llama_cpp._internals.LlamaContext`) and the
    MTP draft context; pass ``target=`` to adopt a target context created with
    :func:`target_context_params`. Then :meth:`prefill` the token history (the last token is
    kept pending: it opens the first verify batch) and iterate :meth:`generate`.

    It is a :class:`~llama_cpp.speculative.engine.DraftDecoder` whose drafters include the
    :class:`~llama_cpp.speculative.nextn.NextNDrafter` (asked in the table's priority order with
    the other types of a combined configuration); it adds the snapshots of both contexts
    (:meth:`save_state`). A model with several NextN heads (:data:`CHAINED_NEXTN_ARCHS`) has them
    chained as in llama.cpp, and :attr:`draft_n_max` is ``config.draft_n_max`` capped at
    :attr:`n_heads`.
    """

    def __init__(self, model: Any, ctx_params: Mapping[str, Any] | None, config: SpecConfig, *,
                 target: Any = None, prompt_lookup: Any = None,
                 wrap: Callable[[TypeSpec, Any, Any], Any] | None = None, draft_model: Any = None) -> None:

        self._target = None
        self._drafters: list[Any] = []
        self._raw = None
        if not isinstance(config, SpecConfig):
            raise SpeculativeError(f"config must be a SpecConfig, got {type(config).__name__}")
        if not config.needs_nextn:
            check_context_params(config, {})  # names an unimplemented type as such
            raise SpeculativeError(f"MTPDecoder runs spec_type 'draft-mtp', got {config.spec_type.value!r}")
        params = context_params_of(ctx_params, target)
        if target is not None:
            # the draft context runs like its target (threads above all: oversubscribed threads
            # spin and make every decode orders of magnitude slower)
            tp = getattr(target, "params", None)
            for name in INHERITED_PARAMS:
                if tp is not None and hasattr(tp, name):
                    params.setdefault(name, getattr(tp, name))
        check_context_params(config, params)
        check_nextn(model)
        owns = target is None
        if owns:
            target = LlamaContext(model, **target_context_params(config, params))
        elif target.n_seq_max() != 1:
            raise SpeculativeError("the target context must have n_seq_max=1")
        try:
            check_snapshot_ubatch(model, target, "the MTP target context")
            if target.n_ubatch() < config.draft_n_max + 1:
                raise SpeculativeError(
                    f"the target context's n_ubatch={target.n_ubatch()} cannot hold one verify batch of "
                    f"{config.draft_n_max + 1} tokens: raise n_ubatch or lower draft_n_max")
            drafters = build_drafters(model, config, target, prompt_lookup, wrap, draft_model)
        except BaseException:
            if owns:
                target.close()
            raise
        head = [d for d in drafters if isinstance(getattr(d, "inner", d), NextNDrafter)]
        self._nextn: NextNDrafter = getattr(head[0], "inner", head[0])
        #: the number of NextN heads (chained when several)
        self.n_heads = self._nextn.n_heads
        #: the longest MTP draft: ``config.draft_n_max``, capped at the number of chained heads
        self.draft_n_max = self._nextn.n_max
        self.n_embd = self._nextn.n_embd
        super().__init__(model, target, config, drafters, owns_target=owns)
        # one budget for every type's draft, as llama.cpp's draft_n_max is (n_ubatch holds it: above)
        self.n_max = self._k_cap = config.draft_n_max

    @property
    def draft(self) -> Any:
        """The MTP draft context."""
        return self._nextn.ctx if self._drafters else None

    def _clear_memories(self) -> None:
        self._target.memory_clear(True)
        self._nextn.reset()

    # -- state ----------------------------------------------------------------------------------
    def save_state(self) -> MTPState:
        """Snapshot both contexts' sequence state and the decoder's bookkeeping."""
        tgt = self._live()
        if self._dirty:
            raise SpeculativeError("the target context was changed outside the decoder: prefill() first")
        draft, h, n_dft, heads = self._nextn.save(self._kv)
        full = SeqCheckpoint(tgt, 0, 0)
        full.save()
        return MTPState(target=full.data(), draft=draft, kv_tokens=tuple(self._kv), id_last=self._id_last,
                        pending_h=h, n_draft_past=n_dft, heads=heads)

    def load_state(self, state: MTPState) -> None:  # type: ignore[override]
        """Restore a snapshot taken by :meth:`save_state` on a decoder of the same model and sizes."""
        tgt = self._live()
        if not isinstance(state, MTPState):
            raise TypeError(f"expected an MTPState, got {type(state).__name__}")
        if len(state.pending_h) != 4 * self._nextn.n_embd:
            raise SpeculativeError(f"the state's hidden row has {len(state.pending_h) // 4} floats; this model "
                                   f"uses {self._nextn.n_embd}")
        if len(state.kv_tokens) >= self.n_ctx:
            raise ContextOverflowError(f"the state holds {len(state.kv_tokens)} tokens; n_ctx is {self.n_ctx}")
        self.model.check_tokens(list(state.kv_tokens), "state token")
        kv = list(state.kv_tokens)
        old = self.history
        # the NextN drafter takes the state's draft memory instead (load below)
        tell_drafters([d for d in self._drafters if getattr(d, "inner", d) is not self._nextn], old, kv)
        self._nextn.load(kv, state.draft, state.pending_h, state.n_draft_past, state.heads)
        tgt.memory_clear(True)
        self._reset_state()
        if kv:
            tgt.state_seq_set(state.target, 0)
        self._kv = kv
        self._id_last = state.id_last

# the package's path, as before the split (reprs, pickles): llama_cpp.speculative re-exports them
for _cls in (MTPDecoder,):
    _cls.__module__ = "llama_cpp.speculative"

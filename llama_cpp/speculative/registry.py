"""The one table of speculative types (:data:`TYPES`): each row's priority (its place), how its
drafter is built, what it needs, its longest draft, whether the server's slots and multimodal chat
run it and why not. :class:`~llama_cpp.speculative.SpecConfig`'s checks, :func:`build_drafters`
(``Llama``, the media decoders), the server's per-slot drafters and every refusal read it.

Adding a type is a drafter module plus one row here (:func:`register` adds one at run time: a
:class:`CustomType` name that ``SpecConfig(spec_type=...)`` then accepts).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

from ..llama_speculative import LlamaPromptLookupDecoding
from . import dflash as _dflash_mod
from . import eagle3 as _eagle3_mod
from .dflash import DFlashDrafter
from .draft import DraftModel
from .drafter import UNBOUNDED_DRAFT
from .eagle3 import Eagle3Drafter
from .nextn import NextNDrafter
from .ngram import NgramCache, NgramMap, NgramMod, NgramSimple, PromptLookup, load_ngram_cache
from .slot_drafts import BatchedDraftModel
from .upstream import LlamaDraftModelDrafter


class SpeculativeType(str, enum.Enum):
    """Kinds of speculative decoding (values are llama.cpp's ``--spec-type`` names)."""

    NONE = "none"
    DRAFT_SIMPLE = "draft-simple"    # a separate, smaller draft model sharing the vocabulary
    DRAFT_EAGLE3 = "draft-eagle3"    # an EAGLE3 draft head over target hidden states
    DRAFT_MTP = "draft-mtp"          # the model's own NextN (MTP) head(s)
    DRAFT_DFLASH = "draft-dflash"    # a DFlash block-diffusion draft over target hidden states
    DRAFT_DSPARK = "draft-dspark"    # DFlash with a Markov head
    NGRAM_SIMPLE = "ngram-simple"    # the continuation of the latest earlier n-gram match
    NGRAM_MAP_K = "ngram-map-k"      # n-gram keys in a hash map, draft length from past acceptance
    NGRAM_MAP_K4V = "ngram-map-k4v"  # n-gram keys with up to four counted m-gram continuations
    NGRAM_MOD = "ngram-mod"          # a hash table from n-grams to the next token, chained
    NGRAM_CACHE = "ngram-cache"      # 1..4-gram continuation counts (+ static/dynamic cache files)
    #: upstream llama-cpp-python's LlamaPromptLookupDecoding (not a llama.cpp type): the continuation
    #: of the earliest earlier match of the longest n-gram (``max_ngram_size`` down to 1)
    PROMPT_LOOKUP = "prompt-lookup"
    #: any other upstream ``LlamaDraftModel`` object (``Llama(draft_model=...)``, not a llama.cpp type):
    #: what the object's ``__call__`` returns for the history
    LLAMA_DRAFT_MODEL = "llama-draft-model"


class CustomType(str):
    """The name of a type added with :func:`register` (``value`` and ``name`` as an enum member's)."""

    @property
    def value(self) -> str:
        return str(self)

    @property
    def name(self) -> str:
        return self.upper().replace("-", "_")


#: what a row needs besides the target's tokens
NEEDS_DRAFT_MODEL = "draft model"      # ``SpecConfig.draft_model_path``
NEEDS_FEATURES = "target features"     # the target's extracted layers at every position
NEEDS_NEXTN = "NextN heads"            # the target model's own MTP layers

#: how the server's slots run a row: a drafter per request (``PER_SLOT``: cheap, built when the request
#: starts), a drafter per slot sequence (``PER_SEQUENCE``: it owns a draft context, is built once over
#: the target context and kept between that slot's requests, and is told the target rows of its
#: sequence), or one object for every slot (``BATCHED``, built by
#: :class:`~llama_cpp.speculative.slots.SlotSpeculation`)
PER_SLOT, PER_SEQUENCE, BATCHED = "per-slot", "per-sequence", "batched"
#: how a media decoder tells a row's drafter about media positions: the text tokens only, the draft
#: model mirroring the target's memory, the target's layer features of media rows, or the decoder's
#: own head (MTP)
MEDIA_TEXT, MEDIA_MIRROR, MEDIA_FEATURES, MEDIA_OWN = "text", "mirror", "features", "own"


@dataclasses.dataclass(frozen=True)
class DrafterArgs:
    """What a row's constructor gets: the target model and ``config``, the target context (None for
    the server's per-request drafters, which need none), upstream's prompt-lookup object, the
    parameters a draft context inherits from the target's (and in the slots its ``n_ctx``), the
    target sequence it follows, and what the server slots' drafters of its row share."""

    model: Any
    config: Any
    target: Any = None
    prompt_lookup: Any = None
    ctx_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seq: int = 0  # the target sequence the drafter follows (a server slot's)
    #: what the server slots' drafters of one row share: the row's ``share(config)`` (loaded once when
    #: the slots start: ``ngram-cache``'s files), or a dict its first drafter fills (a PER_SEQUENCE
    #: row's loaded draft model); None outside the slots
    shared: dict[str, Any] | None = None
    #: the ``llama-draft-model`` row's object (a ``LlamaDraftModel`` other than prompt lookup)
    draft_model: Any = None


@dataclasses.dataclass(frozen=True)
class TypeSpec:
    """One speculative type. ``build`` makes its drafter for one target sequence (None: the slots only);
    ``n_max(config)`` is its longest draft (None: ``config.draft_n_max``); ``not_in_slots`` /
    ``not_in_media`` say why the server's slots / multimodal chat refuse it (None: they run it);
    ``slot_check(model_path)`` says why the slots refuse it for that model file (None: they run it);
    ``batched(args, n_slots)`` builds a ``BATCHED`` row's one object for every slot (``args.target``:
    the slot engine's context; ``draft(items)`` for ``(seq, history, id_last, k_max)`` items);
    ``check_draft(path, target_arch=, target_n_embd=, target_n_layer=)`` checks its draft file against
    the target from the GGUF headers, before anything loads; ``share(config)`` loads what the server
    slots' drafters of the row share read-only, once when the slots start (their ``args.shared``)."""

    type: Any  # a SpeculativeType, or a CustomType
    build: Callable[[DrafterArgs], Any] | None
    needs: frozenset[str] = frozenset()
    n_max: Callable[[Any], int] | None = None
    slots: str = PER_SLOT
    not_in_slots: str | None = None
    media: str = MEDIA_TEXT
    not_in_media: str | None = None
    slot_check: Callable[[Any], str | None] | None = None
    batched: Callable[[DrafterArgs, int], Any] | None = None
    check_draft: Callable[..., Any] | None = None
    share: Callable[[Any], dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return str(self.type.value)

    def longest(self, config: Any) -> int:
        return int(self.n_max(config)) if self.n_max is not None else int(config.draft_n_max)


# -- constructors -------------------------------------------------------------------------------------
def prompt_lookup_drafter(params: Any, fn: Any = None) -> Any:
    """The ``prompt-lookup`` drafter: ``fn`` (a ``LlamaPromptLookupDecoding`` or its call signature),
    by default upstream's lookup with ``params`` (a ``PromptLookupParams``), cut to
    ``params.num_pred_tokens`` tokens."""

    if fn is None:

        fn = LlamaPromptLookupDecoding(params.max_ngram_size, params.num_pred_tokens)
    return PromptLookup(fn, params.num_pred_tokens)


def _prompt_lookup(a: DrafterArgs) -> Any:
    return prompt_lookup_drafter(a.config.prompt_lookup, a.prompt_lookup)


def _llama_draft_model(a: DrafterArgs) -> Any:

    return LlamaDraftModelDrafter(a.model, a.draft_model)


def _ngram_simple(a: DrafterArgs) -> Any:

    return NgramSimple(a.config.ngram_simple.size_n, a.config.ngram_simple.size_m)


def _ngram_map(key_only: bool) -> Callable[[DrafterArgs], Any]:
    def build(a: DrafterArgs) -> Any:

        p = a.config.ngram_map_k if key_only else a.config.ngram_map_k4v
        return NgramMap(p.size_n, p.size_m, p.min_hits, key_only=key_only)
    return build


def _ngram_mod(a: DrafterArgs) -> Any:

    q = a.config.ngram_mod
    return NgramMod(q.n_match, q.n_max, q.n_min)


def _ngram_cache_files(config: Any) -> dict[str, Any]:
    """``ngram-cache``'s static and dynamic cache files, loaded (None where not given)."""

    c = config.ngram_cache
    return {"static": load_ngram_cache(c.lookup_cache_static) if c.lookup_cache_static is not None else None,
            "dynamic": load_ngram_cache(c.lookup_cache_dynamic) if c.lookup_cache_dynamic is not None else None}


def _ngram_cache(a: DrafterArgs) -> Any:

    files = a.shared if a.shared is not None else _ngram_cache_files(a.config)  # the slots load them once
    return NgramCache(a.config.ngram_cache.n_draft, static=files["static"], dynamic=files["dynamic"])


def _draft_kwargs(a: DrafterArgs) -> dict[str, Any]:
    c = a.config
    return dict(n_max=c.draft_n_max, n_min=c.draft_n_min, p_min=c.draft_p_min, ctx_params=dict(a.ctx_params),
                n_gpu_layers=c.draft_n_gpu_layers)


def _feature_kwargs(a: DrafterArgs) -> dict[str, Any]:
    return dict(_draft_kwargs(a), seq=a.seq, draft_model=(a.shared or {}).get("draft_model"))


def _sharing(a: DrafterArgs, drafter: Any) -> Any:
    """``drafter``, its draft model kept for the next slot's drafter of the same row."""
    if a.shared is not None:
        a.shared.setdefault("draft_model", drafter.model)
    return drafter


def _draft_simple(a: DrafterArgs) -> Any:

    return DraftModel(a.model, a.target, a.config.draft_model_path, **_draft_kwargs(a))


def _eagle3(a: DrafterArgs) -> Any:

    return _sharing(a, Eagle3Drafter(a.model, a.target, a.config.draft_model_path, **_feature_kwargs(a)))


def _dflash(dspark: bool) -> Callable[[DrafterArgs], Any]:
    def build(a: DrafterArgs) -> Any:

        return _sharing(a, DFlashDrafter(a.model, a.target, a.config.draft_model_path, dspark=dspark,
                                         **_feature_kwargs(a)))
    return build


def _draft_simple_slots(a: DrafterArgs, n_slots: int) -> Any:

    c = a.config
    return BatchedDraftModel(a.model, a.target, c.draft_model_path, n_slots, n_max=c.draft_n_max, n_min=c.draft_n_min,
                             p_min=c.draft_p_min, n_gpu_layers=c.draft_n_gpu_layers)


def _nextn(a: DrafterArgs) -> Any:

    # in the server's slots (a shared dict given) it follows its slot's sequence
    return NextNDrafter(a.model, a.target, a.config, a.ctx_params, slot=a.seq if a.shared is not None else None)


def _check_eagle3(path: Any, **target: Any) -> Any:

    return _eagle3_mod.check_draft_header(path, **target)


def _check_dflash(dspark: bool) -> Callable[..., Any]:
    def check(path: Any, **target: Any) -> Any:

        return _dflash_mod.check_draft_header(path, dspark=dspark, **target)
    return check


_T = SpeculativeType
_DRAFT = frozenset((NEEDS_DRAFT_MODEL,))
_FEAT = frozenset((NEEDS_DRAFT_MODEL, NEEDS_FEATURES))

#: Every type, in llama.cpp's priority order (upstream's ``draft_model`` objects first, as the server's
#: slots ask prompt lookup first): each step verifies the first non-empty draft.
TYPES: tuple[TypeSpec, ...] = (
    TypeSpec(_T.LLAMA_DRAFT_MODEL, _llama_draft_model, n_max=lambda c: UNBOUNDED_DRAFT,
             not_in_slots="it drafts with a Python object given to one Llama (Llama(draft_model=...)); the "
                          "server's slots name their types in spec_type"),
    TypeSpec(_T.PROMPT_LOOKUP, _prompt_lookup, n_max=lambda c: c.prompt_lookup.num_pred_tokens),
    TypeSpec(_T.NGRAM_SIMPLE, _ngram_simple, n_max=lambda c: c.ngram_simple.size_m),
    TypeSpec(_T.NGRAM_MAP_K, _ngram_map(True), n_max=lambda c: c.ngram_map_k.size_m),
    TypeSpec(_T.NGRAM_MAP_K4V, _ngram_map(False), n_max=lambda c: c.ngram_map_k4v.size_m),
    TypeSpec(_T.NGRAM_MOD, _ngram_mod, n_max=lambda c: c.ngram_mod.n_max),
    TypeSpec(_T.NGRAM_CACHE, _ngram_cache, n_max=lambda c: c.ngram_cache.n_draft, share=_ngram_cache_files),
    TypeSpec(_T.DRAFT_SIMPLE, _draft_simple, _DRAFT, slots=BATCHED, media=MEDIA_MIRROR, batched=_draft_simple_slots),
    TypeSpec(_T.DRAFT_EAGLE3, _eagle3, _FEAT, slots=PER_SEQUENCE, check_draft=_check_eagle3,
             not_in_media="its draft pairs the target's features at each position with the token at the next one, "
                          "which a media position does not have"),
    TypeSpec(_T.DRAFT_MTP, _nextn, frozenset((NEEDS_NEXTN,)), slots=PER_SEQUENCE, media=MEDIA_OWN),
    TypeSpec(_T.DRAFT_DFLASH, _dflash(False), _FEAT, slots=PER_SEQUENCE, media=MEDIA_FEATURES,
             check_draft=_check_dflash(False)),
    TypeSpec(_T.DRAFT_DSPARK, _dflash(True), _FEAT, slots=PER_SEQUENCE, media=MEDIA_FEATURES,
             check_draft=_check_dflash(True)),
)


def table() -> tuple[TypeSpec, ...]:
    """The rows, in priority order (read at call time: :func:`register` may have added some)."""
    return TYPES


def find(name: str) -> TypeSpec | None:
    """The row named ``name`` (a type's value), or None."""
    for s in TYPES:
        if s.name == name:
            return s
    return None


def spec_of(t: Any) -> TypeSpec:
    """The row of type ``t`` (a SpeculativeType or CustomType)."""
    s = find(str(t.value))
    if s is None:
        raise KeyError(f"no speculative type {t.value!r} in the table")
    return s


def rows_of(config: Any) -> list[TypeSpec]:
    """The rows of ``config``'s types, in priority order."""
    return [s for s in TYPES if s.type in config.types]


def register(spec: TypeSpec, before: str | None = None) -> None:
    """Add a row (before the row named ``before``, else last); its type is then a ``spec_type`` name."""
    global TYPES
    if find(spec.name) is not None:
        raise ValueError(f"speculative type {spec.name!r} is already in the table")
    rows = list(TYPES)
    at = next((i for i, s in enumerate(rows) if s.name == before), len(rows)) if before is not None else len(rows)
    rows.insert(at, spec)
    TYPES = tuple(rows)


def unregister(name: str) -> None:
    """Remove the row named ``name`` (one :func:`register` added)."""
    global TYPES
    TYPES = tuple(s for s in TYPES if s.name != name or isinstance(s.type, SpeculativeType))


__all__ = ["BATCHED", "MEDIA_FEATURES", "MEDIA_MIRROR", "MEDIA_OWN", "MEDIA_TEXT", "NEEDS_DRAFT_MODEL",
           "NEEDS_FEATURES", "NEEDS_NEXTN", "PER_SEQUENCE", "PER_SLOT", "TYPES", "UNBOUNDED_DRAFT", "CustomType", "DrafterArgs", "SpeculativeType",
           "TypeSpec", "find", "prompt_lookup_drafter", "register", "rows_of", "spec_of", "table", "unregister"]

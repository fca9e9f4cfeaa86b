"""What the EAGLE3 and DFlash drafters share: the target's layer inputs and the draft's header.

- :func:`draft_header`: a draft file's GGUF metadata and tensor names, read without loading it.
- :func:`check_target_layers`: the draft's ``<arch>.target_layers`` against the target (range,
  an architecture whose llama.cpp graph exports layer inputs).
- :class:`RowStore`: rows a drafter derived from the target, by position, with the token each was
  made for (what a rewind within its margin re-pairs without the target).
- :class:`TargetLayers`: turns a target context's layer-input outputs on (and off again on
  close), reads the concatenated rows of its last decode, and decodes a span of the history
  again when a drafter needs rows it never saw (a restored state).
- :func:`open_draft` / :class:`FeatureDraftParts`: the draft model and its context over the
  target's memory sizes, and the one order in which a drafter's native parts are freed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaContext
from .._core.model import LlamaModel
from .._core.ownership import float_view
from .._errors import ModelLoadError, OptionalSymbolMissing, SpeculativeError
from .._safety.gguf_guard import read_header
from .batch import RawBatch
from .drafter import DrafterBase

#: Target architectures whose llama.cpp graph exports per-layer inputs (``t_layer_inp``): for
#: any other, enabling a layer's output aborts inside llama.cpp.
LAYER_INPUT_ARCHS = frozenset((
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01",
    "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
    "qwen3next", "qwen4exp"))
_SYMBOLS = ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp", "llama_model_target_layer_ids",
            "llama_model_target_layer_ids_n")


def draft_header(path: str | os.PathLike[str], arch: str, kind: str) -> tuple[dict[str, Any], set[str]]:
    """(metadata, tensor names) of the ``arch`` draft at ``path`` for spec_type ``kind``; SpeculativeError
    if it is not one."""

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise SpeculativeError(f"draft_model_path {p!r} is not a file: give the path of the GGUF draft for {kind!r}")
    try:
        header = read_header(p)
    except ModelLoadError as e:
        raise SpeculativeError(f"draft_model_path {p!r} is not a readable GGUF file: {e}") from None
    found = header.metadata.get("general.architecture")
    if found != arch:
        raise SpeculativeError(f"{p} is a {found!r} model: spec_type {kind!r} needs a draft whose "
                               f"general.architecture is {arch!r} (a separate draft model is spec_type='draft-simple')")
    return header.metadata, {t.name for t in header.tensors}


def check_target_layers(path: str, layers: Any, *, target_arch: str | None, target_n_layer: int | None,
                        arch: str) -> list[int]:
    """``layers`` (``<arch>.target_layers``) as ints, checked against the target where known.

    An EAGLE3 draft may name layer ``n_layer``: the target's final hidden state (llama.cpp reads
    it through the NextN output); DFlash drafts read layer inputs only."""
    if not isinstance(layers, list) or not layers or not all(isinstance(x, int) for x in layers):
        raise SpeculativeError(f"{path}: {arch}.target_layers must list the target layers the draft reads, "
                               f"got {layers!r}")
    if target_arch is not None and target_arch not in LAYER_INPUT_ARCHS:
        raise SpeculativeError(f"a {arch} draft reads target layer inputs, which llama.cpp's {target_arch!r} graph "
                               f"does not export: use a target of one of {', '.join(sorted(LAYER_INPUT_ARCHS))}")
    if target_n_layer is not None:
        top = target_n_layer if arch == "eagle3" else target_n_layer - 1
        bad = [x for x in layers if not 0 <= x <= top]
        if bad:
            raise SpeculativeError(f"{path} reads target layers {layers}; this target has layers "
                                   f"0..{target_n_layer - 1}{' (and n_layer, its output)' if top == target_n_layer else ''}"
                                   " (layer ids out of range)")
    return [int(x) for x in layers]


def loaded_layers(C: Any, model: Any) -> list[int]:
    """The target layer ids llama.cpp loaded for a draft model."""
    n = int(C.llama_model_target_layer_ids_n(model.ptr))
    ids = C.llama_model_target_layer_ids(model.ptr)
    return [int(ids[i]) for i in range(n)]


def require_symbols(C: Any, extra: Sequence[str], kind: str) -> None:
    missing = [n for n in (*_SYMBOLS, *extra) if not C.__bindings__.functions[n].available()]
    if missing:
        raise OptionalSymbolMissing(f"this llama.cpp build does not export {', '.join(missing)} (the staging API "
                                    f"{kind} needs): use a build from the pinned source")


def open_draft(C: Any, path: str, layers: Sequence[int], target_ctx: Any, ctx_params: Any,
               n_gpu_layers: int, model: Any = None) -> tuple[Any, Any]:
    """(model, context) of the draft at ``path``: llama.cpp's loaded target layers must be the header's;
    the context has the target's sizes (``n_ctx`` from ``ctx_params`` where given: a server slot's
    share), one sequence without snapshots, and reads the target's embeddings (``ctx_other``).
    ``model``: the draft already loaded (the server slots' drafters of one type share it; closing it
    is deferred while a context uses it)."""

    owned = model is None
    if owned:
        model = LlamaModel(path, n_gpu_layers=n_gpu_layers)
    try:
        loaded = loaded_layers(C, model)
        if loaded != list(layers):
            raise SpeculativeError(f"{path}: llama.cpp loaded target layers {loaded}, the header lists {list(layers)}")
        params = dict(ctx_params)
        params.update(n_ctx=int(params.get("n_ctx") or target_ctx.n_ctx()), n_batch=target_ctx.n_batch(),
                      n_ubatch=target_ctx.n_ubatch(), n_seq_max=1, n_rs_seq=0, embeddings=False)
        params.pop("ctx_type", None)
        return model, LlamaContext(model, ctx_other=target_ctx, **params)
    except BaseException:
        if owned:
            model.close()
        raise


class FeatureDraftParts(DrafterBase):
    """The native parts an EAGLE3 or DFlash drafter owns, freed in one order by :meth:`close`."""

    _tl: Any = None
    _batch: Any = None
    ctx: Any = None
    model: Any = None

    def close(self) -> None:
        if self._tl is not None:
            self._tl.close()
            self._tl = None
        for name in ("_batch", "ctx", "model"):  # the batch first: it points into the context
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)


class RowStore:
    """Rows a drafter derived from the target by position (``base .. base + n - 1``; EAGLE3's ``g``, the
    NextN hidden states), each with the target token it was made for.

    Storing at ``pos0`` drops every row from ``pos0`` on (the target dropped those positions too).
    Rows more than ``margin`` positions behind the paired boundary are let go: a rewind deeper
    than that decodes the target again for them."""

    def __init__(self, width: int, margin: int) -> None:
        self.margin = int(margin)
        self.base = self.n = 0
        self.rows = np.zeros((64, width), dtype=np.float32)
        self.tok = np.full(64, -1, dtype=np.int64)

    def clear(self) -> None:
        self.base = self.n = 0

    def put(self, pos0: int, rows: np.ndarray, tokens: Sequence[int]) -> None:
        if pos0 < self.base:
            self.base, self.n = pos0, 0
        start, end = pos0 - self.base, pos0 - self.base + len(tokens)
        if end > self.tok.shape[0]:
            cap = max(end, 2 * self.tok.shape[0])
            grown = np.zeros((cap, self.rows.shape[1]), dtype=np.float32)
            grown[:self.n] = self.rows[:self.n]
            tok = np.full(cap, -1, dtype=np.int64)
            tok[:self.n] = self.tok[:self.n]
            self.rows, self.tok = grown, tok
        self.tok[self.n:start] = -1  # a gap: positions never seen
        self.rows[start:end] = rows
        self.tok[start:end] = tokens
        self.n = end

    def first_miss(self, hist: Sequence[int], lo: int, hi: int) -> int | None:
        """The first position in ``lo..hi-1`` without a row made for ``hist``'s token there."""
        if lo >= hi:
            return None
        if lo < self.base:
            return lo
        if hi - lo <= 16 and hi <= self.base + self.n:  # a step's few positions: a list compare costs less
            if self.tok[lo - self.base:hi - self.base].tolist() == list(hist[lo:hi]):
                return None
        have = self.tok[lo - self.base:min(hi, self.base + self.n) - self.base]
        bad = np.flatnonzero(have != np.asarray(hist[lo:lo + have.shape[0]], dtype=np.int64))
        if bad.size:
            return lo + int(bad[0])
        return None if lo + have.shape[0] >= hi else lo + have.shape[0]

    def get(self, lo: int, hi: int) -> np.ndarray:
        return self.rows[lo - self.base:hi - self.base]

    def tokens(self, lo: int, hi: int) -> list[int]:
        """The tokens the rows at ``lo..hi-1`` were made for."""
        return [int(t) for t in self.tok[lo - self.base:hi - self.base]]

    def forget(self, paired: int) -> None:
        """Positions below ``paired - margin`` are no longer kept."""
        d = paired - self.margin - self.base
        if d > 0 and d >= self.n // 2:  # shift rarely: amortized over the rows kept
            d = min(d, self.n)
            self.rows[:self.n - d] = self.rows[d:self.n]
            self.tok[:self.n - d] = self.tok[d:self.n]
            self.base += d
            self.n -= d


class TargetLayers:
    """The inputs of ``layers`` of one target context, for every token of its last decode; ``seq``
    is the target sequence the drafter follows (a server slot's; 0 elsewhere)."""

    def __init__(self, C: Any, target: Any, layers: Sequence[int], n_embd: int, n_layer: int | None = None,
                 seq: int = 0) -> None:
        self.bindings = C
        self._target = target
        self.seq = int(seq)
        self.layers = list(layers)
        self.n_embd = int(n_embd)
        self.width = len(self.layers) * self.n_embd
        self._refill: Any = None
        # layer n_layer: the target's output hidden state, every token (as llama.cpp's EAGLE3 reads it)
        self._final = n_layer if n_layer is not None and n_layer in self.layers else None
        for lid in self._inputs():
            C.llama_set_embeddings_layer_inp(target.ptr, lid, True)
        if self._final is not None:
            C.llama_set_embeddings_nextn(target.ptr, True, False)

    def _inputs(self) -> list[int]:
        return sorted(set(self.layers) - {self._final})

    def close(self) -> None:
        if self._refill is not None:
            self._refill.close()
            self._refill = None
        if self._target is not None and self._target.ctx is not None:
            for lid in self._inputs():
                self.bindings.llama_set_embeddings_layer_inp(self._target.ptr, lid, False)
            if self._final is not None:
                self.bindings.llama_set_embeddings_nextn(self._target.ptr, False, False)
        self._target = None

    def rows(self, m: int, first: int = 0) -> np.ndarray:
        """The ``(m, width)`` concatenated layer inputs of the entries ``first..first+m-1`` of the
        target's last decode (llama.cpp hands them out in batch order, whatever its micro-batches)."""
        C, tgt, w = self.bindings, self._target.ptr, self.n_embd
        out = np.empty((m, self.width), dtype=np.float32)
        n = first + m
        for k, lid in enumerate(self.layers):
            ptr = C.llama_get_embeddings_nextn(tgt) if lid == self._final else C.llama_get_embeddings_layer_inp(tgt, lid)
            if not ptr:
                raise SpeculativeError(f"the target context returned no inputs of layer {lid}")
            out[:, k * w:(k + 1) * w] = float_view(ptr, n * w).reshape(n, w)[first:]
        return out

    def redecode(self, hist: Sequence[int], first: int, end: int, observe: Callable[[Sequence[int], int], None]) -> None:
        """Decode ``hist[first:end]`` of the sequence on the target again (its memory keeps the same
        tokens), so that ``observe`` sees their rows; a sequence that cannot drop that suffix is
        rebuilt from 0."""

        tgt = self._target
        if not tgt.seq_rm(self.seq, first, -1):
            tgt.seq_rm(self.seq, -1, -1)
            first = 0
        if self._refill is None:
            self._refill = RawBatch(tgt, self.seq)
        self._refill.decode(list(hist[first:end]), first, "none", observe)


__all__ = ["LAYER_INPUT_ARCHS", "FeatureDraftParts", "RowStore", "TargetLayers", "check_target_layers", "draft_header",
           "loaded_layers", "open_draft", "require_symbols"]

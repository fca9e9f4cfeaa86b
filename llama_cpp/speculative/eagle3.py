"""``draft-eagle3``: an EAGLE3 draft head fed with the target's hidden states.

An EAGLE3 draft (llama.cpp's ``eagle3`` architecture) has an encoder, ``fc``, that projects the
concatenation of three target layers' inputs at position ``p`` (``eagle3.target_layers``, each
``eagle3.target_hidden_size`` wide) to ``g_p``, and one decoder block whose entry at position
``p`` is the pair ``(t_{p+1}, g_p)``: the *next* token with this position's features, as in
llama.cpp's ``common_speculative_impl_draft_eagle3``. Its pre-norm output replaces ``g`` when it
drafts further. Without its own ``token_embd``/``output`` it reads the target's (``ctx_other``).

:class:`Eagle3Drafter` is a drafter for :class:`~llama_cpp.speculative.engine.DraftDecoder`:

- ``observe(tokens, pos0)`` runs after every target decode: it reads the three layers' rows
  (``llama_get_embeddings_layer_inp``), runs the encoder on them and keeps ``g_p`` with the
  target token at ``p``;
- ``draft(history, id_last, k)`` first makes the draft memory hold the pairs of the current
  history: it keeps the pairs whose tokens still match, decodes the missing ones up to
  position ``P-1`` (the last one, ``(id_last, g_{P-1})``, is the output that proposes ``d_0``) in
  one batch, then decodes ``(d_j, h_j)`` per drafted token with the draft's own pre-norm row.
  Rejected drafts therefore never reach the draft memory; only verified positions are paired
  (llama.cpp writes the whole verify batch and rewrites the rejected part later).

The ``g`` rows not yet paired, and the last 512 (or ``n_batch``) paired ones, are kept so that a
history cut back by that much is re-paired without the target; positions the drafter never saw
decoded (a restored state) or let go are decoded on the target again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._core.ownership import float_view
from .._errors import SpeculativeError
from ..llama_batch import LlamaBatchExt
from .batch import RawExtBatch, common_prefix, top_k_share
from .draft import check_draft_vocab
from .engine import warm_up
from .features import (
    LAYER_INPUT_ARCHS,
    FeatureDraftParts,
    RowStore,
    TargetLayers,
    check_target_layers,
    draft_header,
    open_draft,
    require_symbols,
)

log = logging.getLogger("llama_cpp.speculative")

_TOP_K = 10  # the draft's confidence: its top token's share of the top 10 (llama.cpp's top-k sampler)
N_TARGET_LAYERS = 3
_ROW_MARGIN = 512  # g rows kept behind the paired boundary, for rewinds without a target re-decode
_SYMBOLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")


def check_draft_header(path: str | os.PathLike[str], *, target_arch: str | None = None,
                       target_n_embd: int | None = None, target_n_layer: int | None = None) -> list[int]:
    """Check ``path`` is an EAGLE3 draft that fits the target (from its GGUF header, nothing loaded);
    returns its target layer ids. Target values that are None are not checked."""
    p = os.fspath(path)
    meta, _ = draft_header(p, "eagle3", "draft-eagle3")
    layers = meta.get("eagle3.target_layers")
    if not isinstance(layers, list) or len(layers) != N_TARGET_LAYERS:
        raise SpeculativeError(f"{p}: eagle3.target_layers must list {N_TARGET_LAYERS} target layers, got {layers!r}")
    hidden = meta.get("eagle3.target_hidden_size")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        raise SpeculativeError(f"{p}: eagle3.target_hidden_size must be a positive integer, got {hidden!r}")
    layers = check_target_layers(p, layers, target_arch=target_arch, target_n_layer=None, arch="eagle3")
    if target_n_embd is not None and hidden != target_n_embd:
        raise SpeculativeError(f"{p} was trained on a target of hidden size {hidden} (eagle3.target_hidden_size); "
                               f"this target's n_embd is {target_n_embd}: use the EAGLE3 draft made for this model")
    return check_target_layers(p, layers, target_arch=None, target_n_layer=target_n_layer, arch="eagle3")


class Eagle3Drafter(FeatureDraftParts):
    """The ``draft-eagle3`` drafter over its own draft model and context (owned by it)."""

    kind = "draft-eagle3"
    takes_limit = True  # draft() takes the step's token budget
    observes = True  # reads the target's layer features of every decode

    def __init__(self, target_model: Any, target_ctx: Any, path: str | os.PathLike[str], *, n_max: int,
                 n_min: int, p_min: float, ctx_params: Mapping[str, Any], n_gpu_layers: int = 0, seq: int = 0,
                 draft_model: Any = None) -> None:

        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.model = self.ctx = self._batch = self._tl = None
        C = target_model.bindings
        require_symbols(C, _SYMBOLS, "EAGLE3")
        p = os.fspath(path)
        layers = check_draft_header(p, target_arch=target_model.metadata.get("general.architecture"),
                                    target_n_embd=target_model.n_embd(), target_n_layer=target_model.n_layer())
        check_draft_vocab(target_model, p)
        self.bindings = C
        try:
            self.model, self.ctx = open_draft(C, p, layers, target_ctx, ctx_params, n_gpu_layers, draft_model)
            self._batch = LlamaBatchExt(self.ctx)
            self.n_dec = int(self.model.n_embd())
            self._raw = RawExtBatch(self._batch, self.ctx, self.n_dec)
            self._tl = TargetLayers(C, target_ctx, layers, target_model.n_embd(), target_model.n_layer(), seq)
            C.llama_set_embeddings_nextn(self.ctx.ptr, True, True)  # g rows (encoder) and pre-norm rows (outputs)
            self._warm_up()
        except BaseException:
            self.close()
            raise
        self.n_tgt = int(target_model.n_embd())
        self.n_vocab_target = int(target_model.n_vocab)
        self._topk = min(_TOP_K, self.model.n_vocab)
        self._n_ctx = target_ctx.n_ctx()
        self._n_ubatch = self.ctx.n_ubatch()
        self._n_batch = self.ctx.n_batch()
        self._rows = RowStore(self.n_dec, max(_ROW_MARGIN, self._n_batch))  # g_p, the encoder's output
        self.reset()

    def _warm_up(self) -> None:
        """Warm the draft context up (:func:`~llama_cpp.speculative.engine.warm_up`): the encoder on one
        row of features, then the decoder."""

        def decode(toks: list[int]) -> None:
            self._raw.rows(np.zeros((1, self._tl.width), dtype=np.float32), 0, encode=True)
            self._raw.decode(toks, 0, "last", np.zeros((len(toks), self.n_dec), dtype=np.float32))

        warm_up(self.model, self.ctx, decode)

    def reset(self) -> None:
        if self.ctx is not None:
            self.ctx.memory_clear(True)
        self._hist: list[int] = []  # the history the draft memory's pairs were made for
        self._n = 0                 # pairs 0.._n-1 in the draft memory belong to _hist
        self._n_mem = 0             # positions held by the draft memory (pairs and drafted entries)
        self._rows.clear()

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def accept(self, n_accepted: int) -> None:
        pass

    # -- the target's side ------------------------------------------------------------------
    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None:
        """The target just decoded ``tokens`` at ``pos0..`` (batch entries ``first..``): keep their ``g`` rows."""
        m = len(tokens)
        if m == 0 or self.ctx is None:
            return
        feats = self._tl.rows(m, first)
        C, dft = self.bindings, self.ctx.ptr
        g = np.empty((m, self.n_dec), dtype=np.float32)
        for s in range(0, m, self._n_ubatch):  # the encoder needs the whole batch in one micro-batch
            e = min(m, s + self._n_ubatch)
            self._raw.rows(feats[s:e], self._n_mem, encode=True)
            ptr = C.llama_get_embeddings_nextn(dft)
            if not ptr:
                raise SpeculativeError("the EAGLE3 encoder returned no rows")
            g[s:e] = float_view(ptr, (e - s) * self.n_dec).reshape(e - s, self.n_dec)
        self._rows.put(pos0, g, tokens)  # a decode at pos0: the target dropped everything from pos0 on

    # -- drafting ---------------------------------------------------------------------------
    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        k_max = self.n_max if n_max is None else min(self.n_max, int(n_max))
        if k_max <= 0 or not prompt:
            return []  # nothing before id_last: no g row to pair it with
        try:
            return self._draft(prompt, int(id_last), k_max)
        except BaseException:
            self.reset()  # a failed decode leaves the memory unknown: start over next time
            raise

    def _sync(self, hist: list[int]) -> None:
        """Make the draft memory hold the pairs ``(hist[p+1], g_p)`` for ``p < len(hist) - 1``, the last
        one an output."""
        P = len(hist) - 1
        # the seed pair (hist[P], g_{P-1}) is always decoded again: its row proposes the first token
        keep = min(self._n, max(common_prefix(self._hist, hist) - 1, 0), P - 1)
        # every kept row is checked, not only those past the draft memory: after a state restore,
        # rows made for another prefix may carry the same tokens from some position on
        miss = self._rows.first_miss(hist, min(self._rows.base, keep), P)
        if miss is not None:  # positions this drafter never saw decoded (a restored state) or let go
            self._tl.redecode(hist, miss, P, self.observe)
        if self._n_mem > keep and not self.ctx.seq_rm(0, keep, -1):
            raise SpeculativeError("the EAGLE3 draft context could not drop a suffix of its memory")
        self._n_mem = self._n = keep
        toks, rows = hist[keep + 1:P], self._rows.get(keep, P - 1)
        n = len(toks)
        for s in range(0, n, self._n_batch):
            e = min(n, s + self._n_batch)
            self._raw.decode(toks[s:e], keep + s, False, rows[s:e])
        # the seed alone: llama.cpp's eagle3 graph computes every row's logits and pre-norm state and
        # hands out the first n_outputs of them, so an output is only right in a one-entry batch
        self._raw.decode(hist[P:], P - 1, True, self._rows.get(P - 1, P))
        self._n_mem = self._n = P
        self._hist = list(hist)
        self._rows.forget(P)

    def _draft(self, prompt: list[int], id_last: int, k_max: int) -> list[int]:
        self._sync(list(prompt) + [id_last])
        C, ctx, k = self.bindings, self.ctx, self._topk
        out: list[int] = []
        while True:
            logits = ctx.logits_ith(-1)
            best = int(np.argmax(logits))
            if self.p_min > 0.0 and top_k_share(logits, best, k) < self.p_min:
                break
            if best >= self.n_vocab_target:
                break
            out.append(best)
            if len(out) >= k_max:
                break
            ptr = C.llama_get_embeddings_nextn_ith(ctx.ptr, -1)
            if not ptr:
                raise SpeculativeError("the EAGLE3 draft returned no pre-norm row")
            h = float_view(ptr, self.n_dec).copy()
            self._raw.decode((best,), self._n_mem, True, (h,))
            self._n_mem += 1
        if len(out) < self.n_min:
            return []
        return out


__all__ = ["LAYER_INPUT_ARCHS", "Eagle3Drafter", "check_draft_header"]

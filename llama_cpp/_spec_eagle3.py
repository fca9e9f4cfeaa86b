"""``draft-eagle3``: an EAGLE3 draft head fed with the target's hidden states.

An EAGLE3 draft (llama.cpp's ``eagle3`` architecture) has an encoder, ``fc``, that projects the
concatenation of three target layers' inputs at position ``p`` (``eagle3.target_layers``, each
``eagle3.target_hidden_size`` wide) to ``g_p``, and one decoder block whose entry at position
``p`` is the pair ``(t_{p+1}, g_p)``: the *next* token with this position's features, as in
llama.cpp's ``common_speculative_impl_draft_eagle3``. Its pre-norm output replaces ``g`` when it
drafts further. Without its own ``token_embd``/``output`` it reads the target's (``ctx_other``).

:class:`Eagle3Drafter` is a drafter for :class:`~llama_cpp._spec_engine.DraftDecoder`:

- ``observe(tokens, pos0)`` runs after every target decode: it reads the three layers' rows
  (``llama_get_embeddings_layer_inp``), runs the encoder on them and keeps ``g_p`` with the
  target token at ``p``;
- ``draft(history, id_last, k)`` first makes the draft memory hold the pairs of the current
  history: it keeps the pairs whose tokens still match, decodes the missing ones up to
  position ``P-1`` (the last one, ``(id_last, g_{P-1})``, is the output that proposes ``d_0``) in
  one batch, then decodes ``(d_j, h_j)`` per drafted token with the draft's own pre-norm row.
  Rejected drafts therefore never reach the draft memory; only verified positions are paired
  (llama.cpp writes the whole verify batch and rewrites the rejected part later).

The ``g`` rows are kept per position (``n_ctx`` rows of the draft's width) so that a history cut
back to any length can be re-paired without re-running the target; positions the drafter never
saw decoded (a restored state) are decoded on the target again, once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import OptionalSymbolMissing, SpeculativeError
from ._spec_batch import RawExtBatch, common_prefix

log = logging.getLogger("llama_cpp.speculative")

_TOP_K = 10  # the draft's confidence: its top token's share of the top 10 (llama.cpp's top-k sampler)
N_TARGET_LAYERS = 3
_SYMBOLS = ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp", "llama_set_embeddings_nextn",
            "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith", "llama_model_target_layer_ids",
            "llama_model_target_layer_ids_n")
#: Target architectures whose llama.cpp graph exports per-layer inputs (``t_layer_inp``): for
#: any other, enabling a layer's output aborts inside llama.cpp.
LAYER_INPUT_ARCHS = frozenset((
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01",
    "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
    "qwen3next", "qwen4exp"))


def check_draft_header(path: str | os.PathLike[str], *, target_arch: str | None = None,
                       target_n_embd: int | None = None, target_n_layer: int | None = None) -> list[int]:
    """Check ``path`` is an EAGLE3 draft that fits the target (from its GGUF header, nothing loaded);
    returns its target layer ids. Target values that are None are not checked."""
    from ._errors import ModelLoadError
    from ._gguf_guard import read_header

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise SpeculativeError(f"draft_model_path {p!r} is not a file: give the path of a GGUF EAGLE3 draft")
    try:
        meta = read_header(p).metadata
    except ModelLoadError as e:
        raise SpeculativeError(f"draft_model_path {p!r} is not a readable GGUF file: {e}") from None
    arch = meta.get("general.architecture")
    if arch != "eagle3":
        raise SpeculativeError(f"{p} is a {arch!r} model, not an EAGLE3 draft (general.architecture must be "
                               "'eagle3'); for a separate draft model use spec_type='draft-simple'")
    layers = meta.get("eagle3.target_layers")
    if not isinstance(layers, list) or len(layers) != N_TARGET_LAYERS:
        raise SpeculativeError(f"{p}: eagle3.target_layers must list {N_TARGET_LAYERS} target layers, got {layers!r}")
    hidden = meta.get("eagle3.target_hidden_size")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        raise SpeculativeError(f"{p}: eagle3.target_hidden_size must be a positive integer, got {hidden!r}")
    if target_arch is not None and target_arch not in LAYER_INPUT_ARCHS:
        raise SpeculativeError(f"an EAGLE3 draft reads target layer inputs, which llama.cpp's {target_arch!r} "
                               f"graph does not export: use a target of one of {', '.join(sorted(LAYER_INPUT_ARCHS))}")
    if target_n_embd is not None and hidden != target_n_embd:
        raise SpeculativeError(f"{p} was trained on a target of hidden size {hidden} (eagle3.target_hidden_size); "
                               f"this target's n_embd is {target_n_embd}: use the EAGLE3 draft made for this model")
    if target_n_layer is not None:
        bad = [x for x in layers if not 0 <= int(x) < target_n_layer]
        if bad:
            raise SpeculativeError(f"{p} reads target layers {layers}; this target has layers 0..{target_n_layer - 1} "
                                   "(layer ids out of range)")
    return [int(x) for x in layers]


class Eagle3Drafter:
    """The ``draft-eagle3`` drafter over its own draft model and context (owned by it)."""

    kind = "draft-eagle3"
    takes_limit = True  # draft() takes the step's token budget

    def __init__(self, target_model: Any, target_ctx: Any, path: str | os.PathLike[str], *, n_max: int,
                 n_min: int, p_min: float, ctx_params: Mapping[str, Any], n_gpu_layers: int = 0) -> None:
        from ._internals import LlamaContext, LlamaModel
        from ._spec_draft import check_vocab_compatible
        from .llama_batch import LlamaBatchExt

        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.model = self.ctx = self._batch = self._refill = None
        self._target = None
        self._layers: list[int] = []
        C = target_model._C
        missing = [n for n in _SYMBOLS if not C.__bindings__.functions[n].available()]
        if missing:
            raise OptionalSymbolMissing(f"this llama.cpp build does not export {', '.join(missing)} (the staging API "
                                        "EAGLE3 needs): use a build from the pinned source")
        p = os.fspath(path)
        layers = check_draft_header(p, target_arch=target_model.metadata.get("general.architecture"),
                                    target_n_embd=target_model.n_embd(), target_n_layer=target_model.n_layer())
        with LlamaModel(p, vocab_only=True) as vocab:
            check_vocab_compatible(target_model, vocab, p)
        self._C = C
        try:
            self.model = LlamaModel(p, n_gpu_layers=n_gpu_layers)
            n = int(C.llama_model_target_layer_ids_n(self.model.ptr))
            ids = C.llama_model_target_layer_ids(self.model.ptr)
            loaded = [int(ids[i]) for i in range(n)]
            if loaded != layers:
                raise SpeculativeError(f"{p}: llama.cpp loaded target layers {loaded}, the header lists {layers}")
            params = dict(ctx_params)
            params.update(n_ctx=target_ctx.n_ctx(), n_batch=target_ctx.n_batch(), n_ubatch=target_ctx.n_ubatch(),
                          n_seq_max=1, n_rs_seq=0, embeddings=False)
            params.pop("ctx_type", None)
            self.ctx = LlamaContext(self.model, ctx_other=target_ctx, **params)
            self._batch = LlamaBatchExt(self.ctx)
            self.n_dec = int(self.model.n_embd())
            self._raw = RawExtBatch(self._batch, self.ctx, self.n_dec)
            self._target = target_ctx
            self._layers = layers
            for lid in sorted(set(layers)):
                C.llama_set_embeddings_layer_inp(target_ctx.ptr, lid, True)
            C.llama_set_embeddings_nextn(self.ctx.ptr, True, True)  # g rows (encoder) and pre-norm rows (outputs)
        except BaseException:
            self.close()
            raise
        self.n_tgt = int(target_model.n_embd())
        self.n_vocab_target = int(target_model.n_vocab)
        self._topk = min(_TOP_K, self.model.n_vocab)
        self._n_ctx = target_ctx.n_ctx()
        self._n_ubatch = self.ctx.n_ubatch()
        self._n_batch = self.ctx.n_batch()
        self._g = np.zeros((self._n_ctx, self.n_dec), dtype=np.float32)   # g_p, encoder output
        self._gtok = np.full(self._n_ctx, -1, dtype=np.int64)              # target token at p (-1: none)
        self.reset()

    def close(self) -> None:
        if self._target is not None and self._target.ctx is not None:
            for lid in sorted(set(self._layers)):
                self._C.llama_set_embeddings_layer_inp(self._target.ptr, lid, False)
        self._target = None
        for name in ("_refill", "_batch", "ctx", "model"):  # batches first: they point into contexts
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    def reset(self) -> None:
        if self.ctx is not None:
            self.ctx.memory_clear(True)
        self._hist: list[int] = []  # the history the draft memory's pairs were made for
        self._n = 0                 # pairs 0.._n-1 in the draft memory belong to _hist
        self._n_mem = 0             # positions held by the draft memory (pairs and drafted entries)
        self._gtok[:] = -1

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def accept(self, n_accepted: int) -> None:
        pass

    # -- the target's side ------------------------------------------------------------------
    def _features(self, m: int) -> np.ndarray:
        """The ``(m, 3 * n_tgt)`` concatenated layer inputs of the target's last decode."""
        C, tgt = self._C, self._target.ptr
        feats = np.empty((m, len(self._layers) * self.n_tgt), dtype=np.float32)
        for k, lid in enumerate(self._layers):
            ptr = C.llama_get_embeddings_layer_inp(tgt, lid)
            if not ptr:
                raise SpeculativeError(f"the target context returned no inputs of layer {lid}")
            feats[:, k * self.n_tgt:(k + 1) * self.n_tgt] = np.ctypeslib.as_array(ptr, shape=(m, self.n_tgt))
        return feats

    def observe(self, tokens: Sequence[int], pos0: int) -> None:
        """The target just decoded ``tokens`` at ``pos0..``: keep their ``g`` rows."""
        m = len(tokens)
        if m == 0 or self.ctx is None:
            return
        feats = self._features(m)
        C, dft = self._C, self.ctx.ptr
        for s in range(0, m, self._n_ubatch):  # the encoder needs the whole batch in one micro-batch
            e = min(m, s + self._n_ubatch)
            self._raw.encode(feats[s:e], self._n_mem)
            ptr = C.llama_get_embeddings_nextn(dft)
            if not ptr:
                raise SpeculativeError("the EAGLE3 encoder returned no rows")
            self._g[pos0 + s:pos0 + e] = np.ctypeslib.as_array(ptr, shape=(e - s, self.n_dec))
        # a decode at pos0 means the target dropped everything from pos0 on
        self._gtok[pos0 + m:] = -1
        self._gtok[pos0:pos0 + m] = np.asarray(tokens, dtype=np.int64)

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

    def _refeed(self, hist: list[int], P: int) -> None:
        """Re-decode the target from the first position whose ``g`` row is missing (a restored
        state, or someone else's decodes): its memory keeps the same tokens, and the rows come back."""
        from ._spec_batch import RawBatch

        miss = np.flatnonzero(self._gtok[:P] != np.asarray(hist[:P], dtype=np.int64))
        first = int(miss[0])
        tgt = self._target
        if not tgt.seq_rm(0, first, -1):
            tgt.memory_clear(True)
            first = 0
        if self._refill is None:
            self._refill = RawBatch(tgt)
        self._refill.decode(hist[first:P], first, "none", self.observe)
        log.debug("EAGLE3: re-decoded target positions %d..%d for their features", first, P - 1)

    def _sync(self, hist: list[int]) -> None:
        """Make the draft memory hold the pairs ``(hist[p+1], g_p)`` for ``p < len(hist) - 1``, the last
        one an output."""
        P = len(hist) - 1
        # the seed pair (hist[P], g_{P-1}) is always decoded again: its row proposes the first token
        keep = min(self._n, max(common_prefix(self._hist, hist) - 1, 0), P - 1)
        if not np.array_equal(self._gtok[keep:P], np.asarray(hist[keep:P], dtype=np.int64)):
            self._refeed(hist, P)
        if self._n_mem > keep and not self.ctx.seq_rm(0, keep, -1):
            raise SpeculativeError("the EAGLE3 draft context could not drop a suffix of its memory")
        self._n_mem = self._n = keep
        toks, rows = hist[keep + 1:P], self._g[keep:P - 1]
        n = len(toks)
        for s in range(0, n, self._n_batch):
            e = min(n, s + self._n_batch)
            self._raw.decode(toks[s:e], keep + s, False, rows[s:e])
        # the seed alone: llama.cpp's eagle3 graph computes every row's logits and pre-norm state and
        # hands out the first n_outputs of them, so an output is only right in a one-entry batch
        self._raw.decode(hist[P:], P - 1, True, self._g[P - 1:P])
        self._n_mem = self._n = P
        self._hist = list(hist)

    def _draft(self, prompt: list[int], id_last: int, k_max: int) -> list[int]:
        self._sync(list(prompt) + [id_last])
        C, ctx, k = self._C, self.ctx, self._topk
        out: list[int] = []
        while True:
            logits = ctx.logits_ith(-1)
            best = int(np.argmax(logits))
            if self.p_min > 0.0:
                top = np.partition(logits, -k)[-k:] if k < logits.shape[0] else logits
                p = 1.0 / float(np.exp(top.astype(np.float64) - float(logits[best])).sum())
                if p < self.p_min:
                    break
            if best >= self.n_vocab_target:
                break
            out.append(best)
            if len(out) >= k_max:
                break
            ptr = C.llama_get_embeddings_nextn_ith(ctx.ptr, -1)
            if not ptr:
                raise SpeculativeError("the EAGLE3 draft returned no pre-norm row")
            h = np.ctypeslib.as_array(ptr, shape=(self.n_dec,)).copy()
            self._raw.decode((best,), self._n_mem, True, (h,))
            self._n_mem += 1
        if len(out) < self.n_min:
            return []
        return out


__all__ = ["LAYER_INPUT_ARCHS", "Eagle3Drafter", "check_draft_header"]

"""``draft-dflash``: a DFlash block-diffusion draft over the target's hidden states.

A DFlash draft (llama.cpp's ``dflash`` architecture) keeps, at each target position ``p``, the
K/V its ``fc`` projection makes of the target's layer inputs at ``p`` (``dflash.target_layers``,
each the target's ``n_embd`` wide: an embedding entry of that concatenated width, decoded into
the draft's memory). One draft step decodes the block ``[id_last, <mask> * n_max]`` at
``P..P+n_max`` with every row an output and (unless ``dflash.attention.causal``) non-causal
attention; row ``i >= 1`` proposes the token at ``P + i``. As in llama.cpp's
``common_speculative_impl_draft_dflash``:

- the block always has ``n_max`` masks (``draft_n_max`` cut to ``dflash.block_size - 1``); a
  smaller budget cuts the proposal, not the block, so the rows see the same block;
- drafting stops at the first row whose top token has less than ``p_min`` of the top-10 mass.

:class:`DFlashDrafter` is a drafter for :class:`~llama_cpp.speculative.engine.DraftDecoder`:
``observe`` writes the features of every target decode at their positions (after dropping what
the draft memory held from there on), ``draft`` makes the draft memory hold exactly the
history's positions (decoding the target again where it never saw them), decodes the block and
removes it again. ``draft-dspark`` (a DFlash draft with a Markov head, :class:`DFlashDrafter`
with ``dspark``): the Markov bias runs inside llama.cpp's graph; with ``dflash.sample_from_anchor``
(the default) the block is ``[id_last, <mask> * (n_max - 1)]`` and row ``i`` proposes the token
at ``P + i + 1``; ``draft_p_min`` compares with the confidence head's output instead of the
logits. DFlash2 (``dflash.selector_top_k`` > 0): the block has no outputs; llama.cpp's graph
packs a lattice per row (the top candidates, their scores given each candidate of the row
before) into the draft's hidden-state output, and the draft follows it from the anchor. Drafts
for M-RoPE targets take ``(p, p, p, 0)`` per feature row. DSV4 backbones are refused before
loading.
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
from .batch import RawExtBatch
from .draft import check_draft_vocab
from .engine import warm_up
from .features import (
    FeatureDraftParts,
    TargetLayers,
    check_target_layers,
    draft_header,
    open_draft,
    require_symbols,
)

log = logging.getLogger("llama_cpp.speculative")

_TOP_K = 10
_UNSEEN = -2  # _ktok at a position the draft memory has no features for (-1 is multimodal chat's media id)
DEFAULT_BLOCK_SIZE = 16  # llama.cpp's default when dflash.block_size is absent


def check_draft_header(path: str | os.PathLike[str], *, target_arch: str | None = None,
                       target_n_embd: int | None = None, target_n_layer: int | None = None,
                       dspark: bool = False) -> tuple[list[int], int, bool, bool, int]:
    """Check ``path`` is a DFlash (``dspark``: DSpark) draft this package runs and that fits the
    target (from its GGUF header); returns (target layer ids, block size, sample from the anchor,
    has a confidence head, DFlash2 selector top-k or 0). Target values that are None are not checked."""
    p = os.fspath(path)
    kind = "draft-dspark" if dspark else "draft-dflash"
    meta, tensors = draft_header(p, "dflash", kind)
    layers = check_target_layers(p, meta.get("dflash.target_layers"), target_arch=target_arch,
                                 target_n_layer=target_n_layer, arch="dflash")
    top_k = meta.get("dflash.selector_top_k", 0)
    top_k = top_k if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0 else 0
    if top_k:
        need = ("selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight")
        keys = ("dflash.conv_kernel_size", "dflash.conv_group_size", "dflash.selector_rank", "dflash.block_size")
        missing = [n for n in need if n not in tensors] + [k for k in keys if not meta.get(k)]
        if missing:
            raise SpeculativeError(f"{p} is a DFlash2 draft (dflash.selector_top_k = {top_k}) without "
                                   f"{', '.join(missing)}")
        width = meta.get("dflash.embedding_length")
        if isinstance(width, int) and width < top_k * (top_k + 1):
            raise SpeculativeError(f"{p}: a DFlash2 lattice of top-k {top_k} needs n_embd >= {top_k * (top_k + 1)}, "
                                   f"the draft has {width}")
        if dspark:
            raise SpeculativeError(f"{p} has both a Markov head and a DFlash2 selector, which llama.cpp does not run")
    has_markov = "markov_w1.weight" in tensors
    if has_markov and not dspark:
        raise SpeculativeError(f"{p} is a DSpark draft (it has a Markov head): use spec_type='draft-dspark'")
    if dspark and not has_markov:
        raise SpeculativeError(f"{p} is a DFlash draft without a Markov head, not a DSpark draft: use "
                               "spec_type='draft-dflash'")
    if meta.get("dflash.hyper_connection_count"):
        raise SpeculativeError(f"{p} has a DeepSeek-V4 backbone (dflash.hyper_connection_count), which is not "
                               "implemented here")
    n_embd = meta.get("dflash.embedding_length")
    if target_n_embd is not None and n_embd != target_n_embd:
        raise SpeculativeError(f"{p} is {n_embd} wide (dflash.embedding_length) and reads {len(layers)} target layers "
                               f"of its own width; this target's n_embd is {target_n_embd}: use the DFlash draft made "
                               "for this model")
    if meta.get("tokenizer.ggml.mask_token_id") is None:
        raise SpeculativeError(f"{p} has no mask token (tokenizer.ggml.mask_token_id): a DFlash draft fills its block "
                               "with it")
    block = meta.get("dflash.block_size", DEFAULT_BLOCK_SIZE)
    if not isinstance(block, int) or isinstance(block, bool) or block < 2:
        raise SpeculativeError(f"{p}: dflash.block_size must be an integer >= 2, got {block!r}")
    anchor = meta.get("dflash.sample_from_anchor", True) not in (False, "false")
    conf = "conf_proj.weight" in tensors and meta.get("dflash.has_confidence_head", True) not in (False, "false")
    return layers, int(block), bool(anchor), conf, top_k


class DFlashDrafter(FeatureDraftParts):
    """The ``draft-dflash`` (or, with ``dspark``, ``draft-dspark``) drafter over its own draft model and
    context (owned by it). ``mrope`` tells whether the draft model uses M-RoPE positions (a draft for an
    M-RoPE target, which multimodal chat needs to skip an image's positions)."""

    takes_limit = True  # draft() takes the step's token budget
    observes = True  # reads the target's layer features of every decode

    def __init__(self, target_model: Any, target_ctx: Any, path: str | os.PathLike[str], *, n_max: int,
                 n_min: int, p_min: float, ctx_params: Mapping[str, Any], n_gpu_layers: int = 0, seq: int = 0,
                 draft_model: Any = None,
                 dspark: bool = False) -> None:

        self.model = self.ctx = self._batch = self._tl = None
        C = target_model.bindings
        self.kind = "draft-dspark" if dspark else "draft-dflash"
        self._dspark = bool(dspark)
        self.p_min = float(p_min)
        self._conf = dspark and self.p_min > 0.0  # DSpark stops on its confidence head, not on the logits
        p = os.fspath(path)
        layers, block, anchor, has_conf, self._top_k = check_draft_header(
            p, target_arch=target_model.metadata.get("general.architecture"), target_n_embd=target_model.n_embd(),
            target_n_layer=target_model.n_layer(), dspark=dspark)
        nextn = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn")
        require_symbols(C, nextn if self._conf or self._top_k else (), "DSpark" if dspark else "DFlash")
        if self._conf and not has_conf:
            raise SpeculativeError(f"{p} has no confidence head (conf_proj): a DSpark draft without one cannot stop "
                                   "on draft_p_min; set draft_p_min=0")
        check_draft_vocab(target_model, p)
        # DFlash denoises [id_last, mask * (block - 1)] in place; anchor-first DSpark drafts from id_last's row on
        self._first = 0 if dspark and anchor else 1
        self.n_max = min(int(n_max), block - self._first)
        self.n_min = min(int(n_min), self.n_max)
        if self.n_max < int(n_max):
            log.info("DFlash: draft_n_max=%d exceeds the trained block size %d; drafting %d", n_max, block, self.n_max)
        self.bindings = C
        try:
            self.model, self.ctx = open_draft(C, p, layers, target_ctx, ctx_params, n_gpu_layers, draft_model)
            self.mask = int(C.llama_vocab_mask(self.model.vocab))
            if self.mask < 0:
                raise SpeculativeError(f"{p}: llama.cpp found no mask token in this DFlash draft")
            causal = self.model.metadata.get("dflash.attention.causal", "false") == "true"
            C.llama_set_causal_attn(self.ctx.ptr, causal)
            self._batch = LlamaBatchExt(self.ctx)
            self._n_embd = int(self.model.n_embd())
            self.mrope = self.model.n_pos_per_embd() > 1  # drafts for M-RoPE targets: (p, p, p, 0) per row
            self._raw = RawExtBatch(self._batch, self.ctx, self._n_embd)
            self._tl = TargetLayers(C, target_ctx, layers, target_model.n_embd(), seq=seq)
            if self._conf:
                C.llama_set_embeddings_nextn(self.ctx.ptr, True, True)  # the confidence of every row
            elif self._top_k:
                C.llama_set_embeddings_nextn(self.ctx.ptr, True, False)  # the DFlash2 lattice, one row per entry

            warm_up(self.model, self.ctx, lambda toks: self._raw.decode(toks, 0, "last"))
        except BaseException:
            self.close()
            raise
        self.n_vocab_target = int(target_model.n_vocab)
        self._topk = min(_TOP_K, self.model.n_vocab)
        self._n_ubatch = self.ctx.n_ubatch()
        self._ktok = np.full(target_ctx.n_ctx(), _UNSEEN, dtype=np.int64)  # target token whose features sit at p
        self._k_end = 0  # _ktok is _UNSEEN from here on
        self.reset()

    def reset(self) -> None:
        if self.ctx is not None:
            self.ctx.memory_clear(True)
        self._n_mem = 0  # positions 0.._n_mem-1 in the draft memory
        self._ktok[:] = _UNSEEN
        self._k_end = 0
        self._begin()

    def _begin(self) -> None:
        # _draft compares the history with _ktok below _ok only once per history list: the engine
        # appends to one list and tells its drafters (begin) whenever it changes it otherwise
        self._ok = 0
        self._ok_hist: Any = None

    def begin(self, prompt: Sequence[int]) -> None:
        self._begin()

    def accept(self, n_accepted: int) -> None:
        pass

    def _drop(self, pos: int) -> None:
        """Drop the draft memory from ``pos`` on."""
        if self._n_mem > pos:
            if not self.ctx.seq_rm(0, pos, -1):
                raise SpeculativeError("the DFlash draft context could not drop a suffix of its memory")
            self._n_mem = pos
        if self._k_end > pos:
            self._ktok[pos:self._k_end] = _UNSEEN
            self._k_end = pos
        self._ok = min(self._ok, pos)

    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None:
        """The target just decoded ``tokens`` at ``pos0..`` (batch entries ``first..``): write their
        features at those positions."""
        m = len(tokens)
        if m == 0 or self.ctx is None:
            return
        self._drop(pos0)
        if pos0 > self._n_mem:
            return  # a gap (positions this drafter never saw): the next draft decodes them again
        feats = self._tl.rows(m, first)
        for s in range(0, m, self._n_ubatch):
            e = min(m, s + self._n_ubatch)
            self._raw.rows(feats[s:e], pos0 + s, encode=False, mrope=self.mrope)
            self._n_mem = pos0 + e
        self._ktok[pos0:pos0 + m] = tokens
        self._k_end = max(self._k_end, pos0 + m)

    def skip(self, pos0: int, n: int, token: int) -> None:
        """Positions ``pos0..pos0+n-1`` hold ``token`` in the target's history but nothing in the draft
        memory (an M-RoPE image, whose rows share one position: llama.cpp's server does not inject
        them either); the positions after them go into the draft memory as if they were held."""
        if n <= 0 or pos0 > self._n_mem:
            return  # a gap before them: the next draft decodes the target again from there
        end = pos0 + n
        if self._n_mem < end:
            self._ktok[max(self._n_mem, pos0):end] = token
            self._n_mem = end
            self._k_end = max(self._k_end, end)

    def _walk(self, n_block: int, k_max: int) -> list[int]:
        """DFlash2: follow the selector lattice from the anchor, each row's best successor of the last pick.

        Row ``i`` holds ``top_k`` candidate ids, then ``top_k`` scores per candidate of row ``i - 1``."""
        ptr = self.bindings.llama_get_embeddings_nextn(self.ctx.ptr)
        if not ptr:
            raise SpeculativeError("the DFlash2 draft returned no selector lattice")
        k, n = self._top_k, min(k_max, n_block - 1)
        block = float_view(ptr, n_block * self._n_embd).reshape(n_block, self._n_embd)[1:1 + n]
        scores = block[:, k:k + k * k].reshape(n, k, k)  # [row, predecessor, candidate]
        # every row's best candidate (and its share) for each predecessor at once; the walk below
        # only follows the table (argmax keeps the first of equal scores, as std::max_element)
        best = scores.argmax(axis=2)
        succ, toks = best.tolist(), block[:, :k].tolist()
        share = None
        if self.p_min > 0.0:
            top = np.take_along_axis(scores, best[..., None], axis=2)
            share = (1.0 / np.exp(scores.astype(np.float64) - top).sum(axis=2)).tolist()
        out: list[int] = []
        pred = 0
        for i in range(n):
            if share is not None and share[i][pred] < self.p_min:
                break
            pred = succ[i][pred]
            tok = int(toks[i][pred])
            if not 0 <= tok < self.n_vocab_target:
                break
            out.append(tok)
        return out

    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        k_max = self.n_max if n_max is None else min(self.n_max, int(n_max))
        if k_max <= 0:
            return []
        try:
            return self._draft(prompt, int(id_last), k_max)
        except BaseException:
            self.reset()  # a failed decode leaves the memory unknown: start over next time
            raise

    def _draft(self, hist: Sequence[int], id_last: int, k_max: int) -> list[int]:
        P = len(hist)
        lo = self._ok if hist is self._ok_hist and self._ok <= P else 0
        if lo < P:
            miss = np.flatnonzero(self._ktok[lo:P] != np.asarray(hist[lo:P], dtype=np.int64))
            if miss.size:  # positions decoded before this drafter saw them (a restored state)
                first = lo + int(miss[0])
                self._drop(first)
                self._tl.redecode(hist, first, P, self.observe)
        self._drop(P)  # the features of rejected drafts
        self._ok, self._ok_hist = P, hist
        first = self._first
        n_block = self.n_max + first
        if P + n_block > len(self._ktok):
            return []  # the block does not fit in the draft memory (n_ctx): no draft, as llama.cpp
        # DFlash2 reads its lattice, not logits: no outputs
        self._raw.decode([id_last] + [self.mask] * (n_block - 1), P, not self._top_k)
        self._n_mem = P + n_block
        try:
            if self._top_k:
                out = self._walk(n_block, min(self.n_max, k_max))
                return out if len(out) >= self.n_min else []
            ctx, k = self.ctx, self._topk
            conf = None
            if self._conf:
                ptr = self.bindings.llama_get_embeddings_nextn(ctx.ptr)
                if not ptr:
                    raise SpeculativeError("the DSpark draft returned no confidences")
                conf = float_view(ptr, n_block * self._n_embd)[::self._n_embd]
            out: list[int] = []
            for i in range(first, first + min(self.n_max, k_max)):
                if conf is not None and float(conf[i]) < self.p_min:
                    break
                logits = ctx.logits_ith(i)
                best = int(np.argmax(logits))
                if not self._dspark and self.p_min > 0.0:
                    top = np.partition(logits, -k)[-k:] if k < logits.shape[0] else logits
                    p = 1.0 / float(np.exp(top.astype(np.float64) - float(logits[best])).sum())
                    if p < self.p_min:
                        break
                if best >= self.n_vocab_target:
                    break
                out.append(best)
        finally:
            self._drop(P)  # the block is not the history
        if len(out) < self.n_min:
            return []
        return out


__all__ = ["DFlashDrafter", "check_draft_header"]

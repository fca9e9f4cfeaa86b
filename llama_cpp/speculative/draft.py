"""``draft-simple``: a separate, smaller draft model that shares the target's vocabulary.

The draft context mirrors the target's token history lazily: before each draft it drops what
differs from the target's memory (a suffix removal, or a rebuild when its memory cannot drop
that many positions), decodes the missing tokens and the pending one in one batch, then drafts
greedily one token per decode, stopping at ``draft_n_max`` tokens or when the top token's share
of the top 10 falls under ``draft_p_min`` (llama.cpp's top-k 10 draft sampler). Unlike
llama.cpp, the verified batch is not decoded a second time on the draft: the drafted tokens it
accepted are already in the draft memory.

:func:`check_vocab_files` applies llama.cpp's ``common_speculative_are_compatible`` rule to the
two GGUF headers before anything loads; :func:`check_vocab_compatible` applies it to loaded
vocabularies, for the pairs whose headers leave a BOS/EOS default undecided.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaContext
from .._core.model import LlamaModel
from .._errors import ModelLoadError, SpeculativeError
from .._safety.gguf_guard import read_vocab
from ..llama_cpp import LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
from .batch import RawBatch, SeqCheckpoint, check_snapshot_ubatch, common_prefix, top_k_share
from .drafter import DrafterBase
from .engine import warm_up

log = logging.getLogger("llama_cpp.speculative")

VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5   # token texts are compared from this id on
_TOP_K = 10


def _text(value: Any) -> bytes:
    if isinstance(value, int):
        return ctypes.string_at(value) if value else b""
    return value or b""


def check_vocab_compatible(target: Any, draft: Any, draft_path: str = "the draft model") -> None:
    """Raise :class:`SpeculativeError` unless ``draft`` can draft for ``target`` (two LlamaModels)."""
    C = target.bindings
    vt, vd = target.vocab, draft.vocab
    tt, td = int(C.llama_vocab_type(vt)), int(C.llama_vocab_type(vd))
    if tt != td:
        raise SpeculativeError(f"{draft_path} has vocabulary type {td}, the target {tt}: a draft model must use "
                               "the target's tokenizer")
    for what, add_fn, id_fn in (("BOS", "llama_vocab_get_add_bos", "llama_vocab_bos"),
                                ("EOS", "llama_vocab_get_add_eos", "llama_vocab_eos")):
        at, ad = bool(getattr(C, add_fn)(vt)), bool(getattr(C, add_fn)(vd))
        it, id_ = int(getattr(C, id_fn)(vt)), int(getattr(C, id_fn)(vd))
        if at != ad or (at and it != id_):
            raise SpeculativeError(
                f"{draft_path} handles the {what} token differently from the target (adds it: {ad} vs {at}; "
                f"id {id_} vs {it}): a draft model must share the target's special tokens")
    nt, nd = target.n_vocab, draft.n_vocab
    if abs(nt - nd) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise SpeculativeError(
            f"{draft_path} has {nd} tokens, the target {nt}: vocabularies may differ by at most "
            f"{VOCAB_MAX_SIZE_DIFFERENCE} tokens (llama.cpp's limit); use a draft from the target's model family")
    get = C.llama_vocab_get_text
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(nt, nd)):
        a, b = _text(get(vt, i)), _text(get(vd, i))
        if a != b:
            sa, sb = a.decode("utf-8", "replace"), b.decode("utf-8", "replace")
            raise SpeculativeError(
                f"token {i} is {sb!r} in {draft_path} but {sa!r} in the target: a draft model must use the "
                "target's vocabulary")


# tokenizer.ggml.model -> llama_vocab_type (src/llama-vocab.cpp, llama_vocab::impl::load)
_VOCAB_TYPES = {"no_vocab": 0, "none": 0, "llama": 1, "gpt2": 2, "hybriddna": 2, "whitespace": 2, "gemma4": 2,
                "bert": 3, "t5": 4, "rwkv": 5, "plamo2": 6, "test": 7}
# add_bos when the key is absent, by vocab type (BPE's depends on the pre-tokenizer: not listed)
_ADD_BOS_DEFAULT = {0: False, 1: True, 3: True, 4: False, 5: False, 6: False, 7: False}
_UGM = 4
_headers: dict[tuple[str, int, int], Any] = {}


def _vocab_header(path: str) -> Any:
    """:func:`~llama_cpp._safety.gguf_guard.read_vocab` of ``path``, remembered while the file is unchanged."""

    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    h = _headers.get(key)
    if h is None:
        if len(_headers) >= 4:
            _headers.clear()
        h = _headers[key] = read_vocab(path)
    return h


class _Effective:
    """What llama.cpp's vocabulary will answer for one header, where the header decides it.

    A value llama.cpp takes from a default that depends on the pre-tokenizer is a tuple naming
    that default: equal tuples are equal values, a tuple and a number are undecided."""

    def __init__(self, h: Any) -> None:
        self.type: int | None = _VOCAB_TYPES.get(h.model) if isinstance(h.model, str) else None
        self.model = h.model
        dflt = ("default", h.model, h.pre)
        if self.type == 0:  # llama.cpp stops reading a no_vocab model's tokenizer here
            self.n = int(h.n_vocab_key or 0)
            self.texts: list[bytes] = [b""] * self.n
            self.add_bos: Any = False
            self.add_eos: Any = False
            self.bos: Any = -1
            self.eos: Any = -1
            return
        self.texts = h.tokens if h.tokens is not None else []
        self.n = len(self.texts)
        gemma4 = "gemma4" in (h.model, h.pre)  # llama.cpp forces add_bos on for Gemma 4
        if isinstance(h.add_bos, bool):
            self.add_bos = h.add_bos or gemma4
        else:
            self.add_bos = True if gemma4 else _ADD_BOS_DEFAULT.get(self.type, dflt)  # type: ignore[arg-type]
        self.add_eos = h.add_eos if isinstance(h.add_eos, bool) else self.type == _UGM
        dflt_n = (*dflt, self.n)  # a default id beyond the vocabulary is disabled
        self.bos = h.bos_id if isinstance(h.bos_id, int) and 0 <= h.bos_id < self.n else dflt_n
        self.eos = h.eos_id if isinstance(h.eos_id, int) and 0 <= h.eos_id < self.n else dflt_n


def _same(a: Any, b: Any) -> bool | None:
    if a == b:
        return True
    return False if not isinstance(a, tuple) and not isinstance(b, tuple) else None


def _shown(v: Any) -> str:
    return "llama.cpp's default" if isinstance(v, tuple) else str(v)


def overrides_tokenizer(kv_overrides: Mapping[str, Any] | None) -> bool:
    """Whether ``kv_overrides`` (``Llama(kv_overrides=...)``) change any ``tokenizer.*`` key: then the
    GGUF header no longer says what the loaded vocabulary will be, and the draft's vocabulary is
    compared with the loaded target's instead."""
    return any(str(k).startswith("tokenizer.") for k in (kv_overrides or {}))


def check_vocab_files(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str]) -> bool:
    """llama.cpp's ``common_speculative_are_compatible`` on the two files' GGUF headers, before any
    native call: raise :class:`SpeculativeError` when they differ; True when they agree; False when
    the headers cannot decide (a BOS/EOS default that depends on the pre-tokenizer, an unknown
    tokenizer model, an unreadable header): then only the loaded vocabularies can tell."""

    dp = os.fspath(draft_path)
    try:
        t, d = _Effective(_vocab_header(os.fspath(target_path))), _Effective(_vocab_header(dp))
    except (OSError, ModelLoadError):
        return False
    if t.type is None or d.type is None:
        return False
    if t.type != d.type:
        raise SpeculativeError(f"{dp} has vocabulary type {d.type}, the target {t.type}: a draft model must use "
                               "the target's tokenizer")
    decided = True
    for what, at, ad, it, id_ in (("BOS", t.add_bos, d.add_bos, t.bos, d.bos),
                                  ("EOS", t.add_eos, d.add_eos, t.eos, d.eos)):
        same_add = _same(at, ad)
        same_id = _same(it, id_) if same_add and at is not False else True
        if same_add is False or (same_add and at is True and same_id is False):
            raise SpeculativeError(
                f"{dp} handles the {what} token differently from the target (adds it: {_shown(ad)} vs "
                f"{_shown(at)}; id {_shown(id_)} vs {_shown(it)}): a draft model must share the target's "
                "special tokens")
        decided = decided and same_add is True and same_id is True
    if abs(t.n - d.n) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise SpeculativeError(
            f"{dp} has {d.n} tokens, the target {t.n}: vocabularies may differ by at most "
            f"{VOCAB_MAX_SIZE_DIFFERENCE} tokens (llama.cpp's limit); use a draft from the target's model family")
    if "hybriddna" in (t.model, d.model):
        return False  # llama.cpp edits these token texts after reading them
    m = min(t.n, d.n)
    if t.texts[VOCAB_CHECK_START_TOKEN_ID:m] != d.texts[VOCAB_CHECK_START_TOKEN_ID:m]:
        for i in range(VOCAB_CHECK_START_TOKEN_ID, m):
            a, b = t.texts[i].split(b"\0", 1)[0], d.texts[i].split(b"\0", 1)[0]  # strcmp
            if a != b:
                sa, sb = a.decode("utf-8", "replace"), b.decode("utf-8", "replace")
                raise SpeculativeError(f"token {i} is {sb!r} in {dp} but {sa!r} in the target: a draft model "
                                       "must use the target's vocabulary")
    return decided


def check_draft_vocab(target: Any, path: str | os.PathLike[str]) -> None:
    """Refuse a draft for ``target`` (a loaded LlamaModel) whose vocabulary llama.cpp would refuse:
    on the GGUF headers, or on a vocab-only load of the draft when the headers cannot decide."""

    p = os.fspath(path)
    tp = getattr(target, "path_model", None)
    header_decides = not (overrides_tokenizer(getattr(target, "kv_overrides", None))
                          or getattr(target, "kv_overrides_unknown", False))
    if tp is not None and header_decides and check_vocab_files(tp, p):
        return
    with LlamaModel(p, vocab_only=True) as vocab:
        check_vocab_compatible(target, vocab, p)


def load_draft_model(target: Any, path: str | os.PathLike[str], **model_kwargs: Any) -> Any:
    """Load ``path`` as a draft for ``target`` once its vocabulary is known to fit (:func:`check_draft_vocab`)."""

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise SpeculativeError(f"draft_model_path {p!r} is not a file: give the path of a GGUF draft model")
    check_draft_vocab(target, p)
    return LlamaModel(p, **model_kwargs)


class DraftModel(DrafterBase):
    """The ``draft-simple`` drafter over its own model and context (owned by it)."""

    kind = "draft-simple"
    takes_limit = True  # draft() takes the step's token budget

    def __init__(self, target_model: Any, target_ctx: Any, path: str | os.PathLike[str], *, n_max: int,
                 n_min: int, p_min: float, ctx_params: Mapping[str, Any], n_gpu_layers: int = 0) -> None:

        self.n_max, self.n_min, self.p_min = int(n_max), int(n_min), float(p_min)
        self.model = self.ctx = self._batch = None
        self.model = load_draft_model(target_model, path, n_gpu_layers=n_gpu_layers)
        try:
            params = dict(ctx_params)
            params.update(n_ctx=target_ctx.n_ctx(), n_batch=target_ctx.n_batch(), n_ubatch=target_ctx.n_ubatch(),
                          n_seq_max=1, n_rs_seq=self.n_max, embeddings=False,
                          n_outputs_max=1, n_outputs_max_per_seq=1)  # one output row per draft decode
            params.pop("ctx_type", None)
            self.ctx = LlamaContext(self.model, **params)
            check_snapshot_ubatch(self.model, self.ctx, f"the draft context of {os.fspath(path)}")
            self._batch = RawBatch(self.ctx)
            warm_up(self.model, self.ctx, lambda toks: self._batch.decode(toks, 0, "last"))
        except BaseException:
            self.close()
            raise
        # a recurrent draft whose memory cannot drop a suffix (no n_rs_seq snapshots for its
        # architecture) rolls back to a checkpoint taken at the synced history each step
        self._ckpt = None
        self._ckpt_len = -1
        if (self.model.is_recurrent() or self.model.is_hybrid()) and int(self.model.bindings.llama_n_rs_seq(self.ctx.ptr)) == 0:
            self._ckpt = SeqCheckpoint(self.ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        self.n_vocab_target = int(target_model.n_vocab)
        self._n_vocab_draft = int(self.model.n_vocab)
        self._topk = min(_TOP_K, self.model.n_vocab)
        self.kv_tokens: list[int] = []  # tokens in the draft memory, positions 0..len-1

    def close(self) -> None:
        for name in ("_batch", "ctx", "model"):  # the batch first: it points into the context
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    def reset(self) -> None:
        if self.ctx is not None:
            self.ctx.memory_clear(True)
        self.kv_tokens = []
        self._ckpt_len = -1

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def accept(self, n_accepted: int) -> None:
        pass

    def sync(self, prompt: Sequence[int]) -> int:
        """Make the draft memory a prefix of ``prompt``; return its length (``kv_tokens`` holds it; the media
        drafter syncs around image spans with this and :meth:`decode_at`)."""
        kv = self.kv_tokens
        L = common_prefix(kv, prompt)
        if L < len(kv):
            if L > 0 and self.ctx.seq_rm(0, L, -1):
                del kv[L:]
            elif 0 <= self._ckpt_len <= L and self._ckpt is not None:
                self._ckpt.restore()
                if not self.ctx.seq_rm(0, self._ckpt_len, -1):
                    raise SpeculativeError("the draft context could not clear its memory after a checkpoint restore")
                del kv[self._ckpt_len:]
                L = self._ckpt_len
            else:
                self.ctx.memory_clear(True)
                kv.clear()
                L = 0
        self._ckpt_len = -1
        return L

    def decode_at(self, tokens: Sequence[int], pos0: int) -> None:
        """Decode ``tokens`` at ``pos0..``; the last one is an output."""
        self._batch.decode(tokens, pos0, "last")
        self.kv_tokens.extend(tokens)

    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        k_max = self.n_max if n_max is None else min(self.n_max, int(n_max))
        if k_max <= 0:
            return []
        try:
            return self._draft(prompt, int(id_last), k_max)
        except BaseException:
            self.reset()  # a failed decode leaves the memory unknown: start over next time
            raise

    def _draft(self, prompt: list[int], id_last: int, k_max: int) -> list[int]:
        L = self.sync(prompt)
        new = list(prompt[L:]) + [id_last]
        if min(new) < 0 or (self._n_vocab_draft < self.n_vocab_target and max(new) >= self._n_vocab_draft):
            return []  # media positions, or a token the draft's (smaller) vocabulary lacks
        if self._ckpt is not None:
            if len(new) > 1:
                self.decode_at(new[:-1], L)
            self._ckpt.save()  # the memory holds the whole history: a prefix of every later one
            self._ckpt_len = len(self.kv_tokens)
            self.decode_at(new[-1:], len(self.kv_tokens))
        else:
            self.decode_at(new, L)
        out: list[int] = []
        ctx, k = self.ctx, self._topk
        while True:
            logits = ctx.logits_ith(-1)
            best = int(np.argmax(logits))
            if self.p_min > 0.0 and top_k_share(logits, best, k) < self.p_min:
                break
            if best >= self.n_vocab_target:
                break  # a token the target does not have (vocabularies may differ in size)
            out.append(best)
            if len(out) >= k_max:
                break
            self.decode_at([best], len(self.kv_tokens))
        if len(out) < self.n_min:
            return []
        return out


__all__ = ["DraftModel", "check_draft_vocab", "check_vocab_compatible", "check_vocab_files", "load_draft_model",
           "overrides_tokenizer"]

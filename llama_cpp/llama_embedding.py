"""``LlamaEmbedding``: batched sentence embeddings and reranking on llama.cpp.

Many inputs are packed into one ``llama_decode`` (one sequence id per input, up to ``n_batch``
tokens and ``n_seq_max`` sequences per call), like llama.cpp's ``llama-embedding``. Rows are
``llama_model_n_embd_out`` wide; results are NumPy ``float32`` arrays.

Normalisation follows llama.cpp's ``--embd-normalize`` convention
(:func:`llama_cpp._core.normalize.normalize_embeddings`; 2, L2, by default).

Length limits: an input longer than the model can take in one pass (``n_ubatch`` for non-causal
models such as BERT, ``n_batch`` otherwise, and never more than the model's training context,
which bounds BERT's position table) raises :class:`~llama_cpp.ContextOverflowError` with
``truncate=False``; with ``truncate=True`` (the default) its tokens beyond the limit are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._core.context import LlamaBatch, LlamaContext
from ._core.model import LlamaModel, flash_attn_type
from ._core.normalize import normalize_embeddings
from ._core.ownership import float_view
from ._errors import ClosedError, ContextOverflowError, LlamaError, MultimodalError, TokenizationError
from ._placement import isolation as _isolation
from ._placement.load import prepare as _place
from ._safety import checks as _checks
from ._safety.call_guard import CallGuard, serialized
from .llama_cpp import (
    LLAMA_ATTENTION_TYPE_UNSPECIFIED,
    LLAMA_POOLING_TYPE_CLS,
    LLAMA_POOLING_TYPE_LAST,
    LLAMA_POOLING_TYPE_MEAN,
    LLAMA_POOLING_TYPE_NONE,
    LLAMA_POOLING_TYPE_RANK,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
)

POOLING_TYPES: dict[str, int] = {
    "unspecified": LLAMA_POOLING_TYPE_UNSPECIFIED, "none": LLAMA_POOLING_TYPE_NONE, "mean": LLAMA_POOLING_TYPE_MEAN,
    "cls": LLAMA_POOLING_TYPE_CLS, "last": LLAMA_POOLING_TYPE_LAST, "rank": LLAMA_POOLING_TYPE_RANK}
PACK_TOKENS = 256  # default tokens per decode when inputs are short (see embed_token_lists)


def _pooling_value(pooling: int | str | None) -> int:
    if pooling is None:
        return LLAMA_POOLING_TYPE_UNSPECIFIED
    if isinstance(pooling, str):
        key = pooling.lower()
        if key not in POOLING_TYPES:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_TYPES)}")
        return POOLING_TYPES[key]
    value = int(pooling)
    if value not in POOLING_TYPES.values():
        raise ValueError(f"pooling_type {value} is not a llama_pooling_type (-1..4)")
    return value


def input_limit(ctx: LlamaContext, model: LlamaModel) -> int:
    """The most tokens one input may have in this context (see the module docstring)."""
    limit = ctx.n_batch()
    if not ctx.causal_attn():
        limit = min(limit, ctx.n_ubatch())
    n_train = model.n_ctx_train()
    if n_train > 0:
        limit = min(limit, n_train)
    return limit


def rank_token_lists(model: LlamaModel, query: str, documents: Sequence[str]) -> list[list[int]]:
    """Token ids of each (query, document) pair for a reranker, as ``llama-embedding`` builds them: the
    model's ``rerank`` template, else query, EOS and SEP (where the vocabulary adds them) and document."""
    template = model.chat_template("rerank")
    out = []
    if template:
        for d in documents:
            text = template.replace("{query}", query).replace("{document}", d)
            out.append(model.tokenize(text, add_special=True, parse_special=True))
        return out
    eos = model.token_text(model.token_eos()) if model.add_eos() and model.token_eos() >= 0 else ""
    sep = model.token_text(model.token_sep()) if model.add_sep() and model.token_sep() >= 0 else ""
    for d in documents:
        out.append(model.tokenize(query + eos + sep + d, add_special=True, parse_special=True))
    return out


def embed_token_lists(ctx: LlamaContext, model: LlamaModel, token_lists: Sequence[Sequence[int]], *,
                      normalize: int = 2, truncate: bool = True, width: int | None = None,
                      pack_tokens: int | None = None) -> tuple[Any, list[int]]:
    """Embed tokenized inputs, packing many per decode (up to ``pack_tokens`` tokens, or the
    longest input, within ``n_batch``).

    Returns ``(rows, counts)``: a float32 ``(n_inputs, width)`` array for pooled contexts, or a
    list of ``(n_tokens_i, n_embd_out)`` arrays for pooling NONE; ``counts`` are the tokens used.
    """
    if not ctx.embeddings_enabled:
        raise LlamaError("the context was created without embeddings=True")
    pooling = ctx.pooling_type()
    n_out = ctx.n_embd_out()
    if width is None:
        width = model.n_cls_out() if pooling == LLAMA_POOLING_TYPE_RANK else n_out
    limit = input_limit(ctx, model)
    inputs: list[np.ndarray] = []
    for i, toks in enumerate(token_lists):
        arr = np.asarray(toks, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"input {i}: token ids must be a flat sequence")
        if arr.size == 0:
            raise ValueError(f"input {i} is empty (no tokens): embeddings need at least one token")
        bad = np.nonzero((arr < 0) | (arr >= model.n_vocab))[0]
        if bad.size:
            raise TokenizationError(f"input {i}: token id {int(arr[bad[0]])} at position {int(bad[0])} is outside "
                                    f"the vocabulary [0, {model.n_vocab})")
        if arr.size > limit:
            if not truncate:
                raise ContextOverflowError(
                    f"input {i} has {arr.size} tokens; this model takes at most {limit} per input "
                    "(pass truncate=True to cut it, or raise n_batch/n_ubatch up to the model's context)")
            arr = arr[:limit]
        inputs.append(arr.astype(np.int32))

    n_batch = ctx.n_batch()
    if not ctx.causal_attn():
        n_batch = min(n_batch, ctx.n_ubatch())
    # Attention over a packed batch costs O(tokens^2) per decode (sequences are masked, not
    # skipped), so the total cost grows with the tokens per decode: pack only as many as the
    # longest input needs (at least PACK_TOKENS) instead of filling n_batch.
    longest = max((len(t) for t in inputs), default=1)
    n_batch = min(n_batch, max(PACK_TOKENS if pack_tokens is None else int(pack_tokens), longest))
    n_seq_max = ctx.n_seq_max()
    pooled = pooling != LLAMA_POOLING_TYPE_NONE
    out_pooled = np.zeros((len(inputs), width), dtype=np.float32) if pooled else None
    out_tokens: list[np.ndarray] = []
    batch = LlamaBatch(n_batch, 0, 1)
    C = ctx.bindings
    try:
        first = 0  # index of the first input in the current batch
        pending: list[int] = []

        def flush() -> None:
            if not pending:
                return
            ctx.memory_clear(True)
            ctx.decode(batch)
            if pooled:
                for s, k in enumerate(pending):
                    out_pooled[k] = ctx.embeddings_seq(s, width)
            else:
                allrows = float_view(C.llama_get_embeddings(ctx.ptr), batch.n_tokens * n_out)
                if allrows is None:
                    raise LlamaError("llama.cpp returned no token embeddings")
                allrows = allrows.reshape(batch.n_tokens, n_out)
                off = 0
                for k in pending:
                    n = len(inputs[k])
                    out_tokens.append(np.array(allrows[off:off + n], dtype=np.float32))
                    off += n
            batch.clear()
            pending.clear()

        for k, toks in enumerate(inputs):
            if batch.n_tokens + len(toks) > n_batch or len(pending) >= n_seq_max:
                flush()
                first = k
            batch.add_sequence(toks, seq_id=len(pending), start_pos=0, logits=True)
            pending.append(k)
        flush()
        del first
    finally:
        batch.close()
        ctx.memory_clear(True)
    counts = [len(t) for t in inputs]
    if pooled:
        rows: Any = normalize_embeddings(out_pooled, normalize) if normalize != -1 else out_pooled
    else:
        rows = [normalize_embeddings(r, normalize) if normalize != -1 else r for r in out_tokens]
    return rows, counts


class LlamaEmbedding:
    """A model opened for embeddings (or reranking with RANK pooling).

    ``pooling_type`` overrides the model's pooling (``"mean"``, ``"cls"``, ``"last"``, ``"none"``,
    ``"rank"`` or the enum value). Up to ``n_seq_max`` inputs and ``n_batch`` tokens go into one
    decode; ``pack_tokens`` (default 256, or the longest input) bounds the tokens actually packed,
    since attention over a packed batch costs the square of its size;
    ``n_ctx`` defaults to ``n_batch`` (at most the model's training context). Flash attention is off by default: its CPU kernel's rounding
    depends on how many inputs share a batch, and embeddings should not (``flash_attn=None`` is
    llama.cpp's auto). ``tensor_split``, ``devices``, ``cpu_moe``, ``n_cpu_moe``, ``override_tensor`` and
    ``rpc_servers`` place the weights as in :class:`~llama_cpp.Llama`, and ``fit`` (with ``fit_target``,
    ``fit_ctx``) fits them to the devices' free memory as there, measuring the context this class makes;
    with ``n_ctx=0`` the fit chooses the context, at most ``n_batch``. With ``rpc_servers`` the model runs
    in a worker process, as a ``Llama``'s (a :class:`LlamaEmbeddingWorker` is returned; a lost server is
    :class:`~llama_cpp.WorkerLostError`, ``reload()`` loads again); ``rpc_isolation=False`` loads here.

    Thread safety: one instance may be shared between threads; its calls run one at a time, and
    ``close()`` waits for a running one.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> LlamaEmbedding:
        if cls is LlamaEmbedding and _isolation.wanted(kwargs):
            cls = LlamaEmbeddingWorker
        return super().__new__(cls)

    def __init__(self, model_path: str | os.PathLike[str], *,
                 pooling_type: int | str | None = LLAMA_POOLING_TYPE_UNSPECIFIED, n_batch: int = 2048, n_ctx: int | None = None, n_seq_max: int | None = None,
                 n_threads: int | None = None, n_threads_batch: int | None = None, n_gpu_layers: int = 0,
                 main_gpu: int = 0, use_mmap: bool = True, use_mlock: bool = False,
                 kv_overrides: dict[str, Any] | None = None, flash_attn: bool | None = False,
                 attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED,
                 progress_callback: Callable[[float], Any] | None = None,
                 pack_tokens: int | None = None, mmproj_path: str | os.PathLike[str] | None = None,
                 verbose: bool = False, tensor_split: list[float] | None = None, devices: list[str] | None = None,
                 cpu_moe: bool = False, n_cpu_moe: int = 0, override_tensor: str | list[str] | None = None,
                 rpc_servers: str | None = None, fit: bool = False, fit_target: int | str | list[int] | None = None,
                 fit_ctx: int | None = None, rpc_isolation: bool = True) -> None:
        if not isinstance(rpc_isolation, bool):
            raise TypeError(f"rpc_isolation must be a bool, not {type(rpc_isolation).__name__}")
        self._guard = CallGuard("LlamaEmbedding")
        self.pack_tokens = pack_tokens
        self.mmproj_path = None if mmproj_path is None else os.fspath(mmproj_path)
        self._mm: Any = None  # MTMDEmbeddingHandler, created on the first embed_multimodal
        self._ctx: LlamaContext | None = None
        self._model: LlamaModel | None = None
        self.model_path = os.fspath(model_path)
        _checks.model_params(n_gpu_layers=n_gpu_layers, main_gpu=main_gpu)
        _checks.context_sizes(n_ctx=0 if n_ctx is None else n_ctx, n_batch=n_batch, n_ubatch=n_batch)
        # the fit measures the context made below: n_ubatch = n_batch, raised to n_ctx
        fit_ctx_size = int(n_batch) if n_ctx is None else int(n_ctx)
        fit_batch = max(int(n_batch), fit_ctx_size)
        placed = _place({"model_path": self.model_path, "n_gpu_layers": n_gpu_layers, "tensor_split": tensor_split,
                         "devices": devices, "cpu_moe": cpu_moe, "n_cpu_moe": n_cpu_moe,
                         "override_tensor": override_tensor, "rpc_servers": rpc_servers, "fit": fit,
                         "fit_target": fit_target, "fit_ctx": fit_ctx, "n_ctx": fit_ctx_size, "n_batch": fit_batch,
                         "n_ubatch": fit_batch, "n_seq_max": n_seq_max, "kv_unified": True, "flash_attn": flash_attn})
        if placed.fit is not None and n_ctx == 0:
            # the fit's context, at most one batch (an input must fit one): the batches it measured stay
            n_ctx = min(placed.n_ctx, int(n_batch))
        self._model = LlamaModel(model_path, main_gpu=main_gpu, use_mmap=use_mmap, use_mlock=use_mlock,
                                 kv_overrides=kv_overrides, progress_callback=progress_callback,
                                 **placed.model_kwargs())
        try:
            C = self._model.bindings
            if self._model.has_encoder() and self._model.has_decoder():
                raise LlamaError("embeddings from encoder-decoder models are not supported (as in llama.cpp)")
            if n_ctx is None:
                n_train = self._model.n_ctx_train()
                n_ctx = min(n_batch, n_train) if n_train > 0 else n_batch
            elif n_ctx == 0:
                n_ctx = self._model.n_ctx_train()
            n_batch = max(int(n_batch), int(n_ctx))
            if n_seq_max is None:
                n_seq_max = int(C.llama_max_parallel_sequences())
            n_seq_max = max(1, min(int(n_seq_max), n_batch))
            while n_batch % n_seq_max:  # mean pooling needs n_ubatch to be a multiple of it
                n_seq_max -= 1
            cpu = os.cpu_count() or 1
            fa = flash_attn_type(flash_attn)
            self._ctx = LlamaContext(
                self._model, n_ctx=int(n_ctx), n_batch=n_batch, n_ubatch=n_batch, n_seq_max=int(n_seq_max),
                n_threads=n_threads or cpu, n_threads_batch=n_threads_batch or n_threads or cpu,
                embeddings=True, pooling_type=_pooling_value(pooling_type), attention_type=int(attention_type),
                kv_unified=True, flash_attn_type=fa)
        except BaseException:
            self.close()
            raise

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Free the model and context now (idempotent; waits for a running call)."""
        with self._guard.lock:
            self._free()

    def _free(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def __enter__(self) -> LlamaEmbedding:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _parts(self) -> tuple[LlamaContext, LlamaModel]:
        if self._ctx is None or self._model is None:

            raise ClosedError("this LlamaEmbedding is closed; create a new one")
        return self._ctx, self._model

    # -- properties ---------------------------------------------------------------------------
    @property
    def pooling_type(self) -> int:
        return self._parts()[0].pooling_type()

    @property
    def n_embd_out(self) -> int:
        return self._parts()[1].n_embd_out()

    def n_ctx(self) -> int:
        """The context size (tokens), as :meth:`Llama.n_ctx <llama_cpp.Llama.n_ctx>`."""
        return self._parts()[0].n_ctx()

    @property
    def max_input_tokens(self) -> int:
        ctx, model = self._parts()
        return input_limit(ctx, model)

    @property
    def metadata(self) -> dict[str, str]:
        return self._parts()[1].metadata

    @serialized(during_stream=True)
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._parts()[1].tokenize(text, add_special=add_special, parse_special=parse_special)

    # -- embeddings -----------------------------------------------------------------------------
    @serialized()
    def embed(self, input: str | Sequence[str] | Sequence[Sequence[int]], *, normalize: int = 2,
              truncate: bool = True, return_count: bool = False) -> Any:
        """Embed text (or pre-tokenized inputs).

        Returns a float32 ``(n_inputs, n_embd_out)`` array (one row for a single string), or with
        pooling NONE a list of ``(n_tokens, n_embd_out)`` arrays. ``return_count`` adds the number
        of tokens processed.
        """
        ctx, model = self._parts()
        if ctx.pooling_type() == LLAMA_POOLING_TYPE_RANK:
            raise LlamaError("this model pools with RANK (a reranker): use rank(query, documents)")
        single = isinstance(input, (str, bytes))
        items = [input] if single else list(input)
        if not items:
            raise ValueError("no inputs given")
        token_lists = []
        for i, it in enumerate(items):
            if isinstance(it, (str, bytes)):
                token_lists.append(model.tokenize(it, add_special=True, parse_special=True))
            elif isinstance(it, (list, tuple, np.ndarray)):
                token_lists.append(list(it))
            else:
                raise TypeError(f"input {i} must be a string or a list of token ids, not {type(it).__name__}")
        rows, counts = embed_token_lists(ctx, model, token_lists, normalize=normalize, truncate=truncate,
                                         pack_tokens=self.pack_tokens)
        result: Any = rows[0] if single else rows
        return (result, int(sum(counts))) if return_count else result

    @serialized()
    def embed_multimodal(self, inputs: Any, *, normalize: float = 2, pooling: int | str | None = None,
                         add_special: bool = True, parse_special: bool = False,
                         mmproj_path: str | os.PathLike[str] | None = None) -> np.ndarray:
        """Pooled float32 rows ``(n_inputs, n_embd_out)`` of text + image + audio inputs.

        Needs a projector: ``mmproj_path`` here or in the constructor. Inputs are lists of parts or
        marker prompts, as :meth:`llama_cpp.mtmd.MTMDEmbeddingHandler.embed` documents; pooling
        defaults to this model's pooling type.
        """
        _, model = self._parts()
        path = os.fspath(mmproj_path) if mmproj_path is not None else self.mmproj_path
        if path is None:

            raise MultimodalError("embed_multimodal needs a projector: pass mmproj_path=<mmproj.gguf> "
                                  "here or to LlamaEmbedding(...)")
        if self._mm is None or os.path.abspath(path) != os.path.abspath(self.mmproj_path or ""):
            from .mtmd import MTMDEmbeddingHandler

            if self._mm is not None:
                self._mm.close()
                self._mm = None
            self._mm = MTMDEmbeddingHandler(model, path)
            self.mmproj_path = path
        return self._mm.embed(inputs, normalize=normalize, pooling=pooling, add_special=add_special,
                              parse_special=parse_special)

    @serialized()
    def rank_inputs(self, query: str, documents: Sequence[str]) -> list[list[int]]:
        """Token ids of each (query, document) pair, as ``llama-embedding`` builds them."""
        _, model = self._parts()
        return rank_token_lists(model, query, documents)

    @serialized()
    def rank(self, query: str, documents: Sequence[str], *, truncate: bool = True) -> np.ndarray:
        """Reranker scores of each document for ``query`` (RANK pooling): shape ``(n_docs,)``, or
        ``(n_docs, n_cls_out)`` for multi-label heads. Raw scores, not normalised."""
        ctx, model = self._parts()
        if ctx.pooling_type() != LLAMA_POOLING_TYPE_RANK:
            raise LlamaError("rank() needs a reranking model (pooling RANK); this context pools with "
                             f"{ctx.pooling_type()}: open it with pooling_type='rank' if the model has a head")
        if isinstance(documents, str):
            documents = [documents]
        if not documents:
            raise ValueError("no documents to rank")
        rows, _ = embed_token_lists(ctx, model, self.rank_inputs(query, documents), normalize=-1, truncate=truncate,
                                    pack_tokens=self.pack_tokens)
        return rows[:, 0].copy() if rows.shape[1] == 1 else rows

    @serialized()
    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """OpenAI-style response (L2-normalised rows)."""
        items = [input] if isinstance(input, str) else list(input)
        rows, total = self.embed(items, return_count=True)
        data = [{"object": "embedding", "index": i, "embedding": np.asarray(r).tolist()} for i, r in enumerate(rows)]
        return {"object": "list", "data": data, "model": model or self.model_path,
                "usage": {"prompt_tokens": total, "total_tokens": total}}


class LlamaEmbeddingWorker(_isolation.InWorker, LlamaEmbedding):
    """A :class:`LlamaEmbedding` whose model runs in a worker process it owns: what
    ``LlamaEmbedding(..., rpc_servers=...)`` returns (see :class:`~llama_cpp.LlamaWorker`)."""

    _factory = LlamaEmbedding
    _methods = _isolation.EMBEDDING_METHODS
    _attributes = _isolation.EMBEDDING_ATTRIBUTES


__all__ = ["POOLING_TYPES", "LlamaEmbedding", "LlamaEmbeddingWorker", "embed_token_lists", "rank_token_lists"]

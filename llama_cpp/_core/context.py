"""The context (:class:`LlamaContext`: decode, logits, memory, state; :class:`CpuThreadpool`) and the
batches it decodes: :class:`LlamaBatch` (checked: every id and row is validated against the context)
and :class:`LlamaBatchExtNative` (the extended batch of embedding rows, for M-RoPE and drafts).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import (
    ClosedError,
    ContextError,
    ContextOverflowError,
    DecodeError,
    LlamaError,
    TokenizationError,
)
from .._safety import checks as _checks
from ..llama_cpp import (
    LLAMA_CONTEXT_TYPE_MTP,
    LLAMA_POOLING_TYPE_MEAN,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
)
from .model import LlamaLoraAdapter, LlamaModel, struct_copy
from .ownership import Owned, float_view, log, native_lib

# --------------------------------------------------------------------------------------------
# context
# --------------------------------------------------------------------------------------------

_DECODE_ERRORS = {
    1: "no KV-cache slot for the batch: increase n_ctx or submit a smaller batch",
    2: "aborted by the abort callback",
    -1: "invalid input batch (see llama.cpp's log for the reason)",
}

CONTEXT_PARAM_NAMES = (
    "n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_rs_seq", "n_outputs_max", "n_outputs_max_per_seq",
    "n_threads", "n_threads_batch", "ctx_type", "rope_scaling_type", "pooling_type", "attention_type",
    "flash_attn_type", "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
    "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "type_k", "type_v", "embeddings",
    "offload_kqv", "no_perf", "op_offload", "swa_full", "kv_unified",
)


class CpuThreadpool(Owned):
    """A persistent ggml CPU threadpool (``ggml_threadpool_new`` from the CPU backend's registry).

    Without one, ggml starts and joins worker threads on every graph computation; llama.cpp's own
    tools attach a pool to each context, and so does :class:`LlamaContext` (that is what makes
    single-token decoding as fast as ``llama-completion`` when ``n_threads > 1``).
    """

    _kind = "threadpool"
    _fns: Any = None

    @classmethod
    def _functions(cls) -> Any:
        if cls._fns is None:
            native_lib()
            from .. import ggml_cpp as G

            dev = G.ggml_backend_dev_by_type(G.GGML_BACKEND_DEVICE_TYPE_CPU)
            if not dev:
                cls._fns = False
                return cls._fns
            reg = G.ggml_backend_dev_backend_reg(dev)
            new = G.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_new")
            free = G.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_free")
            if not new or not free:
                cls._fns = False
                return cls._fns
            new_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(G.ggml_threadpool_params))
            free_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
            cls._fns = (G, new_t(new), free_t(free))
        return cls._fns

    @classmethod
    def available(cls) -> bool:
        return bool(cls._functions())

    def __init__(self, n_threads: int, paused: bool = False) -> None:
        self._ref = None
        fns = self._functions()
        if not fns:
            raise LlamaError("the CPU backend does not export ggml_threadpool_new")
        G, new, free = fns
        params = G.ggml_threadpool_params_default(int(n_threads))
        params.paused = bool(paused)
        ptr = new(ctypes.byref(params))
        if not ptr:
            raise LlamaError(f"ggml_threadpool_new failed for {n_threads} threads")
        self._own(ptr, free)
        self.n_threads = int(n_threads)


class LlamaContext(Owned):
    """A ``llama_context`` over a :class:`LlamaModel` (keeps the model alive while it exists).

    Keyword arguments are fields of ``llama_context_params`` (see :data:`CONTEXT_PARAM_NAMES`);
    unset fields keep llama.cpp's defaults. ``ctx_other`` takes another LlamaContext (MTP drafts).

    llama-cpp-python's form ``LlamaContext(model=..., params=llama_context_default_params())``
    works too: the struct is copied and every field of :data:`CONTEXT_PARAM_NAMES` in it is checked
    as the keywords are. Such a context closes when its model closes, as there.
    """

    _kind = "context"

    def __init__(self, model: LlamaModel, *, ctx_other: LlamaContext | None = None, params: Any = None,
                 verbose: bool = True, **fields: Any) -> None:
        self._ref = None
        if model.vocab_only:
            raise ContextError("this model was opened with vocab_only=True: it has no weights to run; "
                               "reopen it without vocab_only to create a context")
        C = model.bindings
        unknown = set(fields) - set(CONTEXT_PARAM_NAMES)
        if unknown:
            raise TypeError(f"unknown context parameter(s): {', '.join(sorted(unknown))}")
        if params is not None:
            if fields:
                raise TypeError(f"pass either params= or the keyword fields, not both "
                                f"(got params and {', '.join(sorted(fields))})")
            cp = struct_copy(C, C.llama_context_params, params, "llama_context_default_params")
            fields = {name: getattr(cp, name) for name in CONTEXT_PARAM_NAMES}
            self._caller_params = params  # keeps what its pointer fields (callbacks) point at alive
        else:
            cp = C.llama_context_default_params()
        self.verbose = bool(verbose)
        for name, value in fields.items():
            if value is not None:
                if name in ("n_threads", "n_threads_batch"):
                    value = _checks.threads(name, value)
                else:
                    value = _checks.struct_field(type(cp), name, value)
                setattr(cp, name, value)
        parents = [model.native_ref]
        if ctx_other is not None:
            cp.ctx_other = ctx_other.ptr
            parents.append(ctx_other.native_ref)
        n_seq_max = int(cp.n_seq_max)
        max_seq = int(C.llama_max_parallel_sequences())
        if not 1 <= n_seq_max <= max_seq:
            raise ContextError(f"n_seq_max={n_seq_max} is out of range [1, {max_seq}]")
        if int(cp.n_ubatch) > int(cp.n_batch) and int(cp.n_batch) > 0:
            cp.n_ubatch = cp.n_batch
        pooling = int(cp.pooling_type)
        if pooling == LLAMA_POOLING_TYPE_UNSPECIFIED:
            pooling = model.pooling_from_metadata()
        ub = int(cp.n_ubatch)
        if bool(cp.embeddings) and pooling == LLAMA_POOLING_TYPE_MEAN and n_seq_max > 1 and ub % n_seq_max:
            # llama.cpp rounds the reserve graph up to a multiple of n_seq_max and then aborts in
            # the mean-pooling matmul
            raise ContextError(f"mean pooling needs n_ubatch ({ub}) to be a multiple of n_seq_max ({n_seq_max}): "
                               "change one of them")
        ptr = C.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise ContextError(
                "llama.cpp could not create a context with these parameters (out of memory, or an "
                "unsupported combination such as a quantized V cache without flash attention)")
        pools = self._threadpools(int(cp.n_threads), int(cp.n_threads_batch))
        self._own(ptr, C.llama_free, parents + [p.native_ref for p in pools])
        if pools:
            tp, tpb = pools[0], (pools[1] if len(pools) > 1 else None)
            C.llama_attach_threadpool(ptr, tp.ptr, tpb.ptr if tpb is not None else None)
        for p in pools:
            p.close()  # freed once this context (their last user) is freed
        self.bindings = C
        # llama_decode/llama_encode/llama_process calls that succeeded (the server's n_decode_total); raw
        # decodes elsewhere add theirs (the generation loop's)
        self.n_decode = 0
        self.model = model.native_ref  # the native model; the wrapper may be closed by its owner
        self._model = model
        self.params = cp
        self._n_vocab = model.n_vocab
        self._n_ctx = int(C.llama_n_ctx(ptr))
        self._n_batch = int(C.llama_n_batch(ptr))
        self._n_ubatch = int(C.llama_n_ubatch(ptr))
        self._n_seq_max = int(C.llama_n_seq_max(ptr))
        self._mem = C.llama_get_memory(ptr)
        self.embeddings_enabled = bool(cp.embeddings)
        self._pooling = int(C.llama_pooling_type(ptr))
        self._n_embd_out = int(C.llama_model_n_embd_out(model.ptr))
        self._n_embd_inp = int(C.llama_model_n_embd_inp(model.ptr))
        self.ctx_type = int(cp.ctx_type)
        self.n_pos_per_embd = model.n_pos_per_embd()
        if params is not None:
            model.close_with(self)

    # -- llama-cpp-python's names -------------------------------------------------------------
    @property
    def ctx(self) -> Any:
        """The native ``llama_context`` pointer; None once closed (llama-cpp-python's attribute)."""
        ref = self._ref
        return None if ref is None else ref.ptr

    @property
    def memory(self) -> Any:
        return None if self.ctx is None else self._mem

    @staticmethod
    def default_params() -> Any:
        """``llama_context_default_params()`` (llama-cpp-python's helper)."""
        return native_lib().llama_context_default_params()

    def kv_cache_clear(self) -> None:
        self.memory_clear(True)

    def kv_cache_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return self.seq_rm(seq_id, p0, p1)

    def kv_cache_seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int, p1: int) -> None:
        self.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def kv_cache_seq_keep(self, seq_id: int) -> None:
        self.seq_keep(seq_id)

    def kv_cache_seq_shift(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        self.seq_add(seq_id, p0, p1, shift)

    def get_state_size(self) -> int:
        return int(self.bindings.llama_state_get_size(self._ptr()))

    def get_logits_ith(self, i: int) -> np.ndarray:
        return self.logits_ith(i)

    def get_embeddings_ith(self, i: int) -> np.ndarray:
        return self.embeddings_ith(i)

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        return self.embeddings_seq(seq_id)

    def reset_timings(self) -> None:
        self.perf_reset()

    @staticmethod
    def _threadpools(n_threads: int, n_threads_batch: int) -> list[CpuThreadpool]:
        """The pools llama.cpp's tools attach: one for generation, one for batches if sizes differ."""
        if n_threads <= 1 and n_threads_batch <= 1:
            return []
        try:
            if not CpuThreadpool.available():
                return []
            if n_threads == n_threads_batch:
                return [CpuThreadpool(n_threads)]
            batch = CpuThreadpool(n_threads_batch)
            return [CpuThreadpool(n_threads, paused=True), batch]
        except LlamaError as exc:
            log.warning("running without a persistent CPU threadpool: %s", exc)
            return []

    # sizes, as the context resolved them
    def n_ctx(self) -> int:
        self._ptr()
        return self._n_ctx

    def n_ctx_seq(self) -> int:
        return int(self.bindings.llama_n_ctx_seq(self._ptr()))

    def n_batch(self) -> int:
        self._ptr()
        return self._n_batch

    def n_ubatch(self) -> int:
        self._ptr()
        return self._n_ubatch

    def n_seq_max(self) -> int:
        self._ptr()
        return self._n_seq_max

    def n_vocab(self) -> int:
        return self._n_vocab

    def n_embd_out(self) -> int:
        return self._n_embd_out

    def n_embd_inp(self) -> int:
        """Width of an input embedding row (``n_embd_out`` for an MTP context)."""
        return self._n_embd_out if self.ctx_type == LLAMA_CONTEXT_TYPE_MTP else self._n_embd_inp

    def pooling_type(self) -> int:
        self._ptr()
        return self._pooling

    def causal_attn(self) -> bool:
        return bool(self.bindings.llama_get_causal_attn(self._ptr()))

    def set_causal_attn(self, value: bool) -> None:
        self.bindings.llama_set_causal_attn(self._ptr(), bool(value))

    def set_embeddings(self, value: bool) -> None:
        self.bindings.llama_set_embeddings(self._ptr(), bool(value))
        self.embeddings_enabled = bool(value)

    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        self.bindings.llama_set_n_threads(self._ptr(), int(n_threads), int(n_threads_batch))

    def synchronize(self) -> None:
        self.bindings.llama_synchronize(self._ptr())

    # -- memory -------------------------------------------------------------------------------
    def _check_seq(self, seq_id: int, allow_negative: bool = False) -> None:
        if allow_negative and seq_id < 0:
            return
        if not 0 <= seq_id < self._n_seq_max:
            raise ValueError(f"sequence id {seq_id} is outside [0, n_seq_max={self._n_seq_max})")

    def memory_clear(self, data: bool = True) -> None:
        self._ptr()
        self.bindings.llama_memory_clear(self._mem, bool(data))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self._ptr()
        self._check_seq(seq_id, allow_negative=True)
        return bool(self.bindings.llama_memory_seq_rm(self._mem, int(seq_id), int(p0), int(p1)))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._ptr()
        self._check_seq(src)
        self._check_seq(dst)
        self.bindings.llama_memory_seq_cp(self._mem, int(src), int(dst), int(p0), int(p1))

    def seq_keep(self, seq_id: int) -> None:
        self._ptr()
        self._check_seq(seq_id)
        self.bindings.llama_memory_seq_keep(self._mem, int(seq_id))

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self._ptr()
        self._check_seq(seq_id, allow_negative=True)
        self.bindings.llama_memory_seq_add(self._mem, int(seq_id), int(p0), int(p1), int(delta))

    def seq_pos_min(self, seq_id: int) -> int:
        self._ptr()
        self._check_seq(seq_id)
        return int(self.bindings.llama_memory_seq_pos_min(self._mem, int(seq_id)))

    def seq_pos_max(self, seq_id: int) -> int:
        self._ptr()
        self._check_seq(seq_id)
        return int(self.bindings.llama_memory_seq_pos_max(self._mem, int(seq_id)))

    # -- state --------------------------------------------------------------------------------
    def state_get(self) -> bytes:
        C, ptr = self.bindings, self._ptr()
        size = int(C.llama_state_get_size(ptr))
        buf = (ctypes.c_uint8 * size)()
        n = int(C.llama_state_get_data(ptr, buf, size))
        return ctypes.string_at(buf, n)  # bytes(buf[:n]) builds a list of ints first: seconds for GBs

    def state_set(self, data: bytes) -> None:
        C, ptr = self.bindings, self._ptr()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        n = int(C.llama_state_set_data(ptr, buf, len(data)))
        if n != len(data):
            raise LlamaError(f"llama_state_set_data read {n} of {len(data)} bytes: the state does not "
                             "belong to this model/context configuration")

    def state_seq_get(self, seq_id: int, flags: int = 0) -> bytes:
        C, ptr = self.bindings, self._ptr()
        self._check_seq(seq_id)
        size = int(C.llama_state_seq_get_size_ext(ptr, seq_id, flags))
        buf = (ctypes.c_uint8 * size)()
        n = int(C.llama_state_seq_get_data_ext(ptr, buf, size, seq_id, flags))
        return ctypes.string_at(buf, n)

    def state_seq_set(self, data: bytes, seq_id: int, flags: int = 0) -> None:
        C, ptr = self.bindings, self._ptr()
        self._check_seq(seq_id)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if not int(C.llama_state_seq_set_data_ext(ptr, buf, len(data), seq_id, flags)):
            raise LlamaError(f"llama_state_seq_set_data_ext could not restore sequence {seq_id}")

    # -- running ------------------------------------------------------------------------------
    def _check_count(self, n: int, encode: bool) -> None:
        if n <= 0:
            raise ValueError("the batch range is empty: nothing to decode")
        if n > self._n_batch:
            raise ContextOverflowError(
                f"{n} tokens exceed n_batch={self._n_batch}: split the input or raise n_batch")
        if (encode or not self.causal_attn()) and n > self._n_ubatch:
            raise ContextOverflowError(
                f"{n} tokens exceed n_ubatch={self._n_ubatch}; a non-causal model processes a batch in "
                "one micro-batch: raise n_ubatch (and n_batch) or split the input")

    def decode(self, batch: LlamaBatch, start: int = 0, count: int | None = None) -> None:
        """Run ``llama_decode`` on ``batch`` entries ``[start, start + count)`` (validated first)."""
        raw = batch.validated_view(self, start, count)
        self._check_count(raw.n_tokens, encode=False)
        rc = int(self.bindings.llama_decode(self._ptr(), raw))
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc}: {_DECODE_ERRORS.get(rc, 'fatal error')}")
        self.n_decode += 1

    def encode(self, batch: LlamaBatch, start: int = 0, count: int | None = None) -> None:
        """Run ``llama_encode`` (encoder models, non-causal embeddings)."""
        raw = batch.validated_view(self, start, count)
        self._check_count(raw.n_tokens, encode=True)
        rc = int(self.bindings.llama_encode(self._ptr(), raw))
        if rc != 0:
            raise DecodeError(f"llama_encode returned {rc}: {_DECODE_ERRORS.get(rc, 'fatal error')}")
        self.n_decode += 1

    def process(self, batch: LlamaBatchExtNative, encode: bool = False) -> None:
        """Submit an extended batch with ``llama_process`` (ENCODE or DECODE)."""
        if batch.context_ref is not self._ref:
            raise ValueError("this extended batch was created for another context")
        self._check_count(batch.n_tokens, encode=encode)
        batch.check_ready()
        kind = self.bindings.LLAMA_PROCESS_TYPE_ENCODE if encode else self.bindings.LLAMA_PROCESS_TYPE_DECODE
        rc = int(self.bindings.llama_process(self._ptr(), kind, batch.ptr))
        if rc != 0:
            what = "encode" if encode else "decode"
            raise DecodeError(f"llama_process({what}) returned {rc}: {_DECODE_ERRORS.get(rc, 'fatal error')}")
        self.n_decode += 1

    def logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch entry ``i`` of the last decode (an output entry; negative counts outputs
        from the end), as a read-only view valid until the next decode."""
        v = float_view(self.bindings.llama_get_logits_ith(self._ptr(), int(i)), self._n_vocab)
        if v is None:
            raise IndexError(f"no logits for batch index {i}: mark that entry as an output")
        return v

    def embeddings_ith(self, i: int) -> np.ndarray:
        v = float_view(self.bindings.llama_get_embeddings_ith(self._ptr(), int(i)), self._n_embd_out)
        if v is None:
            raise IndexError(f"no embeddings for batch index {i}: enable embeddings and mark it as output")
        return v

    def embeddings_seq(self, seq_id: int, n: int | None = None) -> np.ndarray:
        self._check_seq(seq_id)
        width = self._n_embd_out if n is None else n
        v = float_view(self.bindings.llama_get_embeddings_seq(self._ptr(), int(seq_id)), width)
        if v is None:
            raise IndexError(f"no pooled embedding for sequence {seq_id} (pooling NONE, or not in the last batch)")
        return v

    def perf(self) -> dict[str, float]:
        d = self.bindings.llama_perf_context(self._ptr())
        return {k: getattr(d, k) for k in ("t_start_ms", "t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval",
                                          "n_eval", "n_reused")}

    def perf_reset(self) -> None:
        self.bindings.llama_perf_context_reset(self._ptr())

    def set_adapters_lora(self, adapters: Sequence[LlamaLoraAdapter], scales: Sequence[float]) -> None:
        if len(adapters) != len(scales):
            raise ValueError("one scale per LoRA adapter is required")
        n = len(adapters)
        arr = (ctypes.c_void_p * max(n, 1))(*[a.ptr for a in adapters])
        sc = (ctypes.c_float * max(n, 1))(*[float(s) for s in scales])
        # the array itself: ctypes passes a c_void_p *instance* for a pointer argument by its address
        rc = int(self.bindings.llama_set_adapters_lora(self._ptr(), arr if n else None, n, sc if n else None))
        if rc != 0:
            raise LlamaError(f"llama_set_adapters_lora failed ({rc}): adapter does not fit this model")
        self._adapters = list(adapters)  # keep them alive while attached


# --------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------

class LlamaBatch:
    """A ``llama_batch`` whose arrays live in NumPy buffers owned by this object.

    The struct has exactly the layout ``llama_batch_init(n_tokens, embd, n_seq_max)`` produces
    (``token`` or ``embd``, never both; ``seq_id[i]`` points at row ``i`` of an
    ``(n_tokens, n_seq_max)`` array), but the memory is Python's, so nothing native can leak and
    bulk updates are vectorised. ``close()`` drops the buffers; using the batch afterwards raises
    :class:`ClosedError`.
    """

    def __init__(self, n_tokens: int, embd: int = 0, n_seq_max: int = 1, *, verbose: bool = True) -> None:
        if n_tokens <= 0:
            raise ValueError(f"batch capacity must be positive, got {n_tokens}")
        if embd < 0:
            raise ValueError(f"embd must be >= 0, got {embd}")
        if n_seq_max <= 0:
            raise ValueError(f"n_seq_max must be positive, got {n_seq_max}")
        C = native_lib()
        self.bindings = C
        self.capacity = int(n_tokens)
        self.embd = int(embd)
        self.n_seq_max = int(n_seq_max)
        self.n_tokens = 0
        self.closed = False
        if embd:
            self.token_arr = None
            self.embd_arr = np.zeros((n_tokens, embd), dtype=np.float32)
        else:
            self.token_arr = np.zeros(n_tokens, dtype=np.int32)
            self.embd_arr = None
        self.pos = np.zeros(n_tokens, dtype=np.int32)
        self.n_seq_id = np.ones(n_tokens, dtype=np.int32)
        self.seq_ids = np.zeros((n_tokens, n_seq_max), dtype=np.int32)
        self.logits = np.zeros(n_tokens, dtype=np.int8)
        base = self.seq_ids.ctypes.data
        stride = self.seq_ids.strides[0]
        self._seq_ptrs = np.array([base + i * stride for i in range(n_tokens)], dtype=np.uintp)
        self._struct = C.llama_batch()
        self._fill_struct(self._struct, 0, 0)

    # -- struct views -------------------------------------------------------------------------
    def _fill_struct(self, s: Any, start: int, count: int) -> None:
        s.n_tokens = count
        i32p = ctypes.POINTER(ctypes.c_int32)
        if self.token_arr is not None:
            s.token = ctypes.cast(self.token_arr.ctypes.data + 4 * start, i32p)
            s.embd = None
        else:
            s.token = None
            s.embd = ctypes.cast(self.embd_arr.ctypes.data + 4 * self.embd * start, ctypes.POINTER(ctypes.c_float))
        s.pos = ctypes.cast(self.pos.ctypes.data + 4 * start, i32p)
        s.n_seq_id = ctypes.cast(self.n_seq_id.ctypes.data + 4 * start, i32p)
        s.seq_id = ctypes.cast(self._seq_ptrs.ctypes.data + self._seq_ptrs.itemsize * start, ctypes.POINTER(i32p))
        s.logits = ctypes.cast(self.logits.ctypes.data + start, ctypes.POINTER(ctypes.c_int8))

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("this batch is closed; create a new one")

    def close(self) -> None:
        self.closed = True
        self.token_arr = self.embd_arr = None
        self.pos = self.n_seq_id = self.seq_ids = self.logits = self._seq_ptrs = None  # type: ignore[assignment]

    def __enter__(self) -> LlamaBatch:  # noqa: PYI034 (typing.Self needs 3.11)
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def is_embd(self) -> bool:
        return self.embd > 0

    # -- filling ------------------------------------------------------------------------------
    def clear(self) -> None:
        self._check_open()
        self.n_tokens = 0

    def reset(self) -> None:
        """llama-cpp-python's name for :meth:`clear`."""
        self.clear()

    def set_batch(self, batch: Sequence[int] | np.ndarray, n_past: int, logits_all: bool) -> None:
        """Replace the contents with one sequence (id 0) at positions ``n_past...``; outputs: all
        entries with ``logits_all``, else the last one (llama-cpp-python's method)."""
        self.clear()
        self.add_sequence(batch, seq_id=0, start_pos=int(n_past), logits=True if logits_all else "last")

    @property
    def batch(self) -> Any:
        """A ``llama_batch`` over the current entries (llama-cpp-python's attribute), unchecked:
        :meth:`LlamaContext.decode` checks them against its context."""
        self._check_open()
        self._fill_struct(self._struct, 0, self.n_tokens)
        return self._struct

    def _seq_list(self, seq_ids: int | Sequence[int], index: int) -> list[int]:
        ids = [int(seq_ids)] if isinstance(seq_ids, (int, np.integer)) else [int(s) for s in seq_ids]
        if not ids:
            raise ValueError(f"entry {index}: at least one sequence id is required")
        if len(ids) > self.n_seq_max:
            raise ValueError(f"entry {index}: {len(ids)} sequence ids exceed this batch's n_seq_max={self.n_seq_max}")
        for s in ids:
            if s < 0:
                raise ValueError(f"entry {index}: sequence id {s} is negative")
        return ids

    def _reserve(self, n: int) -> int:
        self._check_open()
        i = self.n_tokens
        if i + n > self.capacity:
            raise ContextOverflowError(
                f"batch is full: {i} + {n} entries exceed its capacity of {self.capacity}")
        return i

    def add(self, token: int, pos: int, seq_ids: int | Sequence[int] = 0, logits: bool = False) -> int:
        """Append one token; returns its index in the batch."""
        self._check_open()
        if self.token_arr is None:
            raise TypeError("this batch holds embeddings (embd > 0): use add_embd()")
        i = self._reserve(1)
        ids = self._seq_list(seq_ids, i)
        if int(token) < 0:
            raise TokenizationError(f"entry {i}: token id {token} is negative")
        self.token_arr[i] = int(token)
        self.pos[i] = int(pos)
        self.n_seq_id[i] = len(ids)
        self.seq_ids[i, : len(ids)] = ids
        self.logits[i] = 1 if logits else 0
        self.n_tokens = i + 1
        return i

    def add_sequence(self, tokens: Sequence[int] | np.ndarray, seq_id: int = 0, start_pos: int = 0,
                     logits: bool | str = "last", *, logits_all: bool | None = None) -> tuple[int, int]:
        """Append many tokens of one sequence at consecutive positions (vectorised).

        ``logits``: ``"last"`` (only the last entry is an output), ``True`` (all) or ``False``.
        Returns ``(first_index, count)``. llama-cpp-python's ``add_sequence(tokens, seq_id,
        logits_all)`` means positions from 0 and the last entry always an output; a bool third
        argument, or ``logits_all=``, is read that way.
        """
        if isinstance(start_pos, (bool, np.bool_)):
            logits_all, start_pos = bool(start_pos), 0
        if logits_all is not None:
            logits = True if logits_all else "last"
        self._check_open()
        if self.token_arr is None:
            raise TypeError("this batch holds embeddings (embd > 0): use add_embd()")
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"tokens must be integers, got dtype {arr.dtype}")
        n = int(arr.size)
        i = self._reserve(n)
        self._seq_list(seq_id, i)
        if n == 0:
            return i, 0
        neg = np.nonzero(arr < 0)[0]
        if neg.size:
            raise TokenizationError(f"entry {i + int(neg[0])}: token id {int(arr[neg[0]])} is negative")
        sl = slice(i, i + n)
        self.token_arr[sl] = arr
        self.pos[sl] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.n_seq_id[sl] = 1
        self.seq_ids[sl, 0] = int(seq_id)
        if logits == "last":
            self.logits[sl] = 0
            self.logits[i + n - 1] = 1
        else:
            self.logits[sl] = 1 if logits else 0
        self.n_tokens = i + n
        return i, n

    def add_embd(self, row: np.ndarray, pos: int | Sequence[int], seq_ids: int | Sequence[int] = 0,
                 logits: bool = False) -> int:
        """Append one embedding row (float32, width ``embd``)."""
        self._check_open()
        if self.embd_arr is None:
            raise TypeError("this batch holds token ids (embd == 0): use add()")
        a = np.asarray(row)
        if a.dtype != np.float32:
            raise TypeError(f"embedding rows must be float32, got {a.dtype}")
        if a.shape != (self.embd,):
            raise ValueError(f"embedding row must have shape ({self.embd},), got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError("embedding row contains NaN or infinity")
        i = self._reserve(1)
        ids = self._seq_list(seq_ids, i)
        if not isinstance(pos, (int, np.integer)):
            raise TypeError("llama_batch carries one position per entry; use LlamaBatchExt for M-RoPE positions")
        self.embd_arr[i] = a
        self.pos[i] = int(pos)
        self.n_seq_id[i] = len(ids)
        self.seq_ids[i, : len(ids)] = ids
        self.logits[i] = 1 if logits else 0
        self.n_tokens = i + 1
        return i

    def add_embd_rows(self, rows: np.ndarray, seq_id: int = 0, start_pos: int = 0,
                      logits: bool | str = "last") -> tuple[int, int]:
        """Append an ``(n, embd)`` float32 array of rows at consecutive positions."""
        self._check_open()
        if self.embd_arr is None:
            raise TypeError("this batch holds token ids (embd == 0): use add_sequence()")
        a = np.asarray(rows)
        if a.dtype != np.float32:
            raise TypeError(f"embedding rows must be float32, got {a.dtype}")
        if a.ndim != 2 or a.shape[1] != self.embd:
            raise ValueError(f"embedding rows must have shape (n, {self.embd}), got {a.shape}")
        if not np.all(np.isfinite(a)):
            bad = int(np.nonzero(~np.all(np.isfinite(a), axis=1))[0][0])
            raise ValueError(f"embedding row {bad} contains NaN or infinity")
        n = a.shape[0]
        i = self._reserve(n)
        self._seq_list(seq_id, i)
        sl = slice(i, i + n)
        self.embd_arr[sl] = a
        self.pos[sl] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.n_seq_id[sl] = 1
        self.seq_ids[sl, 0] = int(seq_id)
        if logits == "last":
            self.logits[sl] = 0
            if n:
                self.logits[i + n - 1] = 1
        else:
            self.logits[sl] = 1 if logits else 0
        self.n_tokens = i + n
        return i, n

    def set_logits(self, index: int, value: bool = True) -> None:
        self._check_open()
        if not 0 <= index < self.n_tokens:
            raise IndexError(f"batch index {index} is outside [0, {self.n_tokens})")
        self.logits[index] = 1 if value else 0

    def output_indices(self) -> list[int]:
        self._check_open()
        return [int(i) for i in np.nonzero(self.logits[: self.n_tokens])[0]]

    # -- submission ---------------------------------------------------------------------------
    def validated_view(self, ctx: LlamaContext, start: int = 0, count: int | None = None) -> Any:
        """A ``llama_batch`` over entries ``[start, start+count)``, checked against ``ctx``. The struct
        points into this batch's arrays; its ``owner`` attribute holds this batch so they outlive it."""
        self._check_open()
        if count is None:
            count = self.n_tokens - start
        if start < 0 or count < 0 or start + count > self.n_tokens:
            raise IndexError(f"range [{start}, {start + count}) is outside the batch's {self.n_tokens} entries")
        sl = slice(start, start + count)
        if self.token_arr is not None:
            toks = self.token_arr[sl]
            bad = np.nonzero((toks < 0) | (toks >= ctx.n_vocab()))[0]
            if bad.size:
                j = int(bad[0])
                raise TokenizationError(
                    f"entry {start + j}: token id {int(toks[j])} is outside the vocabulary [0, {ctx.n_vocab()})")
        else:
            width = ctx.n_embd_inp()
            if self.embd != width:
                raise ValueError(f"batch rows are {self.embd} wide; this context takes rows of {width}")
            if ctx.n_pos_per_embd > 1:
                # llama.cpp would read n_pos_per_embd * n_tokens positions from this batch
                raise ValueError("this model uses M-RoPE: embedding inputs need one position per section; "
                                 "use LlamaBatchExt (add_embd with a position tuple)")
        n_seq_max = ctx.n_seq_max()
        nsid = self.n_seq_id[sl]
        sids = self.seq_ids[sl]
        mask = np.arange(self.n_seq_max)[None, :] < nsid[:, None]
        bad_rows = np.nonzero(np.any(mask & ((sids < 0) | (sids >= n_seq_max)), axis=1))[0]
        if bad_rows.size:
            j = int(bad_rows[0])
            s = [int(x) for x in sids[j, : nsid[j]]]
            raise ValueError(f"entry {start + j}: sequence id(s) {s} outside [0, n_seq_max={n_seq_max}) of this context")
        s = self.bindings.llama_batch()
        self._fill_struct(s, start, count)
        s.owner = self
        return s


def _ext_row_widths(ctx: LlamaContext) -> tuple[int, int]:
    """The row widths an extended batch of ``ctx`` accepts, as ``llama_batch_ext`` decides them:
    (the input width, the encoder input width). The encoder width of an EAGLE3 draft is its
    target layers times ``eagle3.target_hidden_size``, of a DFlash draft its target layers times
    its ``n_embd`` (whose decoder input is that width too); other models have one width."""
    inp = ctx.n_embd_inp()
    model = getattr(ctx, "_model", None)
    arch = model.metadata.get("general.architecture") if model is not None else None
    if arch not in ("eagle3", "dflash"):
        return inp, inp
    C = ctx.bindings
    if not C.__bindings__.functions["llama_model_target_layer_ids_n"].available():
        return inp, inp  # llama.cpp accepts the encoder width too; without the count it cannot be derived
    n_layers = int(C.llama_model_target_layer_ids_n(model.ptr))
    if arch == "eagle3":
        enc = n_layers * int(model.metadata.get("eagle3.target_hidden_size", "0"))
        return inp, enc or inp
    enc = n_layers * model.n_embd()
    return enc, enc


class LlamaBatchExtNative(Owned):
    """A native ``llama_batch_ext`` sized from (and keeping alive) one context.

    Entries are validated in Python before each native call; the return codes of the C API
    (-1 full, -2 bad token/embedding, -3 bad sequence) are turned into exceptions anyway.
    """

    _kind = "extended batch"

    def __init__(self, ctx: LlamaContext) -> None:
        self._ref = None
        C = ctx.bindings
        ptr = C.llama_batch_ext_init(ctx.ptr)
        if not ptr:
            raise LlamaError("llama_batch_ext_init failed")
        self._own(ptr, C.llama_batch_ext_free, [ctx.native_ref])
        self.bindings = C
        self.context_ref = ctx.native_ref
        self.capacity = ctx.n_batch()
        self.n_vocab = ctx.n_vocab()
        self.n_seq_max = ctx.n_seq_max()
        self.n_embd, self.n_embd_enc = _ext_row_widths(ctx)
        self.n_pos_per_embd = ctx.n_pos_per_embd
        self.n_tokens = 0
        self._pos_set: list[bool] = []
        self._is_embd: list[bool] = []
        self._outputs: list[bool] = []
        self._row_width = 0  # fixed by the first row attached (C requires one width per batch)

    def clear(self) -> None:
        self.bindings.llama_batch_ext_clear(self._ptr())
        self.n_tokens = 0
        self._pos_set.clear()
        self._is_embd.clear()
        self._outputs.clear()
        self._row_width = 0

    def _check_seq(self, seq_id: int, where: str) -> None:
        if not 0 <= int(seq_id) < self.n_seq_max:
            raise ValueError(f"{where}: sequence id {seq_id} is outside [0, n_seq_max={self.n_seq_max})")

    def _check_room(self, n: int = 1) -> None:
        self._ptr()
        if self.n_tokens + n > self.capacity:
            raise ContextOverflowError(
                f"extended batch is full: {self.n_tokens} + {n} entries exceed its capacity {self.capacity} (n_batch)")

    def _row(self, row: np.ndarray, where: str) -> tuple[np.ndarray, Any]:
        a = np.asarray(row)
        if a.dtype != np.float32:
            raise TypeError(f"{where}: embedding rows must be float32, got {a.dtype}")
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2 or a.size == 0:
            raise ValueError(f"{where}: an embedding must be a 1-D row or a 2-D (rows, width) array, got shape {a.shape}")
        total = a.size
        if total not in (self.n_embd, self.n_embd_enc):
            widths = str(self.n_embd) if self.n_embd == self.n_embd_enc else f"{self.n_embd} or {self.n_embd_enc}"
            raise ValueError(f"{where}: embedding has {total} floats; this context takes rows of {widths}")
        if self._row_width and total != self._row_width:
            raise ValueError(f"{where}: embedding width {total} differs from the batch's {self._row_width}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{where}: embedding contains NaN or infinity")
        a = np.ascontiguousarray(a)
        e = self.bindings.llama_embd()
        e.data = a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        e.n_rows = a.shape[0]
        e.n_embd = a.shape[1]
        return a, e

    def _positions(self, pos: int | Sequence[int], embd: bool, where: str) -> Any:
        if isinstance(pos, (int, np.integer)):
            vals = [int(pos)] * (self.n_pos_per_embd if embd else 1)
        else:
            vals = [int(p) for p in pos]
        need = self.n_pos_per_embd if embd else 1
        if len(vals) != need:
            raise ValueError(f"{where}: {len(vals)} positions given; this entry needs {need}"
                             + (" (M-RoPE)" if need > 1 else ""))
        if any(v < 0 for v in vals):
            raise ValueError(f"{where}: positions must be >= 0, got {vals}")
        arr = (ctypes.c_int32 * 4)(*vals)
        return arr

    def _after_add(self, idx: int, where: str) -> int:
        if idx == -1:
            raise ContextOverflowError(f"{where}: extended batch is full")
        if idx == -2:
            raise ValueError(f"{where}: llama.cpp rejected the token id or embedding")
        if idx == -3:
            raise ValueError(f"{where}: llama.cpp rejected the sequence id")
        if idx < 0:
            raise LlamaError(f"{where}: llama_batch_ext_add returned {idx}")
        return idx

    def add_token(self, token: int, seq_id: int, pos: int, output: bool = False) -> int:
        where = f"entry {self.n_tokens}"
        self._check_room()
        if not 0 <= int(token) < self.n_vocab:
            raise TokenizationError(f"{where}: token id {token} is outside the vocabulary [0, {self.n_vocab})")
        self._check_seq(seq_id, where)
        p = self._positions(pos, False, where)
        C, b = self.bindings, self._ptr()
        idx = self._after_add(int(C.llama_batch_ext_add_token(b, int(seq_id), int(token))), where)
        C.llama_batch_ext_set_pos(b, idx, p)
        if output:
            C.llama_batch_ext_set_output_logits(b, idx, True)
        self.n_tokens += 1
        self._pos_set.append(True)
        self._is_embd.append(False)
        self._outputs.append(bool(output))
        return idx

    def add_tokens(self, tokens: Sequence[int], seq_id: int, start_pos: int, output: bool | str = "last") -> list[int]:
        toks = [int(t) for t in tokens]
        self._check_room(len(toks))
        out = []
        for k, t in enumerate(toks):
            o = (k == len(toks) - 1) if output == "last" else bool(output)
            out.append(self.add_token(t, seq_id, start_pos + k, o))
        return out

    def add_embd(self, row: np.ndarray, seq_id: int, pos: int | Sequence[int], output: bool = False) -> int:
        where = f"entry {self.n_tokens}"
        self._check_room()
        self._check_seq(seq_id, where)
        a, e = self._row(row, where)
        p = self._positions(pos, True, where)
        C, b = self.bindings, self._ptr()
        idx = self._after_add(int(C.llama_batch_ext_add_embd(b, int(seq_id), e)), where)
        del a
        C.llama_batch_ext_set_pos(b, idx, p)
        if output:
            C.llama_batch_ext_set_output_embd(b, idx, True)
        self._row_width = e.n_rows * e.n_embd
        self.n_tokens += 1
        self._pos_set.append(True)
        self._is_embd.append(True)
        self._outputs.append(bool(output))
        return idx

    def set_embd_token(self, idx: int, row: np.ndarray) -> None:
        """Attach a hidden-state row to token entry ``idx`` (copied now; MTP drafting)."""
        self._check_index(idx)
        a, e = self._row(row, f"entry {idx}")
        if not self.bindings.llama_batch_ext_set_embd_token(self._ptr(), int(idx), e):
            raise ValueError(f"entry {idx}: llama.cpp refused the row (already set, or width mismatch)")
        self._row_width = a.size
        del a

    def add_seq(self, idx: int, seq_id: int) -> None:
        self._check_index(idx)
        self._check_seq(seq_id, f"entry {idx}")
        if not self.bindings.llama_batch_ext_add_seq(self._ptr(), int(idx), int(seq_id)):
            raise ValueError(f"entry {idx}: llama.cpp refused sequence {seq_id}")

    def set_pos(self, idx: int, pos: int | Sequence[int]) -> None:
        self._check_index(idx)
        p = self._positions(pos, self._is_embd[idx], f"entry {idx}")
        self.bindings.llama_batch_ext_set_pos(self._ptr(), int(idx), p)

    def set_output(self, idx: int, value: bool = True) -> None:
        self._check_index(idx)
        self.bindings.llama_batch_ext_set_output_logits(self._ptr(), int(idx), bool(value))
        self._outputs[idx] = bool(value)

    def output_indices(self) -> list[int]:
        return [i for i, o in enumerate(self._outputs) if o]

    def _check_index(self, idx: int) -> None:
        self._ptr()
        if not 0 <= int(idx) < self.n_tokens:
            raise IndexError(f"entry index {idx} is outside [0, {self.n_tokens})")

    def check_ready(self) -> None:
        self._ptr()
        if self.n_tokens == 0:
            raise ValueError("the extended batch is empty: nothing to process")


# upstream's module path for these classes (reprs, pickles): llama_cpp._internals re-exports them
for _cls in (CpuThreadpool, LlamaContext, LlamaBatch, LlamaBatchExtNative):
    _cls.__module__ = "llama_cpp._internals"

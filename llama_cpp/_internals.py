"""Ownership wrappers over llama.cpp's native objects: model, context, sampler chain, batch, LoRA adapter.

Every native pointer has exactly one owner here and is freed exactly once: by ``close()``, by leaving
a ``with`` block, or by a :func:`weakref.finalize` finalizer (which also runs at interpreter exit,
before modules are torn down, so the library is still loaded). Nothing here defines ``__del__``.

Native lifetimes nest: a context needs its model, a LoRA adapter needs its model, an extended
batch needs its context. A :class:`_NativeRef` counts those users, so closing a model while a
context still uses it only marks the model wrapper closed; the native model is freed when its last
user goes away. Using a closed wrapper raises :class:`~llama_cpp.ClosedError`.

Validation of user input happens here, before any native call: a bad token id, sequence id,
width or capacity raises a Python exception naming the offending index instead of reaching a
``GGML_ASSERT`` in C.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import (
    ClosedError,
    ContextError,
    ContextOverflowError,
    DecodeError,
    LlamaError,
    ModelLoadError,
    ModelNotFoundError,
    TokenizationError,
)
from ._native import log_routing as _logging
from ._safety import checks as _checks
from ._safety import gguf_guard as _gguf_guard
from .llama_cpp import (
    LLAMA_CONTEXT_TYPE_MTP,
    LLAMA_FLASH_ATTN_TYPE_AUTO,
    LLAMA_FLASH_ATTN_TYPE_DISABLED,
    LLAMA_FLASH_ATTN_TYPE_ENABLED,
    LLAMA_LOAD_MODE_MLOCK,
    LLAMA_LOAD_MODE_MMAP,
    LLAMA_LOAD_MODE_MMAP_MLOCK,
    LLAMA_LOAD_MODE_NONE,
    LLAMA_POOLING_TYPE_MEAN,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
    LLAMA_ROPE_TYPE_IMROPE,
    LLAMA_ROPE_TYPE_MROPE,
    LLAMA_SPLIT_MODE_LAYER,
    LLAMA_VOCAB_TYPE_SPM,
)

log = logging.getLogger("llama_cpp")

_GGUF_MAGIC = b"GGUF"
# magic (4) + version (u32) + n_tensors (u64) + n_kv (u64)
_GGUF_MIN_HEADER = 24

def _lib() -> Any:
    """The low-level binding module (``llama_cpp.llama_cpp``), loaded on first use."""
    from . import llama_cpp as C
    from ._native import loader as _loader

    _loader.load()
    return C


def _as_float_ptr(ptr: Any) -> Any:
    if ptr is None:
        return None
    if isinstance(ptr, int):
        return ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
    return ptr


_FLOAT_VIEWS: dict[tuple[int, int], np.ndarray] = {}


def float_view(ptr: Any, n: int) -> np.ndarray | None:
    """A read-only NumPy view of ``n`` floats at a native address (None for NULL).

    llama.cpp hands out the same output buffers decode after decode, so views are kept by
    (address, length): making one costs more than a small model's sampling step. A view is only
    handed out for an address llama.cpp just returned, so it never outlives what it shows."""
    ptr = _as_float_ptr(ptr)
    if not ptr:
        return None
    key = (ctypes.addressof(ptr.contents), n)
    arr = _FLOAT_VIEWS.get(key)
    if arr is None:
        if len(_FLOAT_VIEWS) >= 1024:
            _FLOAT_VIEWS.clear()
        arr = np.ctypeslib.as_array(ptr, shape=(n,))
        arr.flags.writeable = False
        _FLOAT_VIEWS[key] = arr
    return arr


def _cstr(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, int):
        return ctypes.string_at(value).decode("utf-8", errors="replace") if value else None
    return str(value)


class CallableInt(int):
    """An int that also answers a call with itself: ``model.n_vocab`` here, ``model.n_vocab()`` in
    llama-cpp-python's ``_internals``."""

    __slots__ = ()

    def __call__(self) -> int:
        return int(self)


class CallableDict(dict):
    """A dict that also answers a call with a copy of itself: ``model.metadata`` here,
    ``model.metadata()`` in llama-cpp-python's ``_internals``."""

    def __call__(self) -> dict[str, str]:
        return dict(self)


class _NativeRef:
    """Shared ownership of one native pointer.

    The pointer is freed once the owner has closed it and no dependent object (a context using a
    model, say) still holds it. Thread-safe; idempotent.
    """

    __slots__ = ("_closed", "_free", "_lock", "_parents", "_users", "name", "ptr")

    def __init__(self, ptr: Any, free: Callable[[Any], None], name: str,
                 parents: Sequence[_NativeRef] = ()) -> None:
        self.ptr = ptr
        self._free = free
        self._users = 0
        self._closed = False
        self._lock = threading.Lock()
        self.name = name
        self._parents = list(parents)
        for p in self._parents:
            p.acquire()

    def acquire(self) -> None:
        with self._lock:
            if self.ptr is None:
                raise ClosedError(f"the native {self.name} was already freed")
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
        self._maybe_free()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._maybe_free()

    def _maybe_free(self) -> None:
        with self._lock:
            if not self._closed or self._users > 0 or self.ptr is None:
                return
            ptr, self.ptr = self.ptr, None
        self._free(ptr)
        parents, self._parents = self._parents, []
        for p in parents:
            p.release()


class _Owned:
    """Base of the wrappers: ``close()``, context manager, finalizer, use-after-close checks."""

    _kind = "object"
    _ref: _NativeRef | None

    def _own(self, ptr: Any, free: Callable[[Any], None], parents: Sequence[_NativeRef] = ()) -> None:
        self._ref = _NativeRef(ptr, free, self._kind, parents)
        self._finalizer = weakref.finalize(self, self._ref.close)

    @property
    def closed(self) -> bool:
        return self._ref is None

    def _ptr(self) -> Any:
        ref = self._ref
        if ref is None or ref.ptr is None:
            raise ClosedError(f"this {self._kind} is closed; create a new one")
        return ref.ptr

    def close(self) -> None:
        """Free the native object (deferred while dependents still use it). Idempotent."""
        ref, self._ref = getattr(self, "_ref", None), None
        if ref is not None:
            self._finalizer.detach()
            ref.close()

    def __enter__(self):
        self._ptr()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------

def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Reject a missing, non-regular, short or non-GGUF file before llama.cpp opens it."""
    p = Path(path)
    if not p.exists():
        # a FileNotFoundError, and the ValueError llama-cpp-python raises here
        raise ModelNotFoundError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelLoadError(f"model path is not a regular file: {p}")
    size = p.stat().st_size
    if size < _GGUF_MIN_HEADER:
        raise ModelLoadError(f"{p} is {size} bytes, too short to be a GGUF model (truncated download?)")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{p} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    return p


def _kv_overrides_array(C: Any, overrides: dict[str, bool | int | float | str]) -> Any:
    arr = (C.llama_model_kv_override * (len(overrides) + 1))()
    for i, (key, value) in enumerate(overrides.items()):
        kb = key.encode("utf-8")
        if len(kb) >= 128:
            raise ValueError(f"kv_overrides key {key!r} is longer than 127 bytes")
        item = arr[i]
        item.key = kb
        if isinstance(value, bool):
            item.tag = C.LLAMA_KV_OVERRIDE_TYPE_BOOL
            item.val_bool = value
        elif isinstance(value, int):
            item.tag = C.LLAMA_KV_OVERRIDE_TYPE_INT
            item.val_i64 = value
        elif isinstance(value, float):
            item.tag = C.LLAMA_KV_OVERRIDE_TYPE_FLOAT
            item.val_f64 = value
        elif isinstance(value, str):
            vb = value.encode("utf-8")
            if len(vb) >= 128:
                raise ValueError(f"kv_overrides value for {key!r} is longer than 127 bytes")
            item.tag = C.LLAMA_KV_OVERRIDE_TYPE_STR
            item.val_str = vb
        else:
            raise TypeError(f"kv_overrides[{key!r}] must be bool, int, float or str, not {type(value).__name__}")
    return arr  # the last entry stays zeroed: key[0] == 0 terminates the list


def load_mode_from_flags(use_mmap: bool, use_mlock: bool) -> int:
    """Map llama-cpp-python's ``use_mmap``/``use_mlock`` onto ``enum llama_load_mode``."""
    if use_mmap and use_mlock:
        return LLAMA_LOAD_MODE_MMAP_MLOCK
    if use_mmap:
        return LLAMA_LOAD_MODE_MMAP
    if use_mlock:
        return LLAMA_LOAD_MODE_MLOCK
    return LLAMA_LOAD_MODE_NONE


def flash_attn_type(flash_attn: bool | int | None) -> int:
    """``enum llama_flash_attn_type`` from llama-cpp-python's ``flash_attn`` (None: auto, a bool, or the enum)."""
    if flash_attn is None:
        return LLAMA_FLASH_ATTN_TYPE_AUTO
    if isinstance(flash_attn, bool):
        return LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else LLAMA_FLASH_ATTN_TYPE_DISABLED
    return int(flash_attn)


_MODEL_KEYWORD_DEFAULTS: dict[str, Any] = {
    "n_gpu_layers": 0, "split_mode": LLAMA_SPLIT_MODE_LAYER, "main_gpu": 0, "tensor_split": None,
    "vocab_only": False, "use_mmap": True, "use_mlock": False, "load_mode": None, "kv_overrides": None,
    "check_tensors": False, "load_mtp": False, "progress_callback": None,
}

#: the scalar fields of ``llama_model_params`` that a caller's struct is checked on
_MODEL_STRUCT_CHECKED = ("n_gpu_layers", "split_mode", "main_gpu", "load_mode")


def _differs(value: Any, default: Any) -> bool:
    if value is default:
        return False
    if default is None or isinstance(value, (list, tuple, dict, np.ndarray)):
        return value is not None
    return bool(value != default)


def _model_path(path: str | os.PathLike[str] | None, path_model: str | os.PathLike[str] | None) -> Path:
    if path is not None and path_model is not None:
        raise TypeError("pass the model file once: as path or as path_model (llama-cpp-python's name), not both")
    chosen = path if path is not None else path_model
    if chosen is None:
        raise TypeError("LlamaModel needs the model file: LlamaModel(path) or LlamaModel(path_model=..., params=...)")
    return check_gguf_file(chosen)


def _struct_copy(C: Any, struct_type: Any, params: Any, what: str) -> Any:
    """A private copy of a caller's parameter struct (checked, then changed here, never theirs)."""
    if not isinstance(params, struct_type):
        raise TypeError(f"params must be a llama_cpp.{struct_type.__name__} (from llama_cpp.{what}()), "
                        f"not {type(params).__name__}")
    copy = struct_type()
    ctypes.memmove(ctypes.byref(copy), ctypes.byref(params), ctypes.sizeof(struct_type))
    return copy


_amx_verdict: bool | None = None


def amx_kernels_unsafe() -> bool:
    """True when the serving CPU backend has ggml's AMX kernels, which crash with SIGILL here.

    At the pinned commit ``ggml_tile_config_init`` (ggml-cpu/amx/mmq.cpp) fills its tile
    configuration on the stack and GCC drops those stores before ``ldtilecfg`` (only
    ``palette_id`` survives), so the first tile instruction of an AMX matmul finds no tiles
    configured: SIGILL on Sapphire Rapids and newer (llama.cpp PR #26954). The AMX kernels run
    only on weights in the CPU_AMX extra buffer, so such models load with ``use_extra_bufts``
    off (plain CPU buffers; ggml's x86 repacking goes with it). ``LLAMA_CPP_AMX=1`` keeps them,
    for a build whose compiler keeps the configuration.
    """
    global _amx_verdict
    if _amx_verdict is None:
        from ._native import loader as _loader

        try:
            info = _loader.system_info()
        except Exception:  # noqa: BLE001 - no libraries: nothing to protect
            info = ""
        _amx_verdict = "AMX_INT8 = 1" in info and os.environ.get("LLAMA_CPP_AMX") != "1"
        if _amx_verdict:
            log.warning("this CPU backend has ggml's AMX kernels, whose tile configuration the compiler "
                        "dropped (SIGILL on the first AMX matmul, llama.cpp PR #26954): models load without "
                        "extra buffer types (no AMX, no CPU repacking); LLAMA_CPP_AMX=1 keeps them")
    return _amx_verdict


class LlamaModel(_Owned):
    """A loaded ``llama_model`` (weights + vocabulary).

    Two constructor forms: this package's ``LlamaModel(path, n_gpu_layers=..., ...)`` and
    llama-cpp-python's ``LlamaModel(path_model=..., params=llama_model_default_params())``. A
    caller's struct is copied, and its enum and device fields are checked like the keywords;
    its pointer fields (``tensor_split``, ``kv_overrides``, ``progress_callback``) are the
    caller's to keep alive during the call, as in llama-cpp-python.
    """

    _kind = "model"

    def __init__(self, path: str | os.PathLike[str] | None = None, *, path_model: str | os.PathLike[str] | None = None,
                 params: Any = None, verbose: bool = True,
                 n_gpu_layers: int = 0, split_mode: int = LLAMA_SPLIT_MODE_LAYER,
                 main_gpu: int = 0, tensor_split: Sequence[float] | None = None, vocab_only: bool = False,
                 use_mmap: bool = True, use_mlock: bool = False, load_mode: int | None = None,
                 kv_overrides: dict[str, bool | int | float | str] | None = None,
                 check_tensors: bool = False, load_mtp: bool = False,
                 progress_callback: Callable[[float], bool | None] | None = None) -> None:
        self._ref = None
        self._upstream_contexts: weakref.WeakSet[LlamaContext] = weakref.WeakSet()
        self.path = _model_path(path, path_model)
        self.path_model = os.fspath(self.path)
        self.kv_overrides = dict(kv_overrides or {})  # what the header's values were replaced with
        # overrides inside a caller's llama_model_params are not read back: treated as touching anything
        self.kv_overrides_unknown = params is not None and bool(getattr(params, "kv_overrides", None))
        self.verbose = bool(verbose)  # llama.cpp's log goes through logging here, whatever this says
        C = _lib()
        keep: list[Any] = []
        if params is not None:
            keywords = {"n_gpu_layers": n_gpu_layers, "split_mode": split_mode, "main_gpu": main_gpu,
                        "tensor_split": tensor_split, "vocab_only": vocab_only, "use_mmap": use_mmap,
                        "use_mlock": use_mlock, "load_mode": load_mode, "kv_overrides": kv_overrides,
                        "check_tensors": check_tensors, "load_mtp": load_mtp,
                        "progress_callback": progress_callback}
            mixed = sorted(k for k, v in keywords.items() if _differs(v, _MODEL_KEYWORD_DEFAULTS[k]))
            if mixed:
                raise TypeError(f"pass either params= or the keyword fields, not both (got params and {', '.join(mixed)})")
            lp = _struct_copy(C, C.llama_model_params, params, "llama_model_default_params")
            for name in _MODEL_STRUCT_CHECKED:
                _checks.struct_field(C.llama_model_params, name, getattr(lp, name))
            keep.append(params)  # its pointer fields stay valid while llama.cpp reads the copy
            vocab_only, load_mtp = bool(lp.vocab_only), bool(lp.load_mtp)
        else:
            lp = self._keyword_params(C, keep, n_gpu_layers=n_gpu_layers, split_mode=split_mode,
                                      main_gpu=main_gpu, tensor_split=tensor_split, vocab_only=vocab_only,
                                      use_mmap=use_mmap, use_mlock=use_mlock, load_mode=load_mode,
                                      kv_overrides=kv_overrides, check_tensors=check_tensors, load_mtp=load_mtp,
                                      progress_callback=progress_callback)
        self.params = params
        # llama_model_n_layer_nextn reports the file's count even when the NextN tensors were not
        # loaded, and an MTP context over such a model aborts in C: remember what was asked for.
        self.load_mtp = bool(load_mtp)
        _gguf_guard.guard_model_file(self.path)
        if lp.use_extra_bufts and not lp.vocab_only and amx_kernels_unsafe():
            lp.use_extra_bufts = False
        with _logging.router().capture_problems() as problems:
            ptr = C.llama_model_load_from_file(os.fsencode(self.path), lp)
        del keep
        if not ptr:
            reason = "; ".join(problems[-4:]) or "no reason logged"
            raise ModelLoadError(
                f"llama.cpp could not load {self.path}: {reason} (the file is corrupt, truncated, or of an "
                "architecture this build does not support)")
        self._own(ptr, C.llama_model_free)
        self._C = C
        self.vocab_only = bool(vocab_only)
        self._vocab = C.llama_model_get_vocab(ptr)
        self.n_vocab = CallableInt(C.llama_vocab_n_tokens(self._vocab))
        self._metadata: dict[str, str] | None = None

    @staticmethod
    def _keyword_params(C: Any, keep: list[Any], *, n_gpu_layers: int, split_mode: int, main_gpu: int,
                        tensor_split: Sequence[float] | None, vocab_only: bool, use_mmap: bool, use_mlock: bool,
                        load_mode: int | None, kv_overrides: dict[str, bool | int | float | str] | None,
                        check_tensors: bool, load_mtp: bool,
                        progress_callback: Callable[[float], bool | None] | None) -> Any:
        """``llama_model_params`` from this package's keywords; what the struct points at goes in ``keep``."""
        params = C.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.split_mode = int(split_mode)
        params.main_gpu = int(main_gpu)
        params.vocab_only = bool(vocab_only)
        params.check_tensors = bool(check_tensors)
        params.load_mtp = bool(load_mtp)
        params.load_mode = load_mode_from_flags(use_mmap, use_mlock) if load_mode is None else int(load_mode)
        if tensor_split is not None:
            n_max = int(C.llama_max_devices())
            if len(tensor_split) > n_max:
                raise ValueError(f"tensor_split has {len(tensor_split)} entries; this build supports {n_max} devices")
            ts = (ctypes.c_float * n_max)(*[float(x) for x in tensor_split])
            keep.append(ts)
            params.tensor_split = ts
        if kv_overrides:
            arr = _kv_overrides_array(C, kv_overrides)
            keep.append(arr)
            params.kv_overrides = arr
        if progress_callback is not None:
            def _progress(progress: float, _user: Any) -> bool:
                try:
                    return progress_callback(float(progress)) is not False
                except Exception:  # an exception must not unwind through C
                    log.exception("model load progress callback failed")
                    return True

            cb = C.llama_progress_callback(_progress)
            keep.append(cb)
            params.progress_callback = cb
        return params

    @staticmethod
    def default_params() -> Any:
        """``llama_model_default_params()`` (llama-cpp-python's helper)."""
        return _lib().llama_model_default_params()

    def close(self) -> None:
        """Free the model; contexts made in llama-cpp-python's form (``params=``) close with it, as
        there. Contexts made with keywords keep the native model alive until they close."""
        for ctx in list(getattr(self, "_upstream_contexts", ())):
            ctx.close()
        super().close()

    # -- properties -------------------------------------------------------------------------
    @property
    def ptr(self) -> Any:
        return self._ptr()

    @property
    def vocab(self) -> Any:
        self._ptr()
        return self._vocab

    def n_ctx_train(self) -> int:
        return int(self._C.llama_model_n_ctx_train(self._ptr()))

    def n_embd(self) -> int:
        return int(self._C.llama_model_n_embd(self._ptr()))

    def n_embd_inp(self) -> int:
        return int(self._C.llama_model_n_embd_inp(self._ptr()))

    def n_embd_out(self) -> int:
        return int(self._C.llama_model_n_embd_out(self._ptr()))

    def n_layer(self) -> int:
        return int(self._C.llama_model_n_layer(self._ptr()))

    def n_layer_nextn(self) -> int:
        return int(self._C.llama_model_n_layer_nextn(self._ptr()))

    def n_head(self) -> int:
        return int(self._C.llama_model_n_head(self._ptr()))

    def n_params(self) -> int:
        return int(self._C.llama_model_n_params(self._ptr()))

    def size(self) -> int:
        return int(self._C.llama_model_size(self._ptr()))

    def n_cls_out(self) -> int:
        return int(self._C.llama_model_n_cls_out(self._ptr()))

    def rope_type(self) -> int:
        return int(self._C.llama_model_rope_type(self._ptr()))

    def n_pos_per_embd(self) -> int:
        """Positions per embedding input: 4 for M-RoPE models, else 1."""
        return 4 if self.rope_type() in (LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE) else 1

    def has_encoder(self) -> bool:
        return bool(self._C.llama_model_has_encoder(self._ptr()))

    def has_decoder(self) -> bool:
        return bool(self._C.llama_model_has_decoder(self._ptr()))

    def is_recurrent(self) -> bool:
        return bool(self._C.llama_model_is_recurrent(self._ptr()))

    def is_hybrid(self) -> bool:
        return bool(self._C.llama_model_is_hybrid(self._ptr()))

    def decoder_start_token(self) -> int:
        return int(self._C.llama_model_decoder_start_token(self._ptr()))

    def desc(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._C.llama_model_desc(self._ptr(), buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self, name: str | None = None) -> str | None:
        res = self._C.llama_model_chat_template(self._ptr(), name.encode() if name else None)
        return _cstr(res)

    def cls_label(self, i: int) -> str | None:
        return _cstr(self._C.llama_model_cls_label(self._ptr(), int(i)))

    @property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata scalars as strings (arrays are not exposed by llama.cpp's C API)."""
        if self._metadata is None:
            C, ptr = self._C, self._ptr()
            out: dict[str, str] = {}
            buf_size = 1024
            buf = ctypes.create_string_buffer(buf_size)
            for i in range(int(C.llama_model_meta_count(ptr))):
                n = C.llama_model_meta_key_by_index(ptr, i, buf, buf_size)
                if n < 0:
                    continue
                if n >= buf_size:
                    buf_size = n + 1
                    buf = ctypes.create_string_buffer(buf_size)
                    C.llama_model_meta_key_by_index(ptr, i, buf, buf_size)
                key = buf.value.decode("utf-8", errors="replace")
                n = C.llama_model_meta_val_str_by_index(ptr, i, buf, buf_size)
                if n < 0:
                    continue
                if n >= buf_size:
                    buf_size = n + 1
                    buf = ctypes.create_string_buffer(buf_size)
                    C.llama_model_meta_val_str_by_index(ptr, i, buf, buf_size)
                out[key] = buf.value.decode("utf-8", errors="replace")
            self._metadata = out
        return CallableDict(self._metadata)

    # -- vocabulary ---------------------------------------------------------------------------
    def token_bos(self) -> int:
        return int(self._C.llama_vocab_bos(self.vocab))

    def token_eos(self) -> int:
        return int(self._C.llama_vocab_eos(self.vocab))

    def token_eot(self) -> int:
        return int(self._C.llama_vocab_eot(self.vocab))

    def token_sep(self) -> int:
        return int(self._C.llama_vocab_sep(self.vocab))

    def token_nl(self) -> int:
        return int(self._C.llama_vocab_nl(self.vocab))

    def add_bos(self) -> bool:
        return bool(self._C.llama_vocab_get_add_bos(self.vocab))

    def add_eos(self) -> bool:
        return bool(self._C.llama_vocab_get_add_eos(self.vocab))

    def add_sep(self) -> bool:
        return bool(self._C.llama_vocab_get_add_sep(self.vocab))

    def is_eog(self, token: int) -> bool:
        return bool(self._C.llama_vocab_is_eog(self.vocab, int(token)))

    # -- llama-cpp-python's names -------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The native ``llama_model`` pointer; None once closed (llama-cpp-python's attribute)."""
        ref = self._ref
        return None if ref is None else ref.ptr

    def vocab_type(self) -> int:
        return int(self._C.llama_vocab_type(self.vocab))

    def rope_freq_scale_train(self) -> float:
        return float(self._C.llama_model_rope_freq_scale_train(self._ptr()))

    def token_get_text(self, token: int) -> str:
        return self.token_text(token)

    def token_get_score(self, token: int) -> float:
        self.check_tokens([token])
        return float(self._C.llama_vocab_get_score(self.vocab, int(token)))

    def token_get_attr(self, token: int) -> int:
        self.check_tokens([token])
        return int(self._C.llama_vocab_get_attr(self.vocab, int(token)))

    def token_cls(self) -> int:
        return int(self._C.llama_vocab_bos(self.vocab))  # llama.cpp folded CLS into BOS

    def token_prefix(self) -> int:
        return int(self._C.llama_vocab_fim_pre(self.vocab))

    def token_middle(self) -> int:
        return int(self._C.llama_vocab_fim_mid(self.vocab))

    def token_suffix(self) -> int:
        return int(self._C.llama_vocab_fim_suf(self.vocab))

    def add_bos_token(self) -> bool:
        return self.add_bos()

    def add_eos_token(self) -> bool:
        return self.add_eos()

    def token_text(self, token: int) -> str:
        self.check_tokens([token])
        return _cstr(self._C.llama_vocab_get_text(self.vocab, int(token))) or ""

    def check_tokens(self, tokens: Iterable[int], what: str = "token") -> None:
        """Raise TokenizationError naming the first id outside ``[0, n_vocab)``."""
        n = self.n_vocab
        arr = np.asarray(tokens)
        if arr.size == 0:
            return
        if arr.dtype.kind not in "iu":
            raise TokenizationError(f"{what} ids must be integers, got dtype {arr.dtype}")
        bad = np.nonzero((arr < 0) | (arr >= n))[0]
        if bad.size:
            i = int(bad[0])
            raise TokenizationError(
                f"{what} id {int(arr.flat[i])} at index {i} is outside the vocabulary [0, {n})")

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = False, *,
                 add_bos: bool | None = None, special: bool | None = None) -> list[int]:
        """Token ids of ``text``; ``add_bos``/``special`` are llama-cpp-python's names for
        ``add_special``/``parse_special`` (same positions)."""
        if add_bos is not None:
            add_special = add_bos
        if special is not None:
            parse_special = special
        if isinstance(text, str):
            text = text.encode("utf-8")
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"tokenize expects bytes, got {type(text).__name__}")
        C, vocab = self._C, self.vocab
        text = bytes(text)
        n_max = len(text) + 2 * int(add_special) + 1
        buf = (ctypes.c_int32 * n_max)()
        n = C.llama_tokenize(vocab, text, len(text), buf, n_max, add_special, parse_special)
        if n == -(2 ** 31):
            raise TokenizationError("tokenization result exceeds the int32 range; split the text")
        if n < 0:
            n_max = -n
            buf = (ctypes.c_int32 * n_max)()
            n = C.llama_tokenize(vocab, text, len(text), buf, n_max, add_special, parse_special)
            if n < 0:
                raise TokenizationError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    def pooling_from_metadata(self) -> int:
        """The GGUF's ``<arch>.pooling_type`` (-1 when absent)."""
        md = self.metadata
        value = md.get(f"{md.get('general.architecture', '')}.pooling_type")
        try:
            return int(value) if value is not None else -1
        except ValueError:
            return -1

    def _space_prefix(self) -> bool:
        if not hasattr(self, "_space_prefix_cache"):
            spm = int(self._C.llama_vocab_type(self.vocab)) == LLAMA_VOCAB_TYPE_SPM
            flag = self.metadata.get("tokenizer.ggml.add_space_prefix", "true").lower() != "false"
            self._space_prefix_cache = spm and flag
        return self._space_prefix_cache

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        token = int(token)
        if not 0 <= token < self.n_vocab:  # a scalar test: this runs once per generated token
            raise TokenizationError(f"token id {token} is outside the vocabulary [0, {self.n_vocab})")
        buf = ctypes.create_string_buffer(64)
        n = self._C.llama_token_to_piece(self.vocab, token, buf, 64, lstrip, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._C.llama_token_to_piece(self.vocab, int(token), buf, -n, lstrip, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], special: bool = False,
                   remove_special: bool = False) -> bytes:
        tokens = [int(t) for t in tokens]
        self.check_tokens(tokens)
        if not tokens:
            return b""
        if len(tokens) > 1 and tokens[0] == self.token_bos() and self._space_prefix():
            # llama.cpp keeps the tokenizer's added leading space when BOS comes first; drop it so
            # that detokenize(tokenize(text)) == text, as llama-cpp-python does
            return (self.detokenize(tokens[:1], special, remove_special)
                    + self.detokenize(tokens[1:], special, remove_special))
        arr = (ctypes.c_int32 * len(tokens))(*tokens)
        cap = max(64, 8 * len(tokens))
        buf = ctypes.create_string_buffer(cap)
        n = self._C.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, remove_special, special)
        if n < 0:
            cap = -n
            buf = ctypes.create_string_buffer(cap)
            n = self._C.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, remove_special, special)
        return buf.raw[:n]


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


class CpuThreadpool(_Owned):
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
            _lib()
            from . import ggml_cpp as G

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


class LlamaContext(_Owned):
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
        C = model._C
        unknown = set(fields) - set(CONTEXT_PARAM_NAMES)
        if unknown:
            raise TypeError(f"unknown context parameter(s): {', '.join(sorted(unknown))}")
        if params is not None:
            if fields:
                raise TypeError(f"pass either params= or the keyword fields, not both "
                                f"(got params and {', '.join(sorted(fields))})")
            cp = _struct_copy(C, C.llama_context_params, params, "llama_context_default_params")
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
        parents = [model._ref]
        if ctx_other is not None:
            cp.ctx_other = ctx_other._ptr()
            parents.append(ctx_other._ref)
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
        self._own(ptr, C.llama_free, parents + [p._ref for p in pools])
        if pools:
            tp, tpb = pools[0], (pools[1] if len(pools) > 1 else None)
            C.llama_attach_threadpool(ptr, tp._ptr(), tpb._ptr() if tpb is not None else None)
        for p in pools:
            p.close()  # freed once this context (their last user) is freed
        self._C = C
        self.model = model._ref  # the native model; the wrapper may be closed by its owner
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
            getattr(model, "_upstream_contexts", set()).add(self)

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
        return _lib().llama_context_default_params()

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
        return int(self._C.llama_state_get_size(self._ptr()))

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

    @property
    def ptr(self) -> Any:
        return self._ptr()

    # sizes, as the context resolved them
    def n_ctx(self) -> int:
        self._ptr()
        return self._n_ctx

    def n_ctx_seq(self) -> int:
        return int(self._C.llama_n_ctx_seq(self._ptr()))

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
        return bool(self._C.llama_get_causal_attn(self._ptr()))

    def set_causal_attn(self, value: bool) -> None:
        self._C.llama_set_causal_attn(self._ptr(), bool(value))

    def set_embeddings(self, value: bool) -> None:
        self._C.llama_set_embeddings(self._ptr(), bool(value))
        self.embeddings_enabled = bool(value)

    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        self._C.llama_set_n_threads(self._ptr(), int(n_threads), int(n_threads_batch))

    def synchronize(self) -> None:
        self._C.llama_synchronize(self._ptr())

    # -- memory -------------------------------------------------------------------------------
    def _check_seq(self, seq_id: int, allow_negative: bool = False) -> None:
        if allow_negative and seq_id < 0:
            return
        if not 0 <= seq_id < self._n_seq_max:
            raise ValueError(f"sequence id {seq_id} is outside [0, n_seq_max={self._n_seq_max})")

    def memory_clear(self, data: bool = True) -> None:
        self._ptr()
        self._C.llama_memory_clear(self._mem, bool(data))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self._ptr()
        self._check_seq(seq_id, allow_negative=True)
        return bool(self._C.llama_memory_seq_rm(self._mem, int(seq_id), int(p0), int(p1)))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._ptr()
        self._check_seq(src)
        self._check_seq(dst)
        self._C.llama_memory_seq_cp(self._mem, int(src), int(dst), int(p0), int(p1))

    def seq_keep(self, seq_id: int) -> None:
        self._ptr()
        self._check_seq(seq_id)
        self._C.llama_memory_seq_keep(self._mem, int(seq_id))

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self._ptr()
        self._check_seq(seq_id, allow_negative=True)
        self._C.llama_memory_seq_add(self._mem, int(seq_id), int(p0), int(p1), int(delta))

    def seq_pos_min(self, seq_id: int) -> int:
        self._ptr()
        self._check_seq(seq_id)
        return int(self._C.llama_memory_seq_pos_min(self._mem, int(seq_id)))

    def seq_pos_max(self, seq_id: int) -> int:
        self._ptr()
        self._check_seq(seq_id)
        return int(self._C.llama_memory_seq_pos_max(self._mem, int(seq_id)))

    # -- state --------------------------------------------------------------------------------
    def state_get(self) -> bytes:
        C, ptr = self._C, self._ptr()
        size = int(C.llama_state_get_size(ptr))
        buf = (ctypes.c_uint8 * size)()
        n = int(C.llama_state_get_data(ptr, buf, size))
        return ctypes.string_at(buf, n)  # bytes(buf[:n]) builds a list of ints first: seconds for GBs

    def state_set(self, data: bytes) -> None:
        C, ptr = self._C, self._ptr()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        n = int(C.llama_state_set_data(ptr, buf, len(data)))
        if n != len(data):
            raise LlamaError(f"llama_state_set_data read {n} of {len(data)} bytes: the state does not "
                             "belong to this model/context configuration")

    def state_seq_get(self, seq_id: int, flags: int = 0) -> bytes:
        C, ptr = self._C, self._ptr()
        self._check_seq(seq_id)
        size = int(C.llama_state_seq_get_size_ext(ptr, seq_id, flags))
        buf = (ctypes.c_uint8 * size)()
        n = int(C.llama_state_seq_get_data_ext(ptr, buf, size, seq_id, flags))
        return ctypes.string_at(buf, n)

    def state_seq_set(self, data: bytes, seq_id: int, flags: int = 0) -> None:
        C, ptr = self._C, self._ptr()
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
        rc = int(self._C.llama_decode(self._ptr(), raw))
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc}: {_DECODE_ERRORS.get(rc, 'fatal error')}")

    def encode(self, batch: LlamaBatch, start: int = 0, count: int | None = None) -> None:
        """Run ``llama_encode`` (encoder models, non-causal embeddings)."""
        raw = batch.validated_view(self, start, count)
        self._check_count(raw.n_tokens, encode=True)
        rc = int(self._C.llama_encode(self._ptr(), raw))
        if rc != 0:
            raise DecodeError(f"llama_encode returned {rc}: {_DECODE_ERRORS.get(rc, 'fatal error')}")

    def process(self, batch: LlamaBatchExtNative, encode: bool = False) -> None:
        """Submit an extended batch with ``llama_process`` (ENCODE or DECODE)."""
        if batch.context_ref is not self._ref:
            raise ValueError("this extended batch was created for another context")
        self._check_count(batch.n_tokens, encode=encode)
        batch.check_ready()
        kind = self._C.LLAMA_PROCESS_TYPE_ENCODE if encode else self._C.LLAMA_PROCESS_TYPE_DECODE
        rc = int(self._C.llama_process(self._ptr(), kind, batch.ptr))
        if rc != 0:
            what = "encode" if encode else "decode"
            raise DecodeError(f"llama_process({what}) returned {rc}: {_DECODE_ERRORS.get(rc, 'fatal error')}")

    def logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch entry ``i`` of the last decode (an output entry; negative counts outputs
        from the end), as a read-only view valid until the next decode."""
        v = float_view(self._C.llama_get_logits_ith(self._ptr(), int(i)), self._n_vocab)
        if v is None:
            raise IndexError(f"no logits for batch index {i}: mark that entry as an output")
        return v

    def embeddings_ith(self, i: int) -> np.ndarray:
        v = float_view(self._C.llama_get_embeddings_ith(self._ptr(), int(i)), self._n_embd_out)
        if v is None:
            raise IndexError(f"no embeddings for batch index {i}: enable embeddings and mark it as output")
        return v

    def embeddings_seq(self, seq_id: int, n: int | None = None) -> np.ndarray:
        self._check_seq(seq_id)
        width = self._n_embd_out if n is None else n
        v = float_view(self._C.llama_get_embeddings_seq(self._ptr(), int(seq_id)), width)
        if v is None:
            raise IndexError(f"no pooled embedding for sequence {seq_id} (pooling NONE, or not in the last batch)")
        return v

    def perf(self) -> dict[str, float]:
        d = self._C.llama_perf_context(self._ptr())
        return {k: getattr(d, k) for k in ("t_start_ms", "t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval",
                                          "n_eval", "n_reused")}

    def perf_reset(self) -> None:
        self._C.llama_perf_context_reset(self._ptr())

    def set_adapters_lora(self, adapters: Sequence[LlamaLoraAdapter], scales: Sequence[float]) -> None:
        if len(adapters) != len(scales):
            raise ValueError("one scale per LoRA adapter is required")
        n = len(adapters)
        arr = (ctypes.c_void_p * max(n, 1))(*[a._ptr_int() for a in adapters])
        sc = (ctypes.c_float * max(n, 1))(*[float(s) for s in scales])
        rc = int(self._C.llama_set_adapters_lora(self._ptr(), ctypes.cast(arr, ctypes.c_void_p) if n else None,
                                                 n, sc if n else None))
        if rc != 0:
            raise LlamaError(f"llama_set_adapters_lora failed ({rc}): adapter does not fit this model")
        self._adapters = list(adapters)  # keep them alive while attached


# --------------------------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------------------------

class LlamaLoraAdapter(_Owned):
    """A LoRA adapter loaded for one model (freed before that model)."""

    _kind = "LoRA adapter"

    def __init__(self, model: LlamaModel, path: str | os.PathLike[str]) -> None:
        self._ref = None
        p = check_gguf_file(path)
        C = model._C
        ptr = C.llama_adapter_lora_init(model.ptr, os.fsencode(p))
        if not ptr:
            raise ModelLoadError(f"llama.cpp could not load the LoRA adapter {p} for this model")
        self._own(ptr, C.llama_adapter_lora_free, [model._ref])
        self.path = p

    def _ptr_int(self) -> int:
        p = self._ptr()
        return p if isinstance(p, int) else ctypes.cast(p, ctypes.c_void_p).value


# --------------------------------------------------------------------------------------------
# sampler chain
# --------------------------------------------------------------------------------------------

class LlamaSampler(_Owned):
    """A ``llama_sampler_chain``; samplers added to it are owned (and freed) by the chain."""

    _kind = "sampler chain"

    def __init__(self, no_perf: bool = True) -> None:
        self._ref = None
        C = _lib()
        params = C.llama_sampler_chain_default_params()
        params.no_perf = bool(no_perf)
        ptr = C.llama_sampler_chain_init(params)
        if not ptr:
            raise LlamaError("llama_sampler_chain_init failed")
        self._own(ptr, C.llama_sampler_free)
        self._C = C
        self.names: list[str] = []

    @property
    def ptr(self) -> Any:
        return self._ptr()

    def _add(self, name: str, smpl: Any) -> LlamaSampler:
        if not smpl:
            raise LlamaError(f"llama.cpp refused to create the {name} sampler")
        self._C.llama_sampler_chain_add(self._ptr(), smpl)
        self.names.append(name)
        return self

    def add_greedy(self) -> LlamaSampler:
        return self._add("greedy", self._C.llama_sampler_init_greedy())

    def add_dist(self, seed: int) -> LlamaSampler:
        return self._add("dist", self._C.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))

    def add_top_k(self, k: int) -> LlamaSampler:
        return self._add("top_k", self._C.llama_sampler_init_top_k(int(k)))

    def add_top_p(self, p: float, min_keep: int = 1) -> LlamaSampler:
        return self._add("top_p", self._C.llama_sampler_init_top_p(float(p), int(min_keep)))

    def add_min_p(self, p: float, min_keep: int = 1) -> LlamaSampler:
        return self._add("min_p", self._C.llama_sampler_init_min_p(float(p), int(min_keep)))

    def add_typical(self, p: float, min_keep: int = 1) -> LlamaSampler:
        return self._add("typical", self._C.llama_sampler_init_typical(float(p), int(min_keep)))

    def add_temp(self, t: float) -> LlamaSampler:
        return self._add("temp", self._C.llama_sampler_init_temp(float(t)))

    def add_temp_ext(self, t: float, delta: float, exponent: float) -> LlamaSampler:
        return self._add("temp_ext", self._C.llama_sampler_init_temp_ext(float(t), float(delta), float(exponent)))

    def add_mirostat(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100) -> LlamaSampler:
        return self._add("mirostat", self._C.llama_sampler_init_mirostat(
            int(n_vocab), int(seed) & 0xFFFFFFFF, float(tau), float(eta), int(m)))

    def add_mirostat_v2(self, seed: int, tau: float, eta: float) -> LlamaSampler:
        return self._add("mirostat_v2", self._C.llama_sampler_init_mirostat_v2(
            int(seed) & 0xFFFFFFFF, float(tau), float(eta)))

    def add_penalties(self, n_vocab: int, last_n: int, repeat: float, freq: float,
                      present: float) -> LlamaSampler:
        if repeat <= 0:
            raise ValueError(f"repeat_penalty must be > 0 (1.0 disables it), got {repeat}")
        return self._add("penalties", self._C.llama_sampler_init_penalties(
            int(n_vocab), int(last_n), float(repeat), float(freq), float(present)))

    def add_logit_bias(self, n_vocab: int, bias: dict[int, float]) -> LlamaSampler:
        C = self._C
        items = list(bias.items())
        for i, (tok, _) in enumerate(items):
            if not 0 <= int(tok) < n_vocab:
                raise TokenizationError(f"logit_bias token id {tok} (entry {i}) is outside the vocabulary [0, {n_vocab})")
        arr = (C.llama_logit_bias * len(items))()
        for i, (tok, b) in enumerate(items):
            arr[i].token = int(tok)
            arr[i].bias = float(b)
        return self._add("logit_bias", C.llama_sampler_init_logit_bias(int(n_vocab), len(items), arr))

    def add_xtc(self, p: float, t: float, min_keep: int, seed: int) -> LlamaSampler:
        return self._add("xtc", self._C.llama_sampler_init_xtc(
            _checks.finite("p", p), _checks.finite("t", t), int(min_keep), int(seed) & 0xFFFFFFFF))

    def add_top_n_sigma(self, n: float) -> LlamaSampler:
        return self._add("top_n_sigma", self._C.llama_sampler_init_top_n_sigma(_checks.finite("n", n)))

    def add_softmax(self) -> LlamaSampler:
        """Nothing to add: llama.cpp's dist sampler works from logits (llama-cpp-python deprecated this too)."""
        import warnings

        warnings.warn("add_softmax is deprecated and does nothing: the dist sampler samples from logits",
                      DeprecationWarning, stacklevel=2)
        return self

    def add_dry(self, model: LlamaModel, dry_multiplier: float, dry_base: float, dry_allowed_length: int,
                dry_penalty_last_n: int, seq_breakers: Sequence[str]) -> LlamaSampler:
        """The DRY repetition sampler; ``seq_breakers`` are strings that end a repeated sequence."""
        breakers = [b.encode("utf-8") if isinstance(b, str) else b for b in seq_breakers]
        for i, b in enumerate(breakers):
            if not isinstance(b, bytes) or not b or b"\0" in b:
                raise ValueError(f"seq_breakers[{i}] must be a non-empty string without NUL, got {seq_breakers[i]!r}")
        arr = (ctypes.c_char_p * max(len(breakers), 1))(*breakers)
        last_n = _checks.in_range("dry_penalty_last_n", dry_penalty_last_n, -1, 2 ** 31 - 1)
        return self._add("dry", self._C.llama_sampler_init_dry(
            model.vocab, _checks.finite("dry_multiplier", dry_multiplier), _checks.finite("dry_base", dry_base),
            _checks.in_range("dry_allowed_length", dry_allowed_length, 0, 2 ** 31 - 1), last_n,
            arr, len(breakers)))

    def add_infill(self, model: LlamaModel) -> LlamaSampler:
        return self._add("infill", self._C.llama_sampler_init_infill(model.vocab))

    def clone(self) -> LlamaSampler:
        """An independent copy of the chain and its samplers' state (``llama_sampler_clone``)."""
        ptr = self._C.llama_sampler_clone(self._ptr())
        if not ptr:
            raise LlamaError("llama_sampler_clone failed")
        twin = LlamaSampler.__new__(LlamaSampler)
        twin._ref = None
        twin._own(ptr, self._C.llama_sampler_free)
        twin._C = self._C
        twin.names = list(self.names)
        return twin

    def get_seed(self) -> int:
        """The seed of the chain's seeded sampler (``LLAMA_DEFAULT_SEED`` when it has none)."""
        return int(self._C.llama_sampler_get_seed(self._ptr()))

    def add_grammar(self, model: LlamaModel, grammar: Any, root: str = "root") -> LlamaSampler:
        """A GBNF grammar sampler; ``grammar`` is GBNF text or a :class:`~llama_cpp.LlamaGrammar`
        (llama-cpp-python's form, whose own root rule is used)."""
        from ._errors import LlamaError as _E

        if not isinstance(grammar, str):
            text, start = getattr(grammar, "_grammar", None), getattr(grammar, "_root", None)
            if not isinstance(text, str) or not isinstance(start, str):
                raise TypeError(f"grammar must be GBNF text or a LlamaGrammar, not {type(grammar).__name__}")
            grammar, root = text, start
        smpl = self._C.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), root.encode("utf-8"))
        if not smpl:
            raise _E("llama.cpp could not parse the GBNF grammar (its log names the failing rule)")
        return self._add("grammar", smpl)

    def sample(self, ctx: LlamaContext, idx: int = -1) -> int:
        return int(self._C.llama_sampler_sample(self._ptr(), ctx.ptr, int(idx)))

    def accept(self, token: int) -> None:
        self._C.llama_sampler_accept(self._ptr(), int(token))

    def apply(self, cur_p: Any) -> None:
        self._C.llama_sampler_apply(self._ptr(), cur_p)

    def reset(self) -> None:
        self._C.llama_sampler_reset(self._ptr())

    def __len__(self) -> int:
        return int(self._C.llama_sampler_chain_n(self._ptr()))


class TokenCandidates:
    """A reusable ``llama_token_data_array`` filled from a logits row (for samplers applied by hand)."""

    def __init__(self, n_vocab: int) -> None:
        C = _lib()
        self._C = C
        self.n_vocab = n_vocab
        self._data = (C.llama_token_data * n_vocab)()
        dtype = np.dtype({"names": ["id", "logit", "p"], "formats": ["<i4", "<f4", "<f4"],
                          "offsets": [0, 4, 8], "itemsize": ctypes.sizeof(C.llama_token_data)})
        self.view = np.frombuffer(self._data, dtype=dtype)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.array = C.llama_token_data_array(
            ctypes.cast(self._data, ctypes.POINTER(C.llama_token_data)), n_vocab, -1, False)
        self.ref = ctypes.byref(self.array)

    def fill(self, logits: np.ndarray) -> None:
        v = self.view
        v["id"] = self._ids
        v["logit"] = logits
        v["p"] = 0.0
        a = self.array
        a.data = ctypes.cast(self._data, ctypes.POINTER(self._C.llama_token_data))
        a.size = self.n_vocab
        a.selected = -1
        a.sorted = False

    def selected_token(self) -> int:
        a = self.array
        if a.selected < 0 or a.selected >= a.size:
            raise LlamaError("the sampler chain selected no token (every candidate was filtered out)")
        return int(a.data[a.selected].id)


class LlamaTokenDataArray(TokenCandidates):
    """llama-cpp-python's name and attributes for :class:`TokenCandidates`: ``candidates`` (the
    ``llama_token_data_array``), ``candidates_data`` (its NumPy view) and ``copy_logits``."""

    def __init__(self, *, n_vocab: int) -> None:
        n = int(n_vocab)
        if n <= 0:
            raise ValueError(f"n_vocab must be positive, got {n_vocab}")
        super().__init__(n)
        self.candidates = self.array
        self.candidates_data = self.view
        self.default_candidates_data_id = self._ids

    def copy_logits(self, logits: np.ndarray) -> None:
        row = np.asarray(logits, dtype=np.float32)
        if row.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {row.shape}")
        self.fill(row)


def normalize_embedding(embedding: Sequence[float]) -> list[float]:
    """``embedding`` scaled to unit L2 norm (an all-zero row stays zero), as a list
    (llama-cpp-python's helper, over :func:`llama_cpp._core.normalize.normalize_embeddings`)."""
    from ._core.normalize import normalize_embeddings

    return normalize_embeddings(np.asarray(embedding, dtype=np.float64), 2).tolist()


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
        C = _lib()
        self._C = C
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
        """A ``llama_batch`` over entries ``[start, start+count)``, checked against ``ctx``."""
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
        s = self._C.llama_batch()
        self._fill_struct(s, start, count)
        s._keep = self  # the view must not outlive the buffers
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
    C = ctx._C
    if not C.__bindings__.functions["llama_model_target_layer_ids_n"].available():
        return inp, inp  # llama.cpp accepts the encoder width too; without the count it cannot be derived
    n_layers = int(C.llama_model_target_layer_ids_n(model.ptr))
    if arch == "eagle3":
        enc = n_layers * int(model.metadata.get("eagle3.target_hidden_size", "0"))
        return inp, enc or inp
    enc = n_layers * model.n_embd()
    return enc, enc


class LlamaBatchExtNative(_Owned):
    """A native ``llama_batch_ext`` sized from (and keeping alive) one context.

    Entries are validated in Python before each native call; the return codes of the C API
    (-1 full, -2 bad token/embedding, -3 bad sequence) are turned into exceptions anyway.
    """

    _kind = "extended batch"

    def __init__(self, ctx: LlamaContext) -> None:
        self._ref = None
        C = ctx._C
        ptr = C.llama_batch_ext_init(ctx.ptr)
        if not ptr:
            raise LlamaError("llama_batch_ext_init failed")
        self._own(ptr, C.llama_batch_ext_free, [ctx._ref])
        self._C = C
        self.context_ref = ctx._ref
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

    @property
    def ptr(self) -> Any:
        return self._ptr()

    def clear(self) -> None:
        self._C.llama_batch_ext_clear(self._ptr())
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
        e = self._C.llama_embd()
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
        C, b = self._C, self._ptr()
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
        C, b = self._C, self._ptr()
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
        if not self._C.llama_batch_ext_set_embd_token(self._ptr(), int(idx), e):
            raise ValueError(f"entry {idx}: llama.cpp refused the row (already set, or width mismatch)")
        self._row_width = a.size
        del a

    def add_seq(self, idx: int, seq_id: int) -> None:
        self._check_index(idx)
        self._check_seq(seq_id, f"entry {idx}")
        if not self._C.llama_batch_ext_add_seq(self._ptr(), int(idx), int(seq_id)):
            raise ValueError(f"entry {idx}: llama.cpp refused sequence {seq_id}")

    def set_pos(self, idx: int, pos: int | Sequence[int]) -> None:
        self._check_index(idx)
        p = self._positions(pos, self._is_embd[idx], f"entry {idx}")
        self._C.llama_batch_ext_set_pos(self._ptr(), int(idx), p)

    def set_output(self, idx: int, value: bool = True) -> None:
        self._check_index(idx)
        self._C.llama_batch_ext_set_output_logits(self._ptr(), int(idx), bool(value))
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

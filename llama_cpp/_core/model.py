"""The model: :class:`LlamaModel` (loading, vocabulary, tokenizer, metadata), its load parameters and
its LoRA adapters (:class:`LlamaLoraAdapter`).
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import (
    ModelLoadError,
    TokenizationError,
)
from .._native import log_routing as _logging
from .._safety import checks as _checks
from .._safety import tokenize_bounds as _tokenize_bounds
from .._safety.header_checks import check_header
from ..llama_cpp import (
    LLAMA_FLASH_ATTN_TYPE_AUTO,
    LLAMA_FLASH_ATTN_TYPE_DISABLED,
    LLAMA_FLASH_ATTN_TYPE_ENABLED,
    LLAMA_LOAD_MODE_MLOCK,
    LLAMA_LOAD_MODE_MMAP,
    LLAMA_LOAD_MODE_MMAP_MLOCK,
    LLAMA_LOAD_MODE_NONE,
    LLAMA_ROPE_TYPE_IMROPE,
    LLAMA_ROPE_TYPE_MROPE,
    LLAMA_SPLIT_MODE_LAYER,
    LLAMA_VOCAB_TYPE_SPM,
)
from .gguf import check_gguf_file
from .ownership import CallableDict, CallableInt, Owned, cstr, log, native_lib

# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------



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


def _buft_overrides_array(C: Any, overrides: Sequence[tuple[str, int]], keep: list[Any]) -> Any:
    """``llama_model_tensor_buft_override`` entries, terminated by a NULL pattern (llama.cpp's ``-ot``)."""
    limit = int(C.llama_max_tensor_buft_overrides())
    if len(overrides) >= limit:
        raise ValueError(f"{len(overrides)} tensor buffer overrides; llama.cpp takes at most {limit - 1}")
    arr = (C.llama_model_tensor_buft_override * (len(overrides) + 1))()
    for i, (pattern, buft) in enumerate(overrides):
        raw = pattern.encode("utf-8")
        keep.append(raw)
        arr[i].pattern = raw
        arr[i].buft = buft
    keep.append(arr)
    return arr


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
    "check_tensors": False, "load_mtp": False, "progress_callback": None, "devices": None,
    "tensor_buft_overrides": None,
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


def struct_copy(C: Any, struct_type: Any, params: Any, what: str) -> Any:
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
        from .._native import loader as _loader

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


class LlamaModel(Owned):
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
                 progress_callback: Callable[[float], bool | None] | None = None,
                 devices: Sequence[int] | None = None,
                 tensor_buft_overrides: Sequence[tuple[str, int]] | None = None) -> None:
        self._ref = None
        self._upstream_contexts: weakref.WeakSet[Any] = weakref.WeakSet()  # LlamaContexts (context.py is above)
        self.path = _model_path(path, path_model)
        self.path_model = os.fspath(self.path)
        self.kv_overrides = dict(kv_overrides or {})  # what the header's values were replaced with
        # overrides inside a caller's llama_model_params are not read back: treated as touching anything
        self.kv_overrides_unknown = params is not None and bool(getattr(params, "kv_overrides", None))
        self.verbose = bool(verbose)  # llama.cpp's log goes through logging here, whatever this says
        C = native_lib()
        keep: list[Any] = []
        if params is not None:
            keywords = {"n_gpu_layers": n_gpu_layers, "split_mode": split_mode, "main_gpu": main_gpu,
                        "tensor_split": tensor_split, "vocab_only": vocab_only, "use_mmap": use_mmap,
                        "use_mlock": use_mlock, "load_mode": load_mode, "kv_overrides": kv_overrides,
                        "check_tensors": check_tensors, "load_mtp": load_mtp,
                        "progress_callback": progress_callback, "devices": devices,
                        "tensor_buft_overrides": tensor_buft_overrides}
            mixed = sorted(k for k, v in keywords.items() if _differs(v, _MODEL_KEYWORD_DEFAULTS[k]))
            if mixed:
                raise TypeError(f"pass either params= or the keyword fields, not both (got params and {', '.join(mixed)})")
            lp = struct_copy(C, C.llama_model_params, params, "llama_model_default_params")
            for name in _MODEL_STRUCT_CHECKED:
                _checks.struct_field(C.llama_model_params, name, getattr(lp, name))
            keep.append(params)  # its pointer fields stay valid while llama.cpp reads the copy
            vocab_only, load_mtp = bool(lp.vocab_only), bool(lp.load_mtp)
        else:
            lp = self._keyword_params(C, keep, n_gpu_layers=n_gpu_layers, split_mode=split_mode,
                                      main_gpu=main_gpu, tensor_split=tensor_split, vocab_only=vocab_only,
                                      use_mmap=use_mmap, use_mlock=use_mlock, load_mode=load_mode,
                                      kv_overrides=kv_overrides, check_tensors=check_tensors, load_mtp=load_mtp,
                                      progress_callback=progress_callback, devices=devices,
                                      tensor_buft_overrides=tensor_buft_overrides)
        self.params = params
        # llama_model_n_layer_nextn reports the file's count even when the NextN tensors were not
        # loaded, and an MTP context over such a model aborts in C: remember what was asked for.
        self.load_mtp = bool(load_mtp)
        check_header(self.path, self.kv_overrides)  # the header guard, with kv_overrides applied
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
        self.bindings = C
        self.vocab_only = bool(vocab_only)
        self._vocab = C.llama_model_get_vocab(ptr)
        self.n_vocab = CallableInt(C.llama_vocab_n_tokens(self._vocab))
        self._metadata: dict[str, str] | None = None

    @staticmethod
    def _keyword_params(C: Any, keep: list[Any], *, n_gpu_layers: int, split_mode: int, main_gpu: int,
                        tensor_split: Sequence[float] | None, vocab_only: bool, use_mmap: bool, use_mlock: bool,
                        load_mode: int | None, kv_overrides: dict[str, bool | int | float | str] | None,
                        check_tensors: bool, load_mtp: bool,
                        progress_callback: Callable[[float], bool | None] | None,
                        devices: Sequence[int] | None = None,
                        tensor_buft_overrides: Sequence[tuple[str, int]] | None = None) -> Any:
        """``llama_model_params`` from this package's keywords; what the struct points at goes in ``keep``.

        ``devices`` (device handles; empty: no offload) and ``tensor_buft_overrides`` ((pattern, buffer
        type handle) pairs) are resolved from names by :mod:`llama_cpp._placement`.
        """
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
        if devices is not None:  # a NULL-terminated list, as llama.cpp's -dev
            devs = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            keep.append(devs)
            params.devices = ctypes.cast(devs, ctypes.POINTER(ctypes.c_void_p))
        if tensor_buft_overrides:
            params.tensor_buft_overrides = _buft_overrides_array(C, tensor_buft_overrides, keep)
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
        return native_lib().llama_model_default_params()

    def close_with(self, ctx: Any) -> None:
        """Close ``ctx`` (a context of this model) when this model closes: llama-cpp-python's
        ``LlamaContext(model=..., params=...)`` form, where the model owns its contexts."""
        self._upstream_contexts.add(ctx)

    def close(self) -> None:
        """Free the model; contexts made in llama-cpp-python's form (``params=``) close with it, as
        there. Contexts made with keywords keep the native model alive until they close."""
        for ctx in list(getattr(self, "_upstream_contexts", ())):
            ctx.close()
        super().close()

    # -- properties -------------------------------------------------------------------------
    @property
    def vocab(self) -> Any:
        self._ptr()
        return self._vocab

    def n_ctx_train(self) -> int:
        return int(self.bindings.llama_model_n_ctx_train(self._ptr()))

    def n_embd(self) -> int:
        return int(self.bindings.llama_model_n_embd(self._ptr()))

    def n_embd_inp(self) -> int:
        return int(self.bindings.llama_model_n_embd_inp(self._ptr()))

    def n_embd_out(self) -> int:
        return int(self.bindings.llama_model_n_embd_out(self._ptr()))

    def n_layer(self) -> int:
        return int(self.bindings.llama_model_n_layer(self._ptr()))

    def n_layer_nextn(self) -> int:
        return int(self.bindings.llama_model_n_layer_nextn(self._ptr()))

    def n_head(self) -> int:
        return int(self.bindings.llama_model_n_head(self._ptr()))

    def n_params(self) -> int:
        return int(self.bindings.llama_model_n_params(self._ptr()))

    def size(self) -> int:
        return int(self.bindings.llama_model_size(self._ptr()))

    def n_cls_out(self) -> int:
        return int(self.bindings.llama_model_n_cls_out(self._ptr()))

    def rope_type(self) -> int:
        return int(self.bindings.llama_model_rope_type(self._ptr()))

    def n_pos_per_embd(self) -> int:
        """Positions per embedding input: 4 for M-RoPE models, else 1."""
        return 4 if self.rope_type() in (LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE) else 1

    def has_encoder(self) -> bool:
        return bool(self.bindings.llama_model_has_encoder(self._ptr()))

    def has_decoder(self) -> bool:
        return bool(self.bindings.llama_model_has_decoder(self._ptr()))

    def is_recurrent(self) -> bool:
        return bool(self.bindings.llama_model_is_recurrent(self._ptr()))

    def is_hybrid(self) -> bool:
        return bool(self.bindings.llama_model_is_hybrid(self._ptr()))

    def decoder_start_token(self) -> int:
        return int(self.bindings.llama_model_decoder_start_token(self._ptr()))

    def desc(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.bindings.llama_model_desc(self._ptr(), buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self, name: str | None = None) -> str | None:
        res = self.bindings.llama_model_chat_template(self._ptr(), name.encode() if name else None)
        return cstr(res)

    def cls_label(self, i: int) -> str | None:
        return cstr(self.bindings.llama_model_cls_label(self._ptr(), int(i)))

    @property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata scalars as strings (arrays are not exposed by llama.cpp's C API)."""
        if self._metadata is None:
            C, ptr = self.bindings, self._ptr()
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
        return int(self.bindings.llama_vocab_bos(self.vocab))

    def token_eos(self) -> int:
        return int(self.bindings.llama_vocab_eos(self.vocab))

    def token_eot(self) -> int:
        return int(self.bindings.llama_vocab_eot(self.vocab))

    def token_sep(self) -> int:
        return int(self.bindings.llama_vocab_sep(self.vocab))

    def token_nl(self) -> int:
        return int(self.bindings.llama_vocab_nl(self.vocab))

    def add_bos(self) -> bool:
        return bool(self.bindings.llama_vocab_get_add_bos(self.vocab))

    def add_eos(self) -> bool:
        return bool(self.bindings.llama_vocab_get_add_eos(self.vocab))

    def add_sep(self) -> bool:
        return bool(self.bindings.llama_vocab_get_add_sep(self.vocab))

    def is_eog(self, token: int) -> bool:
        return bool(self.bindings.llama_vocab_is_eog(self.vocab, int(token)))

    # -- llama-cpp-python's names -------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The native ``llama_model`` pointer; None once closed (llama-cpp-python's attribute)."""
        ref = self._ref
        return None if ref is None else ref.ptr

    def vocab_type(self) -> int:
        return int(self.bindings.llama_vocab_type(self.vocab))

    def rope_freq_scale_train(self) -> float:
        return float(self.bindings.llama_model_rope_freq_scale_train(self._ptr()))

    def token_get_text(self, token: int) -> str:
        return self.token_text(token)

    def token_get_score(self, token: int) -> float:
        self.check_tokens([token])
        return float(self.bindings.llama_vocab_get_score(self.vocab, int(token)))

    def token_get_attr(self, token: int) -> int:
        self.check_tokens([token])
        return int(self.bindings.llama_vocab_get_attr(self.vocab, int(token)))

    def token_cls(self) -> int:
        return int(self.bindings.llama_vocab_bos(self.vocab))  # llama.cpp folded CLS into BOS

    def token_prefix(self) -> int:
        return int(self.bindings.llama_vocab_fim_pre(self.vocab))

    def token_middle(self) -> int:
        return int(self.bindings.llama_vocab_fim_mid(self.vocab))

    def token_suffix(self) -> int:
        return int(self.bindings.llama_vocab_fim_suf(self.vocab))

    def add_bos_token(self) -> bool:
        return self.add_bos()

    def add_eos_token(self) -> bool:
        return self.add_eos()

    def token_text(self, token: int) -> str:
        self.check_tokens([token])
        return cstr(self.bindings.llama_vocab_get_text(self.vocab, int(token))) or ""

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
        text = bytes(text)
        if len(text) > _tokenize_bounds.THRESHOLD_CHARS:  # SPM is quadratic on byte-fallback runs: exact chunks
            return _tokenize_bounds.tokenize(self, text, add_special, parse_special, self._tokenize_once)
        return self._tokenize_once(text, add_special, parse_special)

    def _tokenize_once(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        """One ``llama_tokenize`` call (retried once with the size it asks for)."""
        C, vocab = self.bindings, self.vocab
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

    def adds_space_prefix(self) -> bool:
        """Whether tokenizing adds a leading space to the text (an SPM vocabulary whose GGUF does not set
        ``tokenizer.ggml.add_space_prefix`` to false): detokenizing drops it again after BOS."""
        if not hasattr(self, "_space_prefix_cache"):
            spm = int(self.bindings.llama_vocab_type(self.vocab)) == LLAMA_VOCAB_TYPE_SPM
            flag = self.metadata.get("tokenizer.ggml.add_space_prefix", "true").lower() != "false"
            self._space_prefix_cache = spm and flag
        return self._space_prefix_cache

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        token = int(token)
        if not 0 <= token < self.n_vocab:  # a scalar test: this runs once per generated token
            raise TokenizationError(f"token id {token} is outside the vocabulary [0, {self.n_vocab})")
        buf = ctypes.create_string_buffer(64)
        n = self.bindings.llama_token_to_piece(self.vocab, token, buf, 64, lstrip, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.bindings.llama_token_to_piece(self.vocab, int(token), buf, -n, lstrip, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], special: bool = False,
                   remove_special: bool = False) -> bytes:
        tokens = [int(t) for t in tokens]
        self.check_tokens(tokens)
        if not tokens:
            return b""
        if len(tokens) > 1 and tokens[0] == self.token_bos() and self.adds_space_prefix():
            # llama.cpp keeps the tokenizer's added leading space when BOS comes first; drop it so
            # that detokenize(tokenize(text)) == text, as llama-cpp-python does
            return (self.detokenize(tokens[:1], special, remove_special)
                    + self.detokenize(tokens[1:], special, remove_special))
        arr = (ctypes.c_int32 * len(tokens))(*tokens)
        cap = max(64, 8 * len(tokens))
        buf = ctypes.create_string_buffer(cap)
        n = self.bindings.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, remove_special, special)
        if n < 0:
            cap = -n
            buf = ctypes.create_string_buffer(cap)
            n = self.bindings.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, remove_special, special)
        return buf.raw[:n]


# --------------------------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------------------------

class LlamaLoraAdapter(Owned):
    """A LoRA adapter loaded for one model (freed before that model)."""

    _kind = "LoRA adapter"

    def __init__(self, model: LlamaModel, path: str | os.PathLike[str]) -> None:
        self._ref = None
        p = check_gguf_file(path)
        C = model.bindings
        ptr = C.llama_adapter_lora_init(model.ptr, os.fsencode(p))
        if not ptr:
            raise ModelLoadError(f"llama.cpp could not load the LoRA adapter {p} for this model")
        self._own(ptr, C.llama_adapter_lora_free, [model.native_ref])
        self.path = p


# upstream's module path for these classes (reprs, pickles): llama_cpp._internals re-exports them
for _cls in (LlamaModel, LlamaLoraAdapter):
    _cls.__module__ = "llama_cpp._internals"

"""An extended batch filled through the C API directly, for the MTP decoder's own entries.

:class:`~llama_cpp._internals.LlamaBatchExtNative` checks every entry in Python (token range,
positions, finiteness of each hidden row), which on small models costs as much as the decode.
The MTP decoder builds its entries itself: token ids that came from the vocabulary (checked
prompt tokens, argmax of the model's logits, sampled tokens), consecutive positions, and hidden
rows that llama.cpp just returned at the model's width. :class:`RawExtBatch` fills the same
native batch without those checks and submits it with ``llama_process``; the C API's own return
codes are still turned into exceptions.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import DecodeError, LlamaError

_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class RawExtBatch:
    """Decode token entries (optionally each with a hidden row) on one context in one call."""

    def __init__(self, batch: Any, ctx: Any, n_embd: int) -> None:
        C = ctx._C
        self._C = C
        self._batch = batch  # keeps the native batch (and its context) alive
        self._b = batch.ptr
        self._ctx = ctx.ptr
        self._pos = (ctypes.c_int32 * 4)()
        self._embd = C.llama_embd()
        self._embd.n_rows = 1
        self._embd.n_embd = int(n_embd)
        self._n_embd = int(n_embd)
        self._kind = C.LLAMA_PROCESS_TYPE_DECODE

    def decode(self, tokens: Sequence[int], pos0: int, outputs: bool,
               rows: Sequence[np.ndarray] | None = None) -> None:
        """Decode ``tokens`` at positions ``pos0..``; ``rows[j]`` (float32, contiguous) goes with token ``j``."""
        C, b, pos, embd = self._C, self._b, self._pos, self._embd
        add, set_pos = C.llama_batch_ext_add_token, C.llama_batch_ext_set_pos
        set_out, set_row = C.llama_batch_ext_set_output_logits, C.llama_batch_ext_set_embd_token
        C.llama_batch_ext_clear(b)
        for j, t in enumerate(tokens):
            idx = int(add(b, 0, int(t)))
            if idx < 0:
                raise LlamaError(f"llama_batch_ext_add_token returned {idx} for token {t} at entry {j}")
            pos[0] = pos0 + j
            set_pos(b, idx, pos)
            if outputs:
                set_out(b, idx, True)
            if rows is not None:
                r = rows[j]
                if r.dtype != np.float32 or r.shape != (self._n_embd,) or not r.flags.c_contiguous:
                    r = np.ascontiguousarray(r, dtype=np.float32).reshape(self._n_embd)
                embd.data = r.ctypes.data_as(_FLOAT_P)
                if not set_row(b, idx, embd):  # copied by llama.cpp now
                    raise LlamaError(f"llama.cpp refused the hidden row of entry {j}")
        rc = int(C.llama_process(self._ctx, self._kind, b))
        if rc != 0:
            raise DecodeError(f"llama_process(decode) returned {rc} on {len(tokens)} entries at position {pos0}")


__all__ = ["RawExtBatch"]

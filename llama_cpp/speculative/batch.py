"""Batches the speculative decoders fill without per-entry Python checks.

:class:`RawBatch` is a plain ``llama_batch`` over numpy buffers, decoded with ``llama_decode``;
:class:`RawExtBatch` fills an extended batch (token + hidden row entries, or embedding rows) for
the MTP decoder and the EAGLE3 and DFlash drafters.

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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaBatch
from .._core.sampler import LlamaSampler
from .._errors import DecodeError, LlamaError, SpeculativeError

_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class RawExtBatch:
    """Decode token entries (optionally each with a hidden row) on one context in one call.

    Where the rows are as wide as the context's extended batches take (an MTP context: the
    model's ``n_embd_out``), :meth:`decode` fills a plain ``llama_batch`` that carries the token
    ids *and* the rows (the pinned llama.cpp's ``llama_batch_compat`` turns it into the same
    extended batch entries, "for example the MTP hook batches") through ctypes views of its
    buffers and submits it with ``llama_decode``: no native call per entry (adding, positioning
    and attaching a row cost four ctypes calls an entry, as much as a tiny draft decode's graph).
    :meth:`rows` (embedding rows without tokens: a DFlash draft's target features, an EAGLE3
    draft's encoder input) does the same through ``llama_decode``/``llama_encode`` when the rows
    are as wide as ``llama_batch_compat`` reads them there (``n_embd_inp``, or ``n_embd_inp_enc``
    for the encoder). Rows of other widths go through the extended batch entry by entry, where
    llama.cpp checks each row's width.
    """

    def __init__(self, batch: Any, ctx: Any, n_embd: int) -> None:
        C = ctx.bindings
        self.bindings = C
        self._batch = batch  # keeps the native batch (and its context) alive
        self._b = batch.ptr
        self._ctx = ctx.ptr
        self._pos = (ctypes.c_int32 * 4)()
        self._embd = C.llama_embd()
        self._embd.n_rows = 1
        self._embd.n_embd = int(n_embd)
        self._n_embd = int(n_embd)
        self._kind = C.LLAMA_PROCESS_TYPE_DECODE
        # the plain-batch path: token ids, positions and output flags through ctypes views; the
        # rows buffer grows to the longest batch seen (n_batch rows of a large model's width
        # would be tens of MiB)
        self._fast = int(getattr(batch, "n_embd", -1)) == self._n_embd
        n = self.n_batch = int(ctx.n_batch())
        self._tok = (ctypes.c_int32 * n)()
        self._tpos = (ctypes.c_int32 * n)()
        self._out = (ctypes.c_int8 * n)()
        self._flags = {True: [1] * n, False: [0] * n}
        self._rows_buf = np.zeros((0, self._n_embd), dtype=np.float32)
        self._plain = C.llama_batch()  # tokens alone (a target's verify batch)
        self._paired = C.llama_batch()  # tokens with their rows
        i32p = ctypes.POINTER(ctypes.c_int32)
        for st in (self._plain, self._paired):
            st.token = ctypes.cast(self._tok, i32p)
            st.pos = ctypes.cast(self._tpos, i32p)
            st.logits = ctypes.cast(self._out, ctypes.POINTER(ctypes.c_int8))
            st.embd = None
            st.n_seq_id = None  # every entry in sequence 0 (llama.cpp's default)
            st.seq_id = None
        self._decode_fn = C.llama_decode
        # embedding rows alone, as wide as the batch takes them (a DFlash draft's decoder input, an
        # EAGLE3 draft's encoder input): one plain batch of rows, section-major positions (four
        # sections for M-RoPE), converted by llama.cpp's llama_batch_compat at that width
        self._row_widths = (int(getattr(batch, "n_embd", -1)), int(getattr(batch, "n_embd_enc", -1)))
        self._rpos = (ctypes.c_int32 * (4 * n))()
        self._rows_only_buf = np.zeros((0, 0), dtype=np.float32)  # where _rowsonly.embd points
        self._rowsonly = C.llama_batch()
        self._rowsonly.token = None
        self._rowsonly.embd = None
        self._rowsonly.pos = ctypes.cast(self._rpos, i32p)
        self._rowsonly.logits = ctypes.cast(self._out, ctypes.POINTER(ctypes.c_int8))
        self._rowsonly.n_seq_id = None
        self._rowsonly.seq_id = None
        self._encode_fn = C.llama_encode

    def _row_room(self, m: int) -> np.ndarray:
        buf = self._rows_buf
        if buf.shape[0] < m:
            cap = min(max(m, 2 * buf.shape[0], 8), max(self.n_batch, m))
            buf = self._rows_buf = np.zeros((cap, self._n_embd), dtype=np.float32)
            self._paired.embd = ctypes.cast(buf.ctypes.data, _FLOAT_P)
        return buf

    def decode(self, tokens: Sequence[int], pos0: int, outputs: bool | str,
               rows: Sequence[np.ndarray] | np.ndarray | None = None) -> None:
        """Decode ``tokens`` at positions ``pos0..``; ``rows[j]`` (``n_embd`` floats) goes with token ``j``.

        ``outputs``: True (logits for every entry), ``"last"`` (for the last one) or False.
        ``rows`` is a sequence of rows or an ``(n, n_embd)`` array.
        """
        if rows is not None and not self._fast:
            self._decode_entries(tokens, pos0, outputs, rows)
            return
        m = len(tokens)
        if not 0 < m <= self.n_batch:
            raise LlamaError(f"a batch of {m} entries does not fit this context's n_batch={self.n_batch}")
        self._tok[:m] = tokens
        self._tpos[:m] = range(pos0, pos0 + m)
        out = self._out
        if outputs == "last":
            out[:m] = self._flags[False][:m]
            out[m - 1] = 1
        else:
            out[:m] = self._flags[bool(outputs)][:m]
        if rows is None:
            st = self._plain
        else:
            buf = self._row_room(m)
            if len(rows) != m:
                raise LlamaError(f"{len(rows)} hidden rows for {m} tokens")
            if isinstance(rows, np.ndarray):
                buf[:m] = rows
            else:
                for j, r in enumerate(rows):
                    buf[j] = r
            st = self._paired
        st.n_tokens = m
        rc = int(self._decode_fn(self._ctx, st))
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc} on {m} entries at position {pos0}"
                              + (": the context is full" if rc == 1 else ""))

    def _decode_entries(self, tokens: Sequence[int], pos0: int, outputs: bool | str,
                        rows: Sequence[np.ndarray] | np.ndarray | None) -> None:
        """:meth:`decode` through the extended batch, one entry (and its row) at a time."""
        C, b, pos, embd = self.bindings, self._b, self._pos, self._embd
        out_all, out_last = outputs is True, len(tokens) - 1 if outputs == "last" else -1
        add, set_pos = C.llama_batch_ext_add_token, C.llama_batch_ext_set_pos
        set_out, set_row = C.llama_batch_ext_set_output_logits, C.llama_batch_ext_set_embd_token
        C.llama_batch_ext_clear(b)
        for j, t in enumerate(tokens):
            idx = int(add(b, 0, int(t)))
            if idx < 0:
                raise LlamaError(f"llama_batch_ext_add_token returned {idx} for token {t} at entry {j}")
            pos[0] = pos0 + j
            set_pos(b, idx, pos)
            if out_all or j == out_last:
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

    def rows(self, rows: np.ndarray, pos0: int, *, encode: bool, mrope: bool = False) -> None:
        """Submit ``rows`` (float32, ``(n, width)``) as embedding entries at ``pos0..`` in one call: to
        the encoder (every row an output; positions are placeholders a per-token encoder ignores)
        or to the decoder (no outputs: a DFlash draft writes them into its memory). ``mrope``: the
        model takes four positions per embedding, ``(p, p, p, 0)`` for text."""
        m, width = rows.shape
        if 0 < m <= self.n_batch and width == self._row_widths[1 if encode else 0]:
            self._rows_plain(rows, pos0, encode, mrope)
            return
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        C, b, pos = self.bindings, self._b, self._pos
        add, set_pos, set_out = C.llama_batch_ext_add_embd, C.llama_batch_ext_set_pos, C.llama_batch_ext_set_output_embd
        C.llama_batch_ext_clear(b)
        e = C.llama_embd()
        e.n_rows = 1
        e.n_embd = int(rows.shape[1])
        base = rows.ctypes.data
        stride = rows.strides[0]
        for j in range(rows.shape[0]):
            e.data = ctypes.cast(base + j * stride, _FLOAT_P)
            idx = int(add(b, 0, e))
            if idx < 0:
                raise LlamaError(f"llama_batch_ext_add_embd returned {idx} for row {j} ({rows.shape[1]} floats)")
            pos[0] = pos0 + j
            if mrope:
                pos[1] = pos[2] = pos0 + j
                pos[3] = 0
            set_pos(b, idx, pos)
            if encode:
                set_out(b, idx, True)
        kind = C.LLAMA_PROCESS_TYPE_ENCODE if encode else C.LLAMA_PROCESS_TYPE_DECODE
        rc = int(C.llama_process(self._ctx, kind, b))
        if rc != 0:
            what = "encode" if encode else "decode"
            raise DecodeError(f"llama_process({what}) returned {rc} on {rows.shape[0]} rows at position {pos0}")

    def _rows_plain(self, rows: np.ndarray, pos0: int, encode: bool, mrope: bool) -> None:
        """:meth:`rows` in one plain ``llama_batch`` (the rows are as wide as llama.cpp converts them)."""
        m, width = rows.shape
        buf = self._rows_only_buf
        if buf.shape[0] < m or buf.shape[1] != width:  # grows to the longest batch seen, at most n_batch rows
            cap = min(max(m, 2 * buf.shape[0] if buf.shape[1] == width else 0, 16), self.n_batch)
            buf = self._rows_only_buf = np.zeros((cap, width), dtype=np.float32)
            self._rowsonly.embd = ctypes.cast(buf.ctypes.data, _FLOAT_P)
        buf[:m] = rows  # one copy instead of a pointer conversion per call; llama.cpp copies it again
        rp = self._rpos
        rp[:m] = range(pos0, pos0 + m)
        if mrope:  # (p, p, p, 0): sections 1 and 2 repeat the text position, section 3 is 0
            rp[m:2 * m] = rp[2 * m:3 * m] = rp[:m]
            rp[3 * m:4 * m] = self._flags[False][:m]
        self._out[:m] = self._flags[encode][:m]
        st = self._rowsonly
        st.n_tokens = m
        rc = int((self._encode_fn if encode else self._decode_fn)(self._ctx, st))
        if rc != 0:
            what = "llama_encode" if encode else "llama_decode"
            raise DecodeError(f"{what} returned {rc} on {m} rows at position {pos0}")


class RawBatch:
    """One ``llama_batch`` of ``ctx.n_batch()`` entries of sequence ``seq`` (default 0), decoded without checks.

    Callers pass token ids they have checked (prompt tokens), drawn from logits, or range-checked
    (drafts); positions are consecutive from ``pos0``. Longer inputs are split into ``n_batch`` chunks.
    """

    def __init__(self, ctx: Any, seq: int = 0) -> None:

        self.bindings = ctx.bindings
        self.n_batch = ctx.n_batch()
        self._batch = LlamaBatch(self.n_batch, 0, 1)
        self._batch.n_tokens = self.n_batch
        self._batch.seq_ids[:, 0] = int(seq)
        self._struct = self._batch.validated_view(ctx, 0, self.n_batch)  # sequence ids, once
        # ctypes views of the batch's buffers: a slice assignment from a list is one C loop, where
        # numpy's dispatch, run cold after a decode, costs several microseconds a step
        n = self.n_batch
        self._tok = (ctypes.c_int32 * n).from_buffer(self._batch.token_arr)
        self._pos = (ctypes.c_int32 * n).from_buffer(self._batch.pos)
        self._out = (ctypes.c_int8 * n).from_buffer(self._batch.logits)
        self._flags = {"all": [1] * n, "none": [0] * n, "last": [0] * n}
        self._ctx = ctx.ptr

    def close(self) -> None:
        self._struct = None
        self._batch.close()

    def decode(self, tokens: Sequence[int], pos0: int, logits: str = "all",
               after: Callable[[Sequence[int], int], None] | None = None) -> None:
        """``logits``: ``"all"`` (every entry an output), ``"last"`` (the input's last) or ``"none"``.

        ``after(chunk, pos)`` runs after each decoded chunk, while the context still holds that
        chunk's per-token outputs (the target features an EAGLE3 draft reads)."""
        nb, st = self.n_batch, self._struct
        tok, pos, out = self._tok, self._pos, self._out
        flags = self._flags.get(logits)
        if flags is None:
            raise ValueError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
        decode, ctx = self.bindings.llama_decode, self._ctx
        n = len(tokens)
        for s in range(0, n, nb):
            m = min(nb, n - s)
            tok[:m] = tokens[s:s + m] if s or m < n else tokens
            p = pos0 + s
            pos[:m] = range(p, p + m)
            out[:m] = flags[:m]
            if logits == "last" and s + m == n:
                out[m - 1] = 1
            st.n_tokens = m
            rc = int(decode(ctx, st))
            if rc != 0:
                raise DecodeError(f"llama_decode returned {rc} on a batch of {m} tokens at position {pos0 + s}"
                                  + (": the context is full" if rc == 1 else ""))
            if after is not None:
                after(tokens[s:s + m], pos0 + s)


class SeqCheckpoint:
    """A reusable buffer holding one sequence's state (``llama_state_seq_*_ext``), for rollback.

    Saving writes straight into a buffer kept between steps and restoring reads from it: no
    Python ``bytes`` are built (a verify step on a recurrent model takes one per draft).
    """

    def __init__(self, ctx: Any, seq_id: int = 0, flags: int = 0) -> None:
        self.bindings = ctx.bindings
        self._ctx = ctx.ptr
        self._seq = int(seq_id)
        self._flags = int(flags)
        self._buf: Any = None
        self._cap = 0
        self._n = 0

    def save(self) -> None:
        C = self.bindings
        size = int(C.llama_state_seq_get_size_ext(self._ctx, self._seq, self._flags))
        if size > self._cap:
            self._cap = max(size, self._cap * 2)
            self._buf = (ctypes.c_uint8 * self._cap)()
        self._n = int(C.llama_state_seq_get_data_ext(self._ctx, self._buf, size, self._seq, self._flags))
        if self._n <= 0 and size > 0:
            raise LlamaError("llama_state_seq_get_data_ext wrote nothing: cannot take a rollback checkpoint")

    def data(self) -> bytes:
        """The saved state as bytes (for a snapshot that outlives the next save)."""
        return ctypes.string_at(self._buf, self._n) if self._n else b""

    def restore(self) -> None:
        if not int(self.bindings.llama_state_seq_set_data_ext(self._ctx, self._buf, self._n, self._seq, self._flags)):
            raise LlamaError("llama_state_seq_set_data_ext could not restore the rollback checkpoint")


def check_snapshot_ubatch(model: Any, ctx: Any, what: str) -> None:
    """Refuse a hybrid model's context whose ``n_ubatch`` does not exceed ``n_rs_seq + 1``.

    llama.cpp's hybrid memories split batches keeping each sequence's last ``n_rs_seq + 1`` tokens
    in one micro-batch and abort the process (``GGML_ASSERT(n_ubatch > n_keep_tail)``) at the
    first decode when a micro-batch cannot hold them."""
    if not model.is_hybrid():
        return
    n_rs, ub = int(ctx.bindings.llama_n_rs_seq(ctx.ptr)), int(ctx.n_ubatch())
    if n_rs > 0 and ub <= n_rs + 1:
        raise SpeculativeError(
            f"{what}: n_ubatch={ub} must exceed n_rs_seq + 1 = {n_rs + 1} on this hybrid model (llama.cpp "
            f"aborts otherwise): raise n_ubatch to at least {n_rs + 2}, or lower draft_n_max or n_rs_seq")


def greedy_chain(sampler: Any) -> bool:
    """Whether ``sampler`` is a :class:`~llama_cpp._internals.LlamaSampler` chain of llama.cpp's
    greedy sampler alone: its token for a row is the row's first largest logit."""

    if not isinstance(sampler, LlamaSampler):
        return False
    C, ptr = sampler.bindings, sampler.ptr
    return (C.llama_sampler_name(ptr) == b"chain" and int(C.llama_sampler_chain_n(ptr)) == 1
            and C.llama_sampler_name(C.llama_sampler_chain_get(ptr, 0)) == b"greedy")


class GreedyRows:
    """The argmax of a decoded batch's first output rows, from one read of the logits.

    ``llama_sampler_sample`` with a greedy chain fills an ``n_vocab`` candidate array per row and
    scans it; numpy's argmax over the rows in place costs a fraction of that (on a 150k vocabulary,
    about a tenth). :meth:`pick` answers None where the shortcut would not be exact: a context with
    backend samplers (their tokens win), output rows not laid out one after the other, or a NaN
    logit (greedy's comparisons skip NaN, argmax picks it); the caller then samples row by row.
    """

    def __init__(self, ctx: Any, n_vocab: int) -> None:
        self.bindings = ctx.bindings
        self._ctx = ctx.ptr
        self._n_vocab = int(n_vocab)
        self._backend: bool | None = None  # backend samplers on the context: looked up once

    def pick(self, n: int) -> list[int] | None:
        """The greedy token of each of output rows ``0..n-1`` of the last decode, or None."""
        C, ctx, nv = self.bindings, self._ctx, self._n_vocab
        if self._backend is None:
            self._backend = bool(int(C.llama_get_sampled_token_ith(ctx, 0)) != -1
                                 or C.llama_get_sampled_logits_ith(ctx, 0)
                                 or C.llama_get_sampled_probs_ith(ctx, 0))
        if self._backend:
            return None
        first, last = C.llama_get_logits_ith(ctx, 0), C.llama_get_logits_ith(ctx, n - 1)
        if not first or not last:
            return None
        base = ctypes.addressof(first.contents)
        if ctypes.addressof(last.contents) - base != 4 * nv * (n - 1):
            return None
        rows = np.frombuffer((ctypes.c_float * (n * nv)).from_address(base), dtype=np.float32).reshape(n, nv)
        best = rows.argmax(axis=1)
        if any(v != v for v in rows[np.arange(n), best].tolist()):
            return None
        return best.tolist()


def top_k_share(scores: np.ndarray, best: int, k: int) -> float:
    """The probability of ``scores[best]`` under a softmax over the top ``k`` scores (llama.cpp's
    top-k draft sampler: a draft stops where it falls under ``draft_p_min``)."""
    top = np.partition(scores, -k)[-k:] if k < scores.shape[0] else scores
    return 1.0 / float(np.exp(top.astype(np.float64) - float(scores[best])).sum())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    diff = np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64)
    return int(np.argmax(diff))


__all__ = ["GreedyRows", "RawBatch", "RawExtBatch", "SeqCheckpoint", "check_snapshot_ubatch", "common_prefix",
           "greedy_chain"]

"""LlamaBatch / LlamaBatchExt: validation before C, explicit ranges, extended-batch processing."""

from __future__ import annotations

import numpy as np
import pytest

from llama_cpp import ClosedError, ContextOverflowError, Llama, LlamaBatch, LlamaBatchExt, TokenizationError
from llama_cpp._internals import LlamaContext


@pytest.fixture(scope="module")
def llm(spm_model):
    with Llama(spm_model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=4, n_threads=1, n_threads_batch=1,
               verbose=False) as m:
        yield m


def greedy_next(ctx: LlamaContext, idx: int) -> int:
    return int(np.argmax(ctx.logits_ith(idx)))


def test_decode_ranges_equal_one_shot(llm):
    ctx = llm.ctx
    toks = llm.tokenize(b"hello there the cat")
    with LlamaBatch(64, 0, 1) as b:
        b.add_sequence(toks, seq_id=0, start_pos=0, logits=True)
        ctx.memory_clear()
        ctx.decode(b)
        whole = np.array(ctx.logits_ith(len(toks) - 1))
        ctx.memory_clear()
        ctx.decode(b, start=0, count=2)
        ctx.decode(b, start=2)  # the rest, from index 2
        part = np.array(ctx.logits_ith(len(toks) - 3))  # indices count within the last call's range
    np.testing.assert_allclose(whole, part, atol=1e-4)


def test_batch_validation_names_the_entry(llm):
    ctx = llm.ctx
    with LlamaBatch(8, 0, 2) as b:
        b.add(5, 0, 0)
        b.add(llm.n_vocab() + 3, 1, 0)
        with pytest.raises(TokenizationError, match="entry 1"):
            ctx.decode(b)
        b.clear()
        b.add(5, 0, [0, 1])
        b.add(6, 1, 7, logits=True)
        with pytest.raises(ValueError, match="entry 1: sequence id"):
            ctx.decode(b)
        with pytest.raises(IndexError):
            ctx.decode(b, start=1, count=5)
        with pytest.raises(ValueError, match="at least one"):
            b.add(5, 0, [])
        with pytest.raises(ValueError, match="n_seq_max=2"):
            b.add(5, 0, [0, 1, 2])
        b.clear()
        for i in range(8):
            b.add(5, i)
        with pytest.raises(ContextOverflowError, match="capacity of 8"):
            b.add(5, 8)
    with pytest.raises(ClosedError):
        b.add(1, 0)


def test_batch_over_n_batch_is_refused(llm):
    with LlamaBatch(100, 0, 1) as b:
        b.add_sequence(np.full(100, 5), 0, 0)
        with pytest.raises(ContextOverflowError, match="n_batch=64"):
            llm.ctx.decode(b)


def test_add_sequence_checks_dtype_and_shape(llm):
    with LlamaBatch(8, 0, 1) as b:
        with pytest.raises(TypeError, match="integers"):
            b.add_sequence(np.array([1.5, 2.0]))
        with pytest.raises(ValueError, match="one-dimensional"):
            b.add_sequence(np.zeros((2, 2), dtype=np.int32))


def test_embedding_batch_checks_rows(llm):
    n_embd = llm.n_embd()
    with LlamaBatch(4, n_embd, 1) as b:
        with pytest.raises(TypeError, match="float32"):
            b.add_embd(np.zeros(n_embd, dtype=np.float64), 0)
        with pytest.raises(ValueError, match=f"\\({n_embd},\\)"):
            b.add_embd(np.zeros(n_embd + 1, dtype=np.float32), 0)
        with pytest.raises(ValueError, match="NaN"):
            b.add_embd(np.full(n_embd, np.nan, dtype=np.float32), 0)
        b.add_embd(np.zeros(n_embd, dtype=np.float32), 0, logits=True)
        llm.ctx.memory_clear()
        llm.ctx.decode(b)
        assert llm.ctx.logits_ith(0).shape == (llm.n_vocab(),)
    with LlamaBatch(2, n_embd + 1, 1) as wrong:
        wrong.add_embd(np.zeros(n_embd + 1, dtype=np.float32), 0)
        with pytest.raises(ValueError, match="rows are"):
            llm.ctx.decode(wrong)


def test_multiple_sequences_in_one_batch(llm):
    ctx = llm.ctx
    a = llm.tokenize(b"hello there")
    c = llm.tokenize(b"the cat sat")
    ctx.memory_clear()
    with LlamaBatch(64, 0, 1) as b:
        b.add_sequence(a, seq_id=0, start_pos=0)
        b.add_sequence(c, seq_id=1, start_pos=0)
        ctx.decode(b)
        both = [greedy_next(ctx, len(a) - 1), greedy_next(ctx, len(a) + len(c) - 1)]
        for seq, toks in ((0, a), (1, c)):
            ctx.memory_clear()
            b.clear()
            b.add_sequence(toks, seq_id=seq, start_pos=0)
            ctx.decode(b)
            assert greedy_next(ctx, len(toks) - 1) == both[seq]
    assert ctx.seq_pos_max(1) == len(c) - 1
    with pytest.raises(ValueError, match="n_seq_max"):
        ctx.seq_pos_max(9)


def test_batch_ext_tokens_match_llama_batch(llm):
    ctx = llm.ctx
    toks = llm.tokenize(b"hello there the cat")
    ctx.memory_clear()
    with LlamaBatch(64, 0, 1) as b:
        b.add_sequence(toks, 0, 0)
        ctx.decode(b)
        ref = np.array(ctx.logits_ith(len(toks) - 1))
    ctx.memory_clear()
    with LlamaBatchExt(llm) as be:
        idx = be.add_tokens(toks, seq_id=0, start_pos=0)
        assert idx == list(range(len(toks))) and be.output_indices() == [len(toks) - 1]
        be.process()
        np.testing.assert_allclose(ctx.logits_ith(len(toks) - 1), ref, atol=1e-5)


def test_batch_ext_validation(llm):
    with LlamaBatchExt(llm.ctx) as be:
        with pytest.raises(TokenizationError, match="entry 0"):
            be.add_token(-1, 0, 0)
        with pytest.raises(ValueError, match="sequence id 4"):
            be.add_token(5, 4, 0)
        i = be.add_token(5, 0, 0, output=True)
        n = llm.ctx.n_embd_inp()
        with pytest.raises(ValueError, match=f"rows of {n}"):
            be.set_embd_token(i, np.zeros(n + 2, dtype=np.float32))
        with pytest.raises(TypeError, match="float32"):
            be.add_embd(np.zeros(n), 0, 1)
        with pytest.raises(IndexError):
            be.set_pos(3, 1)
        be.set_embd_token(i, np.ones(n, dtype=np.float32))  # a token paired with a hidden-state row
        with pytest.raises(ValueError, match="already set"):
            be.set_embd_token(i, np.ones(n, dtype=np.float32))
        be.clear()
        assert be.n_tokens == 0
        with pytest.raises(ValueError, match="empty"):
            be.process()
        for k in range(llm.ctx.n_batch()):
            be.add_token(5, 0, k)
        with pytest.raises(ContextOverflowError, match="full"):
            be.add_token(5, 0, 99)
    with pytest.raises(ClosedError):
        be.add_token(5, 0, 0)


def test_batch_ext_embedding_rows(llm):
    ctx = llm.ctx
    n = ctx.n_embd_inp()
    rows = np.random.default_rng(0).standard_normal((3, n)).astype(np.float32)
    ctx.memory_clear()
    with LlamaBatch(4, n, 1) as b:
        b.add_embd_rows(rows, 0, 0)
        ctx.decode(b)
        ref = np.array(ctx.logits_ith(2))
    ctx.memory_clear()
    with LlamaBatchExt(ctx) as be:
        for k in range(3):
            be.add_embd(rows[k], 0, k, output=(k == 2))
        be.process()
        np.testing.assert_allclose(ctx.logits_ith(2), ref, atol=1e-5)

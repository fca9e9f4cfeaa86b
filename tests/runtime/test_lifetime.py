"""Ownership: close/with/finalizers free each native object once; bad files never crash the process."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from llama_cpp import ClosedError, ContextError, Llama, LlamaEmbedding, ModelLoadError
from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel, LlamaSampler

REPO = Path(__file__).resolve().parents[2]


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_missing_and_non_gguf_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Llama(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        Llama(tmp_path)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="too short"):
        Llama(short)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        LlamaEmbedding(other)


@pytest.mark.parametrize("cut", [0.5, 0.98])
def test_truncated_gguf_raises_without_crashing(spm_model, tmp_path, cut):
    data = spm_model.read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: int(len(data) * cut)])
    code = textwrap.dedent(f"""
        from llama_cpp import Llama, ModelLoadError
        try:
            Llama({str(bad)!r}, verbose=False)
        except ModelLoadError as exc:
            print("ModelLoadError:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ModelLoadError:" in proc.stdout


def test_corrupt_header_raises(spm_model, tmp_path):
    data = bytearray(spm_model.read_bytes())
    data[8:16] = (2 ** 62).to_bytes(8, "little")  # absurd tensor count
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="could not load"):
        Llama(bad, verbose=False)


def test_vocab_only_model(spm_model):
    with Llama(spm_model, vocab_only=True, verbose=False) as llm:
        toks = llm.tokenize(b"hello world")
        assert llm.detokenize(toks) == b"hello world"
        with pytest.raises(ContextError, match="vocab_only"):
            llm("hello", max_tokens=2)
        with pytest.raises(ContextError, match="vocab_only"):
            llm.create_chat_completion([{"role": "user", "content": "hi"}])
        with pytest.raises(ContextError, match="vocab_only"):
            LlamaContext(llm.model)


def test_use_after_close(spm_model, embedding_model):
    llm = Llama(spm_model, n_threads=1, verbose=False)
    llm.close()
    llm.close()  # idempotent
    for call in (lambda: llm("hi"), lambda: llm.tokenize(b"x"), lambda: llm.n_ctx(), lambda: llm.metadata):
        with pytest.raises(ClosedError):
            call()
    with LlamaEmbedding(embedding_model(pooling="mean"), n_threads=1) as e:
        pass
    with pytest.raises(ClosedError):
        e.embed("x")
    m = LlamaModel(spm_model)
    ctx = LlamaContext(m, n_ctx=64, n_threads=1)
    ctx.close()
    with pytest.raises(ClosedError):
        ctx.n_ctx()
    with pytest.raises(ClosedError):
        ctx.memory_clear()
    s = LlamaSampler()
    s.add_greedy()
    s.close()
    with pytest.raises(ClosedError):
        s.add_greedy()
    m.close()
    with pytest.raises(ClosedError):
        m.tokenize(b"x")


def test_model_outlives_closed_wrapper_while_context_exists(spm_model):
    m = LlamaModel(spm_model)
    ref = m._ref
    ctx = LlamaContext(m, n_ctx=64, n_threads=1)
    m.close()
    assert ref.ptr is not None  # still used by the context
    with LlamaBatch(8, 0, 1) as b:
        b.add_sequence([1, 5, 6], 0, 0)
        ctx.decode(b)
        assert np.isfinite(ctx.logits_ith(2)).all()
    ctx.close()
    assert ref.ptr is None  # freed with its last user


def test_finalizer_frees_without_close(spm_model):
    m = LlamaModel(spm_model)
    ctx = LlamaContext(m, n_ctx=64, n_threads=2, n_threads_batch=2)
    mref, cref = m._ref, ctx._ref
    del m
    gc.collect()
    assert mref.ptr is not None
    del ctx
    gc.collect()
    assert cref.ptr is None and mref.ptr is None


def test_context_create_close_cycles_do_not_grow_memory(spm_model):
    m = LlamaModel(spm_model)
    try:
        for _ in range(20):  # warm up allocator pools
            LlamaContext(m, n_ctx=64, n_batch=32, n_ubatch=32, n_threads=1).close()
        before = rss_kib()
        for i in range(1000):
            ctx = LlamaContext(m, n_ctx=64, n_batch=32, n_ubatch=32, n_threads=2 if i % 10 == 0 else 1)
            ctx.close()
        grown = rss_kib() - before
    finally:
        m.close()
    # one leaked context (KV cache + compute buffers) is far above this; 1000 would be megabytes
    assert grown < 8 * 1024, f"RSS grew by {grown} KiB over 1000 context create/close cycles"


def test_objects_alive_at_interpreter_exit(spm_model, embedding_model):
    """Finalizers run at exit (contexts before models) without crashing or hanging."""
    code = textwrap.dedent(f"""
        from llama_cpp import Llama, LlamaEmbedding, LlamaBatchExt
        llm = Llama({str(spm_model)!r}, n_ctx=64, n_threads=2, verbose=False)
        ext = LlamaBatchExt(llm)
        ext.add_token(5, 0, 0, output=True)
        emb = LlamaEmbedding({str(embedding_model(pooling="mean"))!r}, n_threads=1)
        gen = llm("hello", max_tokens=50, stream=True)
        next(gen)  # a half-consumed generation holds sampler chains
        print("alive")
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "alive"

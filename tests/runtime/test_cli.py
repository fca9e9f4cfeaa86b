"""``python -m llama_cpp info|complete|chat|embed`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from llama_cpp import Llama, LlamaEmbedding

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_cpp", *map(str, args)], check=False, capture_output=True, text=True,
                          input=stdin, timeout=120, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_info(spm_model):
    p = cli("info", spm_model, "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["architecture"] == "llama" and info["n_embd"] == 64 and info["chat_template"] is True
    assert "loading model: 100%" in p.stderr
    p = cli("info", spm_model, "-q")
    assert "n_vocab" in p.stdout and "general.architecture = llama" in p.stdout and p.stderr == ""


def test_complete_matches_api(spm_model):
    p = cli("complete", spm_model, "hello there", "-n", 8, "--temp", 0, "-t", 1, "-q")
    assert p.returncode == 0, p.stderr
    with Llama(spm_model, n_ctx=2048, n_threads=1, verbose=False) as llm:
        expected = llm("hello there", max_tokens=8, temperature=0)["choices"][0]["text"]
    assert p.stdout == expected + "\n"


def test_chat_scripted(spm_model):
    p = cli("chat", spm_model, "-m", "hi", "-m", "again", "-n", 4, "--temp", 0, "-t", 1, "-q")
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 2
    p = cli("chat", spm_model, "-n", 3, "--temp", 0, "-t", 1, "-q", stdin="hello\n\n")
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 1


def test_embed_json_and_npy(embedding_model, tmp_path):
    model = embedding_model(pooling="mean")
    p = cli("embed", model, "hello world", "the cat", "-t", 1, "-q")
    assert p.returncode == 0, p.stderr
    rows = np.array(json.loads(p.stdout), dtype=np.float32)
    with LlamaEmbedding(model, n_threads=1) as e:
        np.testing.assert_allclose(rows, e.embed(["hello world", "the cat"]), atol=1e-6)
    out = tmp_path / "e.npy"
    p = cli("embed", model, "-", "--npy", out, "-t", 1, "-q", stdin="hello world\nthe cat\n")
    assert p.returncode == 0, p.stderr
    np.testing.assert_allclose(np.load(out), rows, atol=1e-6)


def test_errors_are_reported_not_raised(tmp_path):
    p = cli("info", tmp_path / "missing.gguf")
    assert p.returncode == 2 and "not found" in p.stderr and "Traceback" not in p.stderr

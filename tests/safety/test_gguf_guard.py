"""Hostile GGUF headers are refused with ModelLoadError before llama.cpp can assert on them."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llama_cpp._errors import ModelLoadError
from llama_cpp._safety.gguf_guard import guard_model_file, read_header

from ._hostile_gguf import write_gguf


@pytest.mark.parametrize(("overrides", "key"), [
    ({"llama.block_count": 0}, "llama.block_count"),
    ({"llama.block_count": 100000}, "llama.block_count"),
    ({"llama.attention.head_count_kv": 0}, "llama.attention.head_count_kv"),
    ({"llama.attention.head_count": 3}, "llama.attention.head_count"),
    ({"llama.attention.layer_norm_rms_epsilon": math.nan}, "layer_norm_rms_epsilon"),
    ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "layer_norm_rms_epsilon"),
    ({"llama.expert_count": 4, "llama.expert_used_count": 8}, "llama.expert_used_count"),
])
def test_asserting_hyperparameters_are_refused(tmp_path: Path, overrides, key) -> None:
    path = write_gguf(tmp_path / "bad.gguf", overrides)
    with pytest.raises(ModelLoadError, match=key):
        guard_model_file(path)


def test_ssm_conv_must_be_f32(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "ssm.gguf", tensors={"blk.0.ssm_conv1d.weight": np.zeros((4, 4), np.float16)})
    with pytest.raises(ModelLoadError, match="ssm_conv"):
        guard_model_file(path)


def test_zero_heads_with_attention_tensors(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "heads.gguf", {"llama.attention.head_count": 0},
                      tensors={"blk.0.attn_q.weight": np.zeros((16, 16), np.float32)})
    with pytest.raises(ModelLoadError, match="head_count"):
        guard_model_file(path)


def test_absurd_counts_are_refused_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**60) + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="metadata key count"):
        read_header(path)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40) + b"k" * 16)
    with pytest.raises(ModelLoadError, match="length of a metadata key"):
        read_header(path)


def test_valid_header_passes(tmp_path: Path) -> None:
    header = read_header(write_gguf(tmp_path / "ok.gguf", tensors={"x.weight": np.zeros((2, 3), np.float32)}))
    assert header.metadata["llama.block_count"] == 1
    assert header.tensors[0].shape == (3, 2)


_LOAD = """
import sys
from llama_cpp import Llama
from llama_cpp._errors import ModelLoadError
try:
    Llama(model_path=sys.argv[1], verbose=False)
except ModelLoadError as exc:
    print("REFUSED", exc)
"""


@pytest.mark.parametrize("overrides", [{"llama.block_count": 0}, {}])
def test_load_refuses_and_interpreter_survives(tmp_path: Path, overrides) -> None:
    """block_count 0 is the guard's; a header with no tensors is llama.cpp's refusal, with its reason."""
    path = write_gguf(tmp_path / "m.gguf", overrides)
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REFUSED" in proc.stdout
    if not overrides:
        assert "no reason logged" not in proc.stdout

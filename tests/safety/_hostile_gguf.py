"""Small hostile GGUF files: a llama-arch header with chosen hyperparameters and optional tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

LLAMA_HPARAMS: dict[str, Any] = {
    "llama.context_length": 64, "llama.embedding_length": 16, "llama.block_count": 1,
    "llama.feed_forward_length": 32, "llama.attention.head_count": 2, "llama.attention.head_count_kv": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
}


def write_gguf(path: Path, overrides: dict[str, Any] | None = None,
               tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``path`` with LLAMA_HPARAMS updated by ``overrides`` (ints u32, floats f32)."""
    w = GGUFWriter(str(path), "llama")
    for key, value in {**LLAMA_HPARAMS, **(overrides or {})}.items():
        if isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    for name, data in (tensors or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

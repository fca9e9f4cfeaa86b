"""The model files of issue 29 (round two): each legal-looking, each one that aborts, crashes or
hangs llama.cpp (or is refused by the header checks first). ``hostile_model(tmp, case)`` writes
one from the ``llama_spm`` or ``qwen35_mtp`` fixture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from build_tools.fixtures.cache import fixture_path

from ._rewrite_gguf import rewrite_gguf

WEIGHT = "blk.0.ffn_down.weight"  # (64, 128) in NumPy order in both fixtures' llama body


def _spm() -> Path:
    return fixture_path("llama_spm")


def _qwen() -> Path:
    return fixture_path("qwen35_mtp")


def _weight_as(dtype: Any) -> dict[str, Any]:
    return {WEIGHT: np.ones((64, 128), dtype=dtype)}


def _q8_1() -> dict[str, Any]:
    return {WEIGHT: (np.zeros((64, 128 // 32 * 40), dtype=np.uint8), GGMLQuantizationType.Q8_1)}


def _set_token(i: int, value: Any) -> Callable[[list[Any]], list[Any]]:
    def f(tokens: list[Any]) -> list[Any]:
        tokens[i] = tokens[i + 1] if value is None else value
        return tokens
    return f


#: case -> (base fixture, rewrite keyword arguments); the rwkv case hangs rather than dies
CASES: dict[str, tuple[Callable[[], Path], dict[str, Any]]] = {
    "weight_i8": (_spm, {"tensors": _weight_as(np.int8)}),
    "weight_i16": (_spm, {"tensors": _weight_as(np.int16)}),
    "weight_i32": (_spm, {"tensors": _weight_as(np.int32)}),
    "weight_q8_1": (_spm, {"tensors": _q8_1()}),
    "alignment_16": (_spm, {"alignment": 16}),
    "alignment_8": (_spm, {"alignment": 8}),
    "token_duplicate": (_spm, {"tokens": _set_token(300, None)}),
    # 15 is the byte token <0x0A>: llama.cpp looks the byte tokens up by text (std::out_of_range)
    "token_empty": (_spm, {"tokens": _set_token(15, "")}),
    "token_invalid_utf8": (_spm, {"tokens": _set_token(15, b"\xff\xfe\x80")}),
    "tokenizer_none": (_spm, {"kv": {"tokenizer.ggml.model": "none"}}),
    "tokenizer_no_vocab": (_spm, {"kv": {"tokenizer.ggml.model": "no_vocab"}}),
    "tokenizer_bert": (_spm, {"kv": {"tokenizer.ggml.model": "bert"}}),
    "tokenizer_rwkv": (_spm, {"kv": {"tokenizer.ggml.model": "rwkv"}}),
    "qwen35_rope_odd": (_qwen, {"kv": {"qwen35.rope.dimension_count": 15}}),
    "qwen35_rope_huge": (_qwen, {"kv": {"qwen35.rope.dimension_count": 4096}}),
    "qwen35_rope_zero": (_qwen, {"kv": {"qwen35.rope.dimension_count": 0}}),
    "qwen35_rope_sections": (_qwen, {"kv": {"qwen35.rope.dimension_sections": [64, 64, 64, 64]}}),
    "qwen35_ssm_inner_0": (_qwen, {"kv": {"qwen35.ssm.inner_size": 0}}),
    "qwen35_ssm_inner_7": (_qwen, {"kv": {"qwen35.ssm.inner_size": 7}}),
    "qwen35_full_attention_interval_0": (_qwen, {"kv": {"qwen35.full_attention_interval": 0}}),
}


def hostile_model(directory: Path, case: str) -> Path:
    """Write the file of ``case`` (a key of :data:`CASES`) into ``directory``."""
    base, kwargs = CASES[case]
    return rewrite_gguf(base(), directory / f"{case}.gguf", **kwargs)

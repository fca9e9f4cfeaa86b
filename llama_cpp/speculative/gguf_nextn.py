"""Does a model file have NextN (MTP) layers (read from its GGUF header, without loading it), and
how the pinned llama.cpp's MTP graphs of each architecture treat several heads and hidden rows."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._core.gguf import open_header
from .._errors import ModelLoadError

#: Architectures whose MTP graph runs any of several NextN blocks (``il = n_layer +
#: nextn_layer_offset``) without asserting a single one; every other MTP graph of the pinned
#: llama.cpp aborts the process when a model declares more than one.
CHAINED_NEXTN_ARCHS = frozenset(("step35", "hy-v3", "mimo2"))
#: MTP graphs (the pinned llama.cpp's ``src/models``) whose NextN hidden state covers every entry of
#: a batch (taken before the output rows are selected). llama.cpp's masked mode copies the first
#: ``n_outputs`` rows of it, which are the output's only when the output comes first: their draft
#: contexts return every entry's row (unmasked) and are read by batch index.
NEXTN_H_ALL_ROWS_ARCHS = frozenset(("qwen35", "qwen35moe", "hy-v3"))
#: MTP graphs whose NextN hidden state holds the output rows only (masked mode returns the output's).
NEXTN_H_OUTPUT_ROWS_ARCHS = frozenset(("step35", "mimo2"))


def gguf_nextn_layers(path: str | os.PathLike[str], kv_overrides: Mapping[str, Any] | None = None) -> int | None:
    """``<arch>.nextn_predict_layers`` from a GGUF file's header (0 when absent, None if unreadable),
    or from ``kv_overrides`` (those the model will be loaded with) where they set it.

    Reads only the key/value section (:func:`llama_cpp._core.gguf.open_header`), so asking for MTP
    on a model without NextN layers fails before llama.cpp loads any weights.
    """
    arch: str | None = None
    values: dict[str, int] = {}
    try:
        with open_header(path) as (r, _n_tensors, n_kv):
            for _ in range(n_kv):
                key = r.string("a metadata key")
                val = r.value(r.take("<I"), key)
                if key == "general.architecture":
                    arch = val
                elif key.endswith(".nextn_predict_layers") and isinstance(val, int):
                    values[key] = int(val)
    except (OSError, ValueError, ModelLoadError):
        return None
    if arch is None:
        return None
    key = f"{arch}.nextn_predict_layers"
    override = (kv_overrides or {}).get(key)
    if isinstance(override, int) and not isinstance(override, bool):
        return override
    return values.get(key, 0)


__all__ = ["CHAINED_NEXTN_ARCHS", "NEXTN_H_ALL_ROWS_ARCHS", "NEXTN_H_OUTPUT_ROWS_ARCHS", "gguf_nextn_layers"]

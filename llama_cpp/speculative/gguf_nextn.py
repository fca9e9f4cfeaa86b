"""Does a model file have NextN (MTP) layers? Read from its GGUF header, without loading it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._core.gguf import open_header
from .._errors import ModelLoadError


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


__all__ = ["gguf_nextn_layers"]

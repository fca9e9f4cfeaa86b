"""Copy a GGUF file with changed metadata, token texts, tensor types or alignment (hostile variants
of the fixtures, for the round-two reliability tests and the fuzzer)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

DROP = object()  #: a value in ``kv`` that removes the key


def _vtype(value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    if isinstance(value, bool):
        return GGUFValueType.BOOL, None
    if isinstance(value, int):
        return (GGUFValueType.UINT32 if 0 <= value < 2**32 else GGUFValueType.INT64), None
    if isinstance(value, float):
        return GGUFValueType.FLOAT32, None
    if isinstance(value, str | bytes):
        return GGUFValueType.STRING, None
    if isinstance(value, list):
        return GGUFValueType.ARRAY, _vtype(value[0])[0] if value else GGUFValueType.UINT32
    raise TypeError(f"unsupported metadata value {value!r}")


def rewrite_gguf(src: Path, dst: Path, *, kv: Mapping[str, Any] | None = None, alignment: int | None = None,
                 tokens: Callable[[list[Any]], list[Any]] | None = None,
                 tensors: Mapping[str, np.ndarray | tuple[np.ndarray, Any]] | None = None) -> Path:
    """Write ``dst`` as ``src`` with ``kv`` set (``DROP`` removes), ``tokens`` applied to
    ``tokenizer.ggml.tokens`` (a list of str; bytes entries are written raw), ``tensors``
    replacing tensor data (its dtype picks the ggml type, or ``(bytes array, GGMLQuantizationType)``) and the data aligned to ``alignment``."""
    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch)
    kv = dict(kv or {})
    if alignment is not None:
        w.data_alignment = alignment
        kv["general.alignment"] = alignment
    for field in r.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF.") or field.name in kv:
            continue
        val_type = field.types[0]
        sub = field.types[-1] if val_type == GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "tokenizer.ggml.tokens" and tokens is not None:
            value = tokens(list(value))
        w.add_key_value(field.name, value, val_type, sub_type=sub)
    for key, value in kv.items():
        if value is not DROP:
            vt, sub = _vtype(value)
            w.add_key_value(key, value, vt, sub_type=sub)
    datas = []
    for t in r.tensors:
        data = (tensors or {}).get(t.name)
        if data is None:
            w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
            datas.append(t.data)
        else:
            data, raw = data if isinstance(data, tuple) else (data, None)
            w.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, raw)
            datas.append(data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for data in datas:
        w.write_tensor_data(np.ascontiguousarray(data))
    w.close()
    return dst

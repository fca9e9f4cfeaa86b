"""The one GGUF header reader: a bounded cursor (:class:`Reader`) over a mapped file, the opening of
a header (:func:`open_header`: magic, version, counts) and the cheap pre-load file check
(:func:`check_gguf_file`). The hyperparameter guard (:mod:`llama_cpp._safety.gguf_guard`), the
speculative checks (``gguf_nextn_layers``) and the model loader all read headers through it.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._errors import ModelLoadError, ModelNotFoundError

MAGIC = b"GGUF"
# magic (4) + version (u32) + n_tensors (u64) + n_kv (u64)
MIN_HEADER = 24

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024
GGML_MAX_DIMS = 4
GGML_TYPE_COUNT = 43
GGML_TYPE_F32 = 0
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_STRING = 1 << 26

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class Reader:
    """A bounded cursor over a GGUF file's bytes: every count and length is checked against the
    bytes left before anything is read, and a malformed header raises :class:`ModelLoadError`."""

    def __init__(self, buf: mmap.mmap | bytes, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"could not load {self.path}: malformed GGUF header: {what}")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise self.fail(f"truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def count(self, what: str, limit: int, unit: int) -> int:
        n = self.take("<Q")
        left = len(self.buf) - self.pos
        if n > limit or n * unit > left:
            raise self.fail(f"{what} is {n}; accepted at most {min(limit, left // max(unit, 1))}")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"length of {what}", MAX_STRING, 1)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, vtype: int, key: str) -> Any:
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == STRING:
            return self.string(f"value of {key}")
        if vtype == ARRAY:
            etype = self.take("<I")
            if etype in SCALARS:
                width = struct.calcsize(SCALARS[etype])
                n = self.count(f"array length of {key}", 1 << 40, width)
                # short numeric arrays are per-layer hyperparameters; longer ones are not checked here
                values = list(struct.unpack_from(f"<{n}{SCALARS[etype][1]}", self.buf, self.pos)) if (
                    n <= LLAMA_MAX_LAYERS) else None
                self.pos += n * width
                return values
            if etype == STRING:
                n = self.count(f"array length of {key}", 1 << 40, 8)
                for _ in range(n):
                    self.string(f"element of {key}")
                return None
            raise self.fail(f"array {key} has element type {etype}; nested arrays are not accepted")
        raise self.fail(f"key {key} has value type {vtype}; accepted 0..12")


@contextmanager
def open_header(path: str | os.PathLike[str]) -> Iterator[tuple[Reader, int, int]]:
    """Map ``path`` and check its magic and version (2..3); yields ``(reader, n_tensors, n_kv)``
    with the reader at the first metadata key. A malformed header raises ModelLoadError."""
    name = os.fspath(path)
    with open(name, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = Reader(buf, name)
        if r.take("<4s") != MAGIC:
            raise r.fail("magic is not b'GGUF'")
        version = r.take("<I")
        if version not in (2, 3):
            raise r.fail(f"version {version}; accepted 2..3")
        n_tensors = r.count("tensor count", MAX_TENSORS, 24)
        n_kv = r.count("metadata key count", MAX_KV, 12)
        yield r, n_tensors, n_kv


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Reject a missing, non-regular, short or non-GGUF file before llama.cpp opens it."""
    p = Path(path)
    if not p.exists():
        # a FileNotFoundError, and the ValueError llama-cpp-python raises here
        raise ModelNotFoundError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelLoadError(f"model path is not a regular file: {p}")
    size = p.stat().st_size
    if size < MIN_HEADER:
        raise ModelLoadError(f"{p} is {size} bytes, too short to be a GGUF model (truncated download?)")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != MAGIC:
        raise ModelLoadError(f"{p} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    return p

"""Read a prompt-cache entry (a NumPy ``.npz``) without blocking, decompressing or over-allocating.

:func:`read_npz` opens the path with ``O_NONBLOCK | O_NOFOLLOW`` and reads it only if it is a
regular file (a FIFO, device or symlink named like an entry blocked the next completion
forever), at most ``max_bytes`` long; every member must be stored uncompressed (what
``np.savez`` writes: a zip bomb is refused instead of being inflated on every lookup), and
each array's header must describe exactly the bytes that follow it (no allocation from a lie).
"""

from __future__ import annotations

import io
import os
import stat
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

#: an entry larger than this is refused whatever the cache's capacity (64 GiB)
MAX_ENTRY_BYTES = 64 << 30


class EntryError(ValueError):
    """The file is not a well-formed entry (the message says why)."""


def open_regular(path: str | os.PathLike[str], max_bytes: int = MAX_ENTRY_BYTES) -> BinaryIO:
    """``path`` opened for reading if it is a regular file of at most ``max_bytes`` (never blocks)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise EntryError(f"cannot open: {exc.strerror or exc}") from exc
    st = os.fstat(fd)  # before fdopen, which raises IsADirectoryError for a folder
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        raise EntryError("not a regular file" if not stat.S_ISREG(st.st_mode)
                         else f"{st.st_size} bytes, over the limit of {max_bytes}")
    return os.fdopen(fd, "rb")


def read_regular_file(path: str | os.PathLike[str], max_bytes: int = MAX_ENTRY_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes``; EntryError otherwise
    (a FIFO or device is never read: it could block forever)."""
    with open_regular(path, max_bytes) as f:
        return f.read()


def _array(raw: bytes, name: str) -> np.ndarray:
    f = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(f)
    except (ValueError, SyntaxError, TypeError) as exc:
        raise EntryError(f"member {name}: bad array header ({exc})") from exc
    if dtype.hasobject:
        raise EntryError(f"member {name}: object arrays are not accepted")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * dtype.itemsize != len(raw) - f.tell():
        raise EntryError(f"member {name}: its header describes {count * dtype.itemsize} bytes, "
                         f"{len(raw) - f.tell()} follow")
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=f.tell())
    return data.reshape(shape, order="F" if fortran else "C")


def read_npz(path: str | os.PathLike[str], max_bytes: int = MAX_ENTRY_BYTES,
             only: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed ``.npz`` at ``path`` (``only``: just these members)."""
    try:
        with open_regular(path, max_bytes) as f, zipfile.ZipFile(f) as z:
            out: dict[str, np.ndarray] = {}
            for info in z.infolist():
                if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                    raise EntryError(f"member {info.filename} is compressed; entries are stored uncompressed")
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                if only is None or name in only:
                    out[name] = _array(z.read(info), name)
            return out
    except EntryError:
        raise
    # zipfile answers a corrupt archive with any of these (a compression "version 14.3", an
    # "encrypted" flag, a bad header struct, a filename that is not UTF-8...)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError, RuntimeError,
            ValueError, struct.error, OverflowError, KeyError) as exc:
        raise EntryError(f"not a readable archive ({type(exc).__name__}: {exc})") from exc


def entry_path_ok(path: Path) -> bool:
    """Whether ``path`` is a regular file (not followed if a symlink): what lookups consider."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False

"""The device code in a CUDA module, per target: what each GPU architecture adds to a plugin's size.

nvcc puts every translation unit's device code into the ELF section ``.nv_fatbin``: fat binaries
(magic ``0xBA55ED50``), each a list of images, one per ``--generate-code`` target: SASS (an ELF
cubin) for a real architecture (``sm_90``), PTX for a virtual one (``compute_100``), compressed as
nvcc's ``-compress-mode`` chose. The image header's fields this reads (little-endian):

    0  u16 kind (1 PTX, 2 ELF)      4  u32 header size     8  u64 padded payload size
    28 u32 architecture (90, 120)   56 u64 uncompressed payload size (0 when not compressed)

The rest of the module (host code, tables) does not grow with the architecture list.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SECTION = ".nv_fatbin"
_MAGIC = 0xBA55ED50
_KINDS = {1: "compute", 2: "sm"}


@dataclass(frozen=True)
class DeviceImage:
    target: str  # "sm_90" (SASS) or "compute_100" (PTX)
    stored: int  # bytes in the module, header and padding included
    uncompressed: int  # the payload's size before nvcc compressed it (its stored size if it did not)


def elf_section(data: bytes, name: str) -> bytes:
    """The contents of section ``name`` of a 64-bit little-endian ELF image (b"" if it has none)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    for name_off, _type, _flags, _addr, offset, size in headers:
        start = strtab + name_off
        if data[start:data.index(b"\0", start)].decode() == name:
            return data[offset:offset + size]
    return b""


def images(section: bytes) -> Iterator[DeviceImage]:
    """The images of the fat binaries in a ``.nv_fatbin`` section, in order."""
    off = 0
    while off + 16 <= len(section):
        magic, _version, header, fat_size = struct.unpack_from("<IHHQ", section, off)
        if magic != _MAGIC:
            off += 8  # the linker aligns each translation unit's fat binary to 8 bytes
            continue
        p, end = off + header, off + header + fat_size
        while p < end:
            kind, _v, ih, padded = struct.unpack_from("<HHIQ", section, p)
            arch, = struct.unpack_from("<I", section, p + 28)
            unc = struct.unpack_from("<Q", section, p + 56)[0] if ih >= 64 else 0
            yield DeviceImage(f"{_KINDS.get(kind, f'kind{kind}')}_{arch}", ih + padded, unc or padded)
            p += ih + padded
        off = end


def device_code(module: bytes | Path) -> dict[str, int]:
    """Stored bytes of device code per target in a CUDA module (ELF), by target (``sm_90``, ``compute_100``)."""
    data = module.read_bytes() if isinstance(module, Path) else module
    return by_target(images(elf_section(data, SECTION)))


def describe(code: dict[str, int]) -> str:
    """``sm_90 28.1 MB, compute_100 3.0 MB``."""
    return ", ".join(f"{t} {n / 1e6:.1f} MB" for t, n in code.items())


def by_target(found: Iterable[DeviceImage]) -> dict[str, int]:
    out: dict[str, int] = {}
    for im in found:
        out[im.target] = out.get(im.target, 0) + im.stored
    return dict(sorted(out.items(), key=lambda kv: (kv[0].startswith("compute"), int(kv[0].split("_")[1]))))

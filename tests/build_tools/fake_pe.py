"""Minimal PE32+ images with import and delay-import tables, for the Windows checks' unit tests."""

from __future__ import annotations

import struct
from collections.abc import Sequence

AMD64, ARM64 = 0x8664, 0xAA64
_FILE_ALIGN, _SECTION_RVA = 0x200, 0x1000


def make_pe(imports: Sequence[str] = (), delay: Sequence[str] = (), *, machine: int = AMD64,
            dll: bool = True, payload: bytes = b"") -> bytes:
    """A PE32+ file with one section holding the import descriptors, their names and ``payload``."""
    n_desc = len(imports) + 1
    n_delay = len(delay) + 1 if delay else 0
    names_at = 20 * n_desc + 32 * n_delay
    blob = bytearray(names_at)
    name_rvas = []
    for name in [*imports, *delay]:
        name_rvas.append(_SECTION_RVA + len(blob))
        blob += name.encode("ascii") + b"\0"
    for i, rva in enumerate(name_rvas[:len(imports)]):
        struct.pack_into("<I", blob, 20 * i + 12, rva)
    for i, rva in enumerate(name_rvas[len(imports):]):
        struct.pack_into("<I", blob, 20 * n_desc + 32 * i + 4, rva)
    blob += payload
    blob += b"\0" * (-len(blob) % _FILE_ALIGN)

    opt = bytearray(240)
    struct.pack_into("<H", opt, 0, 0x20B)
    struct.pack_into("<I", opt, 108, 16)
    struct.pack_into("<II", opt, 112 + 8 * 1, _SECTION_RVA, 20 * n_desc)
    if delay:
        struct.pack_into("<II", opt, 112 + 8 * 13, _SECTION_RVA + 20 * n_desc, 32 * n_delay)
    characteristics = 0x22 | (0x2000 if dll else 0)
    coff = struct.pack("<4sHHIIIHH", b"PE\0\0", machine, 1, 0, 0, 0, len(opt), characteristics)
    section = struct.pack("<8sIIIIIIHHI", b".idata\0\0", len(blob), _SECTION_RVA, len(blob), _FILE_ALIGN,
                          0, 0, 0, 0, 0xC0000040)
    header = bytearray(b"MZ" + b"\0" * 0x3E)
    struct.pack_into("<I", header, 0x3C, 0x40)
    header += coff + opt + section
    header += b"\0" * (_FILE_ALIGN - len(header))
    return bytes(header + blob)

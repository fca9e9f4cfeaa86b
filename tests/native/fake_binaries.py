"""Minimal PE and Mach-O files with chosen dependency lists (headers only, no code), for the loader tests."""

from __future__ import annotations

import struct
from collections.abc import Sequence


def pe_dll(imports: Sequence[str], delay: Sequence[str] = ()) -> bytes:
    """A PE32+ image whose import table names ``imports`` and delay-load table names ``delay``."""
    sect_rva, sect_raw = 0x1000, 0x200
    imp = bytearray()
    names = bytearray()
    n_imp = len(imports) + 1
    n_delay = len(delay) + 1 if delay else 0
    names_rva = sect_rva + 20 * n_imp + 32 * n_delay
    offsets = []
    for name in [*imports, *delay]:
        offsets.append(names_rva + len(names))
        names += name.encode() + b"\0"
    for k in range(len(imports)):
        imp += struct.pack("<IIIII", 0, 0, 0, offsets[k], 0)
    imp += b"\0" * 20
    dly = bytearray()
    for k in range(len(delay)):
        dly += struct.pack("<IIIIIIII", 1, offsets[len(imports) + k], 0, 0, 0, 0, 0, 0)
    if delay:
        dly += b"\0" * 32
    body = bytes(imp + dly + names)
    opt = bytearray(240)
    struct.pack_into("<H", opt, 0, 0x20B)
    struct.pack_into("<I", opt, 108, 16)
    struct.pack_into("<II", opt, 112 + 8 * 1, sect_rva, 20 * n_imp)
    if delay:
        struct.pack_into("<II", opt, 112 + 8 * 13, sect_rva + 20 * n_imp, 32 * n_delay)
    section = struct.pack("<8sIIIIIIHHI", b".idata", len(body), sect_rva, len(body), sect_raw, 0, 0, 0, 0, 0)
    head = bytearray(b"MZ" + b"\0" * 58 + struct.pack("<I", 0x40))
    head += b"PE\0\0" + struct.pack("<HHIIIHH", 0x8664, 1, 0, 0, 0, len(opt), 0x2022) + opt + section
    return bytes(head.ljust(sect_raw, b"\0")) + body


_LC = {"load": 0xC, "id": 0xD, "weak": 0x80000018, "reexport": 0x8000001F, "rpath": 0x8000001C}


def macho_dylib(needed: Sequence[str], *, weak: Sequence[str] = (), install_name: str | None = None,
                rpaths: Sequence[str] = (), cpu: int = 0x0100000C) -> bytes:
    """A 64-bit little-endian Mach-O dylib header with these load commands."""
    cmds = bytearray()
    n = 0

    def pad(b: bytes) -> bytes:
        return b + b"\0" * (8 - len(b) % 8)

    for kind, items in (("id", [install_name] if install_name else []), ("load", needed), ("weak", weak)):
        for name in items:
            raw = pad(name.encode())
            cmds += struct.pack("<IIIIII", _LC[kind], 24 + len(raw), 24, 2, 0x10000, 0x10000) + raw
            n += 1
    for path in rpaths:
        raw = pad(path.encode())
        cmds += struct.pack("<III", _LC["rpath"], 12 + len(raw), 12) + raw
        n += 1
    return struct.pack("<IiiIIIII", 0xFEEDFACF, cpu, 0, 6, n, len(cmds), 0, 0) + bytes(cmds)


def macho_fat(slices: Sequence[tuple[int, bytes]]) -> bytes:
    """A fat (universal) file of ``(cputype, thin image)`` slices, 4 KiB aligned."""
    head = struct.pack(">II", 0xCAFEBABE, len(slices))
    at = 0x1000
    table = b""
    body = b""
    for cpu, image in slices:
        table += struct.pack(">iiIII", cpu, 0, at + len(body), len(image), 12)
        body += image + b"\0" * (-len(image) % 0x1000)
    return (head + table).ljust(at, b"\0") + body

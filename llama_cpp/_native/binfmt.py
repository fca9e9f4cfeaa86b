"""The libraries a PE (Windows DLL) or Mach-O (macOS dylib) file depends on, read from its headers.

Windows' loader says only "Could not find module 'ggml-cuda.dll' (or one of its dependencies)";
reading the import table tells which dependency is missing. Nothing here loads the file, and a
malformed or truncated file raises :class:`ValueError` rather than reading out of bounds.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

_MAX_NAMES = 4096  # a real import table has tens of entries; refuse runaway tables


@dataclass(frozen=True)
class Dependencies:
    """What a library file names: its own install name (Mach-O) and the libraries it needs."""

    format: str  # "pe" or "macho"
    needed: tuple[str, ...]
    weak: tuple[str, ...] = ()  # delay-loaded DLLs / weak dylibs: missing ones fail late, not at load
    install_name: str | None = None  # Mach-O LC_ID_DYLIB (the SONAME equivalent)
    rpaths: tuple[str, ...] = ()  # Mach-O LC_RPATH


def read_dependencies(path: str | os.PathLike[str]) -> Dependencies:
    """The dependencies of the PE or Mach-O file at ``path`` (ValueError for anything else)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"MZ":
        return pe_dependencies(data)
    magic = data[:4]
    if magic in (_FAT_MAGIC, _FAT_MAGIC_64) or struct.unpack("<I", magic.ljust(4, b"\0"))[0] in _MACHO_MAGICS:
        return macho_dependencies(data)
    raise ValueError(f"{os.fspath(path)} is neither a PE nor a Mach-O file")


# --------------------------------------------------------------------------------------------
# PE
# --------------------------------------------------------------------------------------------

def _unpack(fmt: str, data: bytes, off: int) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if off < 0 or off + size > len(data):
        raise ValueError(f"truncated file: {size} bytes at offset {off} are past its end ({len(data)})")
    return struct.unpack_from(fmt, data, off)


def _cstring(data: bytes, off: int, limit: int = 512) -> str:
    if off < 0 or off >= len(data):
        raise ValueError(f"a name offset {off} is past the end of the file")
    end = data.find(b"\0", off, off + limit)
    if end < 0:
        raise ValueError(f"an unterminated name at offset {off}")
    return data[off:end].decode("ascii", "replace")


def pe_dependencies(data: bytes) -> Dependencies:
    """Imported and delay-loaded DLL names of a PE image (in table order)."""
    (e_lfanew,) = _unpack("<I", data, 0x3C)
    if _unpack("<4s", data, e_lfanew)[0] != b"PE\0\0":
        raise ValueError("not a PE file (no PE signature)")
    coff = e_lfanew + 4
    _machine, n_sections, _t, _s, _n, opt_size, _c = _unpack("<HHIIIHH", data, coff)
    opt = coff + 20
    (magic,) = _unpack("<H", data, opt)
    if magic == 0x10B:
        dirs_at, n_dirs_at = opt + 96, opt + 92
    elif magic == 0x20B:
        dirs_at, n_dirs_at = opt + 112, opt + 108
    else:
        raise ValueError(f"unknown PE optional header magic {magic:#x}")
    (n_dirs,) = _unpack("<I", data, n_dirs_at)
    sections = []
    for k in range(n_sections):
        s = opt + opt_size + 40 * k
        vsize, vaddr, raw_size, raw_ptr = _unpack("<IIII", data, s + 8)
        sections.append((vaddr, max(vsize, raw_size), raw_ptr))

    def offset(rva: int) -> int:
        for vaddr, size, raw in sections:
            if vaddr <= rva < vaddr + size:
                return raw + rva - vaddr
        raise ValueError(f"RVA {rva:#x} is in no section")

    def directory(index: int) -> tuple[int, int]:
        if index >= n_dirs:
            return 0, 0
        return _unpack("<II", data, dirs_at + 8 * index)  # type: ignore[return-value]

    def names(index: int, entry_size: int, name_field: int) -> tuple[str, ...]:
        rva, size = directory(index)
        if not rva or not size:
            return ()
        out = []
        at = offset(rva)
        for _ in range(_MAX_NAMES):
            entry = data[at:at + entry_size]
            if len(entry) < entry_size:
                raise ValueError("truncated import table")
            if entry == b"\0" * entry_size:
                return tuple(out)
            (name_rva,) = struct.unpack_from("<I", entry, name_field)
            out.append(_cstring(data, offset(name_rva)))
            at += entry_size
        raise ValueError("an import table with no end")

    return Dependencies("pe", names(1, 20, 12), weak=names(13, 32, 4))


# --------------------------------------------------------------------------------------------
# Mach-O
# --------------------------------------------------------------------------------------------

_FAT_MAGIC, _FAT_MAGIC_64 = b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf"
_MACHO_MAGICS = (0xFEEDFACE, 0xFEEDFACF)
_LC_REQ_DYLD = 0x80000000
_LC_LOAD_DYLIB, _LC_ID_DYLIB, _LC_LOAD_WEAK_DYLIB = 0xC, 0xD, 0x18 | _LC_REQ_DYLD
_LC_REEXPORT_DYLIB, _LC_RPATH = 0x1F | _LC_REQ_DYLD, 0x1C | _LC_REQ_DYLD
_CPU_ARM64, _CPU_X86_64 = 0x0100000C, 0x01000007


def _thin_slices(data: bytes) -> list[tuple[int, int, int]]:
    """(cputype, offset, size) of each architecture of a fat file; one slice for a thin file."""
    if data[:4] not in (_FAT_MAGIC, _FAT_MAGIC_64):
        return [(-1, 0, len(data))]
    (n,) = _unpack(">I", data, 4)
    if n > 64:
        raise ValueError(f"a fat file with {n} architectures")
    out = []
    for k in range(n):
        if data[:4] == _FAT_MAGIC:
            cpu, _sub, off, size, _align = _unpack(">iiIII", data, 8 + 20 * k)
        else:
            cpu, _sub, off, size, _align, _r = _unpack(">iiQQII", data, 8 + 32 * k)
        out.append((cpu, off, size))
    return out


def macho_dependencies(data: bytes, prefer_cpu: int | None = None) -> Dependencies:
    """Load commands of a Mach-O file (the ``prefer_cpu`` slice of a fat file, else arm64, else the first)."""
    slices = _thin_slices(data)
    want = (prefer_cpu, _CPU_ARM64, _CPU_X86_64)
    cpu, base, size = next((s for w in want for s in slices if s[0] == w), slices[0])
    body = data[base:base + size]
    (magic,) = _unpack("<I", body, 0)
    if magic not in _MACHO_MAGICS:
        raise ValueError("not a little-endian Mach-O image")
    _cpu, _sub, _ftype, ncmds, _sizeofcmds, _flags = _unpack("<iiIIII", body, 4)
    at = 32 if magic == 0xFEEDFACF else 28
    needed: list[str] = []
    weak: list[str] = []
    rpaths: list[str] = []
    install_name = None
    if ncmds > _MAX_NAMES:
        raise ValueError(f"{ncmds} load commands")
    for _ in range(ncmds):
        cmd, cmdsize = _unpack("<II", body, at)
        if cmdsize < 8 or at + cmdsize > len(body):
            raise ValueError(f"a load command of size {cmdsize} at offset {at} runs past the header")
        if cmd in (_LC_LOAD_DYLIB, _LC_ID_DYLIB, _LC_LOAD_WEAK_DYLIB, _LC_REEXPORT_DYLIB, _LC_RPATH):
            (name_off,) = _unpack("<I", body, at + 8)
            name = _cstring(body[:at + cmdsize], at + name_off)
            if cmd == _LC_ID_DYLIB:
                install_name = name
            elif cmd == _LC_RPATH:
                rpaths.append(name)
            elif cmd == _LC_LOAD_WEAK_DYLIB:
                weak.append(name)
            else:
                needed.append(name)
        at += cmdsize
    return Dependencies("macho", tuple(needed), tuple(weak), install_name, tuple(rpaths))

"""Read the dynamic section of an ELF shared object: SONAME, NEEDED, RUNPATH and RPATH.

A small reader of our own, the one for both sides: the CUDA runtime preload reads a backend's
NEEDED here, and ``build_tools`` (the native manifest, wheel repair and validation) re-exports it
from ``build_tools.common.elf``. The file is mapped, not read: CUDA backends are large.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2


@dataclass(frozen=True)
class DynamicInfo:
    soname: str | None = None
    needed: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    machine: int | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)


def is_elf(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def read_dynamic(path: str | os.PathLike[str]) -> DynamicInfo:
    """Parse ``path``'s PT_DYNAMIC segment; raises ``ValueError`` for a non-ELF or malformed file."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"{path}: not an ELF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(path, data)


def _parse(path: str | os.PathLike[str], data: mmap.mmap) -> DynamicInfo:
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path}: not an ELF file")
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    if is64:
        e_phoff, = struct.unpack_from(endian + "Q", data, 0x20)
        e_phentsize, e_phnum = struct.unpack_from(endian + "HH", data, 0x36)
        ph_fmt, dyn_fmt = endian + "IIQQQQQQ", endian + "qQ"
    else:
        e_phoff, = struct.unpack_from(endian + "I", data, 0x1C)
        e_phentsize, e_phnum = struct.unpack_from(endian + "HH", data, 0x2A)
        ph_fmt, dyn_fmt = endian + "IIIIIIII", endian + "iI"
    machine, = struct.unpack_from(endian + "H", data, 0x12)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for i in range(e_phnum):
        fields = struct.unpack_from(ph_fmt, data, e_phoff + i * e_phentsize)
        if is64:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return DynamicInfo(machine=machine)

    def vaddr_to_offset(addr: int) -> int:
        for vaddr, offset, size in loads:
            if vaddr <= addr < vaddr + size:
                return addr - vaddr + offset
        raise ValueError(f"{path}: address {addr:#x} is outside every PT_LOAD segment")

    entries: list[tuple[int, int]] = []
    step = struct.calcsize(dyn_fmt)
    off, end = dynamic[0], dynamic[0] + dynamic[1]
    while off + step <= end:
        tag, val = struct.unpack_from(dyn_fmt, data, off)
        if tag == _DT_NULL:
            break
        entries.append((tag, val))
        off += step
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    if strtab is None:
        return DynamicInfo(machine=machine)
    base = vaddr_to_offset(strtab)

    def string(offset: int) -> str:
        start = base + offset
        stop = data.find(b"\0", start)
        if stop < 0:
            raise ValueError(f"{path}: unterminated string in the dynamic section")
        return data[start:stop].decode("utf-8", "surrogateescape")

    def split(values: list[str]) -> tuple[str, ...]:
        return tuple(p for v in values for p in v.split(":") if p)

    return DynamicInfo(
        soname=next((string(v) for t, v in entries if t == _DT_SONAME), None),
        needed=tuple(string(v) for t, v in entries if t == _DT_NEEDED),
        runpath=split([string(v) for t, v in entries if t == _DT_RUNPATH]),
        rpath=split([string(v) for t, v in entries if t == _DT_RPATH]),
        machine=machine,
    )

"""Read the dynamic section of an ELF shared object: SONAME, NEEDED, RUNPATH and RPATH.

A small reader of our own: the manifest needs four fields and no dependency should be
required to compute them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

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


# e_machine by the architecture a wheel's platform tag ends with (manylinux_2_34_aarch64 -> aarch64).
MACHINES = {"x86_64": 62, "aarch64": 183, "i686": 3, "armv7l": 40, "ppc64le": 21, "s390x": 22, "riscv64": 243}


def machine_of(data: bytes) -> int | None:
    """The ``e_machine`` of an ELF image's header, or None for anything that is not ELF."""
    if len(data) < 0x14 or data[:4] != b"\x7fELF":
        return None
    return struct.unpack_from("<H" if data[5] == 1 else ">H", data, 0x12)[0]


def platform_machine(platform_tag: str) -> int | None:
    """The ``e_machine`` a Linux wheel's platform tag requires (None: not a Linux tag we know)."""
    if not platform_tag.startswith(("linux_", "manylinux", "musllinux")):
        return None
    return next((m for arch, m in MACHINES.items() if platform_tag.endswith("_" + arch)), None)


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def read_dynamic(path: Path) -> DynamicInfo:
    """Parse ``path``'s PT_DYNAMIC segment; raises ``ValueError`` for a non-ELF or malformed file."""
    data = Path(path).read_bytes()
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
        return data[start : data.index(b"\0", start)].decode("utf-8", "surrogateescape")

    def split(values: list[str]) -> tuple[str, ...]:
        return tuple(p for v in values for p in v.split(":") if p)

    return DynamicInfo(
        soname=next((string(v) for t, v in entries if t == _DT_SONAME), None),
        needed=tuple(string(v) for t, v in entries if t == _DT_NEEDED),
        runpath=split([string(v) for t, v in entries if t == _DT_RUNPATH]),
        rpath=split([string(v) for t, v in entries if t == _DT_RPATH]),
        machine=machine,
    )

"""ELF helpers of the release: the dynamic-section reader is the runtime's
(:mod:`llama_cpp._native.elf`, one parser for both sides); the wheel platform tags' machines are ours.
"""

from __future__ import annotations

import struct

from llama_cpp._native.elf import DynamicInfo, is_elf, read_dynamic

__all__ = ["MACHINES", "DynamicInfo", "is_elf", "machine_of", "platform_machine", "read_dynamic"]

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

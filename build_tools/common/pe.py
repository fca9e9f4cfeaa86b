"""Windows PE images (DLLs and programs): machine, kind and the DLLs they import.

The import tables come from the runtime's reader (:mod:`llama_cpp._binfmt`), so the release
checks and the loader's "which DLL is missing" answer read them the same way. What is added here
is what only the release needs: the target machine, and which DLL names Windows itself provides
(never grafted into a wheel, never reported missing) or a driver provides (never grafted either).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from llama_cpp._binfmt import pe_dependencies

MACHINE_AMD64 = 0x8664
MACHINE_ARM64 = 0xAA64
_MACHINES = {MACHINE_AMD64: "x86_64", MACHINE_ARM64: "arm64", 0x14C: "x86"}
_IMAGE_FILE_DLL = 0x2000

# DLLs every supported Windows (10 and later) ships in System32; API sets resolve inside the loader.
# A name missing here that Windows does provide shows up as a "missing dependency": add it.
SYSTEM_DLLS = frozenset({
    "advapi32.dll", "bcrypt.dll", "cfgmgr32.dll", "comctl32.dll", "comdlg32.dll", "crypt32.dll",
    "d3d11.dll", "d3d12.dll", "dbghelp.dll", "dwmapi.dll", "dxgi.dll", "gdi32.dll", "imm32.dll",
    "iphlpapi.dll", "kernel32.dll", "kernelbase.dll", "msvcrt.dll", "mswsock.dll", "ntdll.dll",
    "ole32.dll", "oleaut32.dll", "pdh.dll", "powrprof.dll", "psapi.dll", "rpcrt4.dll", "secur32.dll",
    "setupapi.dll", "shell32.dll", "shlwapi.dll", "ucrtbase.dll", "user32.dll", "userenv.dll",
    "version.dll", "winhttp.dll", "wininet.dll", "winmm.dll", "ws2_32.dll", "wsock32.dll",
})
_API_SET = re.compile(r"^(api|ext)-ms-", re.I)
# Provided by the user's system or NVIDIA's wheels: a wheel imports them but must never carry them.
DRIVER_DLL = re.compile(r"^(nvcuda|nvml|vulkan-1|cudart64_\d+|cublas(lt)?64_\d+|nvrtc64_\d+\w*|nvjitlink_\d+\w*)"
                        r"(-[0-9a-f]+)?\.dll$", re.I)


@dataclass(frozen=True)
class PeImage:
    """What the release needs to know of one PE file."""

    machine: str  # "x86_64", "arm64", "x86", or the hex value of another
    is_dll: bool
    needed: tuple[str, ...]  # the import table, in order
    delay: tuple[str, ...] = ()  # delay-loaded DLLs (resolved on first call)

    @property
    def imports(self) -> tuple[str, ...]:
        return self.needed + self.delay


def is_pe(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"MZ"


def parse_pe(data: bytes) -> PeImage:
    """The :class:`PeImage` of ``data``; ``ValueError`` for anything that is not a whole PE image."""
    if data[:2] != b"MZ" or len(data) < 0x40:
        raise ValueError("not a PE file (no MZ header)")
    (e_lfanew,) = struct.unpack_from("<I", data, 0x3C)
    if e_lfanew + 24 > len(data) or data[e_lfanew:e_lfanew + 4] != b"PE\0\0":
        raise ValueError("not a PE file (no PE signature)")
    machine, = struct.unpack_from("<H", data, e_lfanew + 4)
    characteristics, = struct.unpack_from("<H", data, e_lfanew + 22)
    deps = pe_dependencies(data)
    return PeImage(_MACHINES.get(machine, f"{machine:#x}"), bool(characteristics & _IMAGE_FILE_DLL),
                   deps.needed, deps.weak)


def read_pe(path: Path) -> PeImage:
    try:
        return parse_pe(Path(path).read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def is_system_dll(name: str) -> bool:
    """Whether Windows itself provides ``name`` (an API set, or a System32 DLL of every Windows 10+)."""
    return bool(_API_SET.match(name)) or name.lower() in SYSTEM_DLLS


def is_driver_dll(name: str) -> bool:
    """Whether ``name`` is a GPU driver's or NVIDIA runtime wheel's DLL (mangled names included)."""
    return bool(DRIVER_DLL.match(name))

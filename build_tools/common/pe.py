"""Windows PE images (DLLs and programs): machine, kind and the DLLs they import.

The import tables come from the runtime's reader (:mod:`llama_cpp._native.binfmt`), so the release
checks and the loader's "which DLL is missing" answer read them the same way. What is added here
is what only the release needs: the target machine, and which DLL names Windows itself provides
(never grafted into a wheel, never reported missing) or a driver provides (never grafted either).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from llama_cpp._native.binfmt import pe_dependencies

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
# What CPython's own Windows builds (3.9 and later, free-threaded too) ship beside python.exe, by the
# wheel's platform tag: delvewheel never grafts these for a cpXY wheel (its _dll_list
# ignore_by_abi_platform; tests/build_tools/wheels/test_msvc_runtime.py checks this table against the installed delvewheel), and
# Windows finds them in the interpreter's folder, which the DLL search of every process includes.
# MSVCP140.dll is not among them: delvewheel grafts it.
_PYTHON_DLLS = {
    "win_amd64": frozenset({"vcruntime140.dll", "vcruntime140_1.dll"}),
    "win_arm64": frozenset({"vcruntime140.dll", "vcruntime140_1.dll"}),
    "win32": frozenset({"vcruntime140.dll"}),
}
_CPYTHON_ABI = re.compile(r"^cp3(9|[1-9]\d)t?$")
# Imports that never load: some MSVCP140.dll builds delay-load concrt140.dll for Windows XP only
# (delvewheel's _dll_list ignore_dependency, which leaves it ungrafted).
IGNORED_IMPORTS = {"msvcp140.dll": frozenset({"concrt140.dll"})}
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


def python_dlls(abi_tag: str, platform_tag: str) -> frozenset[str]:
    """The DLLs (lowercase) CPython provides to a wheel tagged ``abi_tag``-``platform_tag``: none for
    a debug, stable-ABI or other interpreter's tag, whose runtime this does not vouch for."""
    if not _CPYTHON_ABI.match(abi_tag):
        return frozenset()
    return _PYTHON_DLLS.get(platform_tag, frozenset())


def loaded_imports(name: str, image: PeImage) -> tuple[str, ...]:
    """``image``'s imports (``name`` is its file name) less those Windows never loads for it."""
    skip = IGNORED_IMPORTS.get(name.lower(), frozenset())
    return tuple(d for d in image.imports if d.lower() not in skip)

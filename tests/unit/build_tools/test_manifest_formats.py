"""The native manifest describes PE (Windows) and Mach-O (macOS) libraries as it does ELF ones."""

from __future__ import annotations

import pytest

from build_tools.errors import ManifestError
from build_tools.stages.native.manifest import describe_library
from tests.native.fake_binaries import macho_dylib, macho_fat, pe_dll


def test_a_dll_records_its_imports_and_delay_loads(tmp_path):
    (tmp_path / "lib").mkdir()
    data = pe_dll(["ggml-base.dll", "KERNEL32.dll", "cudart64_12.dll"], delay=["nvcuda.dll"])
    (tmp_path / "lib" / "ggml-cuda.dll").write_bytes(data)
    rec = describe_library(tmp_path, "lib/ggml-cuda.dll")
    assert rec.soname == "ggml-cuda.dll" and rec.size == len(data)
    assert rec.needed == ("ggml-base.dll", "KERNEL32.dll", "cudart64_12.dll", "nvcuda.dll")
    assert rec.runpath == () and rec.rpath == ()


def test_a_dylib_records_install_name_dependencies_and_rpaths(tmp_path):
    (tmp_path / "lib").mkdir()
    thin = macho_dylib(["@rpath/libggml.dylib", "/System/Library/Frameworks/Metal.framework/Versions/A/Metal"],
                       weak=["@rpath/libomp.dylib"], install_name="@rpath/libllama.dylib", rpaths=["@loader_path"])
    (tmp_path / "lib" / "libllama.dylib").write_bytes(macho_fat([(0x0100000C, thin)]))
    rec = describe_library(tmp_path, "lib/libllama.dylib")
    assert rec.soname == "@rpath/libllama.dylib" and rec.runpath == ("@loader_path",)
    assert rec.needed == ("@rpath/libggml.dylib", "/System/Library/Frameworks/Metal.framework/Versions/A/Metal",
                          "@rpath/libomp.dylib")


def test_a_damaged_dll_is_a_manifest_error(tmp_path):
    (tmp_path / "bad.dll").write_bytes(pe_dll(["a.dll"])[:300])
    with pytest.raises(ManifestError, match="cannot read its dependencies"):
        describe_library(tmp_path, "bad.dll")

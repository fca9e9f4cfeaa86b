"""The ELF reader agrees with binutils' readelf on the real native build."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from build_tools.common.elf import read_dynamic


def test_native_libraries_dynamic_sections(native_build):
    llama = read_dynamic(native_build.lib_dir / "libllama.so.0")
    assert llama.soname == "libllama.so.0"
    assert {"libggml.so.0", "libggml-base.so.0"} <= set(llama.needed)
    assert llama.runpath == ("$ORIGIN",) and llama.rpath == ()
    cpu = read_dynamic(native_build.lib_dir / "libggml-cpu.so")
    assert cpu.soname is None and "libggml-base.so.0" in cpu.needed
    assert "libgomp.so.1" not in cpu.needed  # OpenMP is off: nothing to graft into wheels


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils readelf not installed")
def test_matches_readelf(native_build):
    for lib in native_build.manifest.libraries:
        path = native_build.root / lib.path
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        needed = tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out))
        soname = re.findall(r"\(SONAME\)\s+Library soname: \[(.+?)\]", out)
        runpath = re.findall(r"\(RUNPATH\)\s+Library runpath: \[(.+?)\]", out)
        info = read_dynamic(path)
        assert info.needed == needed == lib.needed
        assert info.soname == (soname[0] if soname else None) == lib.soname
        assert info.runpath == tuple(runpath[0].split(":") if runpath else ()) == lib.runpath


def test_not_elf(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"MZ not elf")
    with pytest.raises(ValueError, match="not an ELF"):
        read_dynamic(p)

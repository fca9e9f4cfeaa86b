"""glslc where the package manager has none (AlmaLinux 8, the manylinux_2_28 image the release's
Vulkan job builds in): built from pinned sources into the cache, its sources and version in the key."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from build_tools.common import debfile, syspkg
from build_tools.inputs.configs import load_matrix
from build_tools.stages.native import vulkan_toolchain as vt

pytestmark = pytest.mark.vulkan

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def fake_glslc(tmp_path) -> Path:
    exe = tmp_path / "bin" / "glslc"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\necho 'shaderc v2023.2 v2023.2'\necho 'spirv-tools v2023.1'\n")
    exe.chmod(0o755)
    return exe


def _machine(monkeypatch, mgr: str, *, offered: bool, on_path: Path | None = None) -> list[list[str]]:
    installed: list[list[str]] = []
    monkeypatch.setattr(syspkg, "manager", lambda: mgr)
    monkeypatch.setattr(syspkg, "version", lambda m, p: None)
    monkeypatch.setattr(syspkg, "available", lambda m, p: offered)

    def ensure(m, packages, **kw):
        installed.append(list(packages))
        return {p: "1.0" for p in packages}

    monkeypatch.setattr(syspkg, "ensure", ensure)
    monkeypatch.setattr(vt.shutil, "which", lambda name: str(on_path) if on_path and name == "glslc" else None)
    return installed


def test_without_a_glslc_package_it_is_built_from_the_pinned_sources(monkeypatch, fake_glslc):
    spec = load_matrix().get("vulkan").vulkan
    assert vt.GLSLC_PACKAGE in spec.packages("dnf")  # what the manylinux job asks dnf for
    installed = _machine(monkeypatch, "dnf", offered=False)
    built = []
    monkeypatch.setattr(vt, "build_glslc", lambda: built.append(1) or fake_glslc)
    monkeypatch.setattr(vt.debfile, "fetch", lambda *a, **k: pytest.fail("headers are not fetched here"))
    spec = type(spec)(**{**spec.__dict__, "headers_deb": None, "headers_sha256": None})
    tc = vt.provision(spec)
    assert built and installed == [[p for p in spec.packages("dnf") if p != vt.GLSLC_PACKAGE]]
    assert tc.glslc == fake_glslc and tc.cmake_defines()["Vulkan_GLSLC_EXECUTABLE"] == str(fake_glslc)
    # the key: the version glslc reports and the sources it was built from
    assert tc.versions["glslc"] == "shaderc v2023.2 v2023.2"
    assert tc.versions["glslc-source"] == vt.glslc_sources_key()
    assert "dnf:glslc" not in tc.versions


def test_where_the_package_exists_it_is_installed_and_nothing_is_built(monkeypatch, fake_glslc):
    spec = load_matrix().get("vulkan").vulkan
    spec = type(spec)(**{**spec.__dict__, "headers_deb": None, "headers_sha256": None})
    installed = _machine(monkeypatch, "apt", offered=True, on_path=fake_glslc)
    monkeypatch.setattr(vt, "build_glslc", lambda: pytest.fail("glslc is packaged here"))
    tc = vt.provision(spec)
    assert installed == [list(spec.packages("apt"))] and "glslc-source" not in tc.versions
    assert tc.versions["apt:glslc"] == "1.0" and tc.glslc == fake_glslc


def test_the_glslc_sources_are_pinned():
    assert len(vt.GLSLC_SOURCES) == 4
    for src in vt.GLSLC_SOURCES:
        assert re.fullmatch(r"[0-9a-f]{64}", src.sha256) and src.pool_path.startswith("pool/main/")
    key = vt.glslc_sources_key()
    assert "shaderc_2023.2" in key and all(s.sha256[:16] in key for s in vt.GLSLC_SOURCES)
    # a different pin is a different build folder, and a different key
    other = (vt.GLSLC_SOURCES[0].__class__(vt.GLSLC_SOURCES[0].pool_path, "0" * 64, "src"), *vt.GLSLC_SOURCES[1:])
    assert vt.glslc_path(other) != vt.glslc_path() and vt.glslc_sources_key(other) != key


def test_a_pool_name_with_a_plus_is_quoted(monkeypatch, tmp_path):
    urls = []

    def urlopen(url, timeout):
        urls.append(url)
        raise OSError("offline")

    monkeypatch.setattr(debfile.urllib.request, "urlopen", urlopen)
    with pytest.raises(Exception, match="could not download"):
        debfile.fetch("pool/main/s/spirv-headers/spirv-headers_1.6.1+1.3.239.0-1_all.deb", "0" * 64, tmp_path)
    assert urls and urls[0].endswith("/pool/main/s/spirv-headers/spirv-headers_1.6.1%2B1.3.239.0-1_all.deb")


def test_the_built_glslc_compiles_ggml_shaders(tmp_path):
    glslc = vt.glslc_path()
    if not glslc.is_file():
        pytest.skip(f"glslc is not built from its sources here ({glslc}): "
                    "python -c 'from build_tools.stages.native.vulkan_toolchain import build_glslc; build_glslc()'")
    version = subprocess.run([str(glslc), "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("shaderc v2023.2") and "spirv-tools v2023.1" in version and "glslang" in version
    # the first line enters the content key: the fixed date, not the day it was built
    assert version.splitlines()[0] == "shaderc v2023.2 unknown hash, 2023-02-01", version
    shaders = REPO / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-vulkan" / "vulkan-shaders"
    if not shaders.is_dir():
        pytest.skip("the pinned llama.cpp is not vendored")
    out = tmp_path / "add.spv"
    done = subprocess.run([str(glslc), "-fshader-stage=compute", "--target-env=vulkan1.2", "-O",
                           str(shaders / "add.comp"), "-o", str(out), "-DA_TYPE=float", "-DB_TYPE=float",
                           "-DD_TYPE=float", "-DFLOAT_TYPE=float"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:4] == b"\x03\x02\x23\x07"  # the SPIR-V magic number, little-endian


def test_package_availability_per_manager(monkeypatch, tmp_path):
    monkeypatch.setattr(syspkg, "APT_LISTS", tmp_path)  # apt before its first update: cannot tell
    assert syspkg.available("apt", "glslc") is None
    calls = []
    monkeypatch.setattr(syspkg.proc, "run", lambda cmd, **kw: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 1, "", "Error: No matching Packages to list"))
    assert syspkg.available("dnf", "glslc") is False and calls[-1][-2:] == ["info", "glslc"]
    (tmp_path / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages").write_text("")
    monkeypatch.setattr(syspkg.proc, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "Package: glslc\n", ""))
    assert syspkg.available("apt", "glslc") is True


def test_unknown_availability_installs_the_package(monkeypatch, fake_glslc):
    spec = load_matrix().get("vulkan").vulkan
    spec = type(spec)(**{**spec.__dict__, "headers_deb": None, "headers_sha256": None})
    installed = _machine(monkeypatch, "apt", offered=None, on_path=None)
    monkeypatch.setattr(vt, "build_glslc", lambda: pytest.fail("unknown is not 'not packaged'"))
    with pytest.raises(Exception, match="glslc is not on PATH"):  # the fake apt installed nothing
        vt.provision(spec)
    assert installed == [list(spec.packages("apt"))]


def test_building_glslc_prints_nothing_on_stdout(monkeypatch, tmp_path, capfd):
    # `native --print-key` provisions the toolchain, and release.yml reads the key from its stdout.
    monkeypatch.setenv("LLAMA_CPP_PYTHON_CACHE", str(tmp_path / "cache"))
    commands = []

    def run(cmd, **kw):
        commands.append(cmd)
        assert kw.get("capture", True), "a build command would print on stdout"
        assert kw["env"]["SOURCE_DATE_EPOCH"] == vt.GLSLC_SOURCE_DATE_EPOCH  # no build date in the version
        if "--build" in cmd:
            out = Path(cmd[cmd.index("--build") + 1]) / "glslc"
            out.mkdir(parents=True)
            (out / "glslc").write_text("#!/bin/sh\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(vt.proc, "run", run)
    monkeypatch.setattr(vt, "find_cmake", lambda: Path("/usr/bin/cmake"))
    monkeypatch.setattr(vt, "find_ninja", lambda: Path("/usr/bin/ninja"))
    monkeypatch.setattr(vt, "_unpack", lambda archive, dest: dest.mkdir(parents=True, exist_ok=True))
    monkeypatch.setattr(vt.debfile, "fetch", lambda pool, sha, dest: tmp_path / pool.rsplit("/", 1)[-1])
    exe = vt.build_glslc()
    assert exe.is_file() and exe == vt.glslc_path() and str(tmp_path / "cache") in str(exe)
    assert capfd.readouterr().out == ""
    assert any("-DSPIRV-Headers_SOURCE_DIR=" in " ".join(map(str, c)) for c in commands)
    assert any(c[-2:] == ["--target", "glslc_exe"] or "glslc_exe" in c for c in commands)
    assert vt.build_glslc() == exe and len(commands) == 2  # built once

"""repair_macos: delocate must find nothing to copy or rewrite in a Metal wheel; anything else is refused."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from build_tools.errors import RepairError
from build_tools.stages import wheels as stage
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import repair_macos
from build_tools.stages.wheels.inwheel import read_entries

from ...native.fake_binaries import macho_dylib, macho_fat
from ..macos_fakes import LIBRARIES, SYSTEM, delocated, dylib

pytestmark = pytest.mark.macos

LIB = "llama_cpp/lib"


def _fake_delocate(monkeypatch, effect=None):
    """delocate-wheel as a function of (input wheel, -w folder); records its arguments."""
    calls = []

    def fake(args, cwd, macos_version):
        calls.append((list(args), macos_version))
        out = Path(args[args.index("-w") + 1])
        (effect or (lambda w, o: delocated(w, o)))(Path(cwd) / args[-1], out)
        return ""

    monkeypatch.setattr(repair_macos, "_delocate", fake)
    return calls


def _files(wheel: Path) -> dict[str, bytes]:
    return {e.name: e.data for e in read_entries(wheel)}


def test_a_wheel_delocate_leaves_alone_passes_with_its_libraries_byte_for_byte(mac_wheels, mac_native, monkeypatch):
    calls = _fake_delocate(monkeypatch)
    before = {w.path.name: _files(w.path) for w in mac_wheels}
    out = repair_macos.repair(mac_wheels, mac_native.manifest).wheels
    assert [w.path.name for w in out] == list(before) and all(w.repaired for w in out)
    for w in out:
        files = _files(w.path)
        for lib in mac_native.manifest.libraries:
            assert hashlib.sha256(files[f"{LIB}/{lib.name}"]).hexdigest() == lib.sha256
        assert set(files) == set(before[w.path.name])
    # the wheel's own architecture and macOS version are what delocate is held to
    assert all(args[:2] == ["--require-archs", "arm64"] and version == "14.0" for args, version in calls)


@pytest.mark.parametrize(("effect", "needle"), [
    (lambda w, o: delocated(w, o, add={"llama_cpp/.dylibs/libomp.dylib": macho_dylib(list(SYSTEM))}),
     r"beyond its records: added \['llama_cpp/.dylibs/libomp.dylib'\]"),
    (lambda w, o: delocated(w, o, add={f"{LIB}/libllama.0.dylib": dylib("libllama.0.dylib", ("@loader_path/../.dylibs/x",))}),
     r"changed \['llama_cpp/lib/libllama.0.dylib'\]"),
    (lambda w, o: delocated(w, o, name=w.name.replace("macosx_14_0", "macosx_15_0")),
     "tagged .* macosx_15_0_arm64, expected macosx_14_0_arm64"),
])
def test_what_delocate_changes_is_refused(mac_wheels, mac_native, monkeypatch, effect, needle):
    _fake_delocate(monkeypatch, effect)
    with pytest.raises(RepairError, match=needle):
        repair_macos.repair(mac_wheels, mac_native.manifest)


def _wheel_files(**libs: bytes) -> dict[str, bytes]:
    files = {f"{LIB}/{n}": dylib(n, needed) for n, needed in LIBRARIES.items()}
    files.update({f"{LIB}/{n}": d for n, d in libs.items()})
    return files


def test_the_real_build_s_load_commands_have_no_problem():
    assert repair_macos.dependency_problems(_wheel_files(), list(LIBRARIES), "arm64") == []


@pytest.mark.parametrize(("libs", "needle"), [
    ({"libggml-cpu-apple_m1.so": dylib("libggml-cpu-apple_m1.so", (*SYSTEM, "/opt/homebrew/opt/libomp/lib/libomp.dylib"))},
     "loads /opt/homebrew/opt/libomp/lib/libomp.dylib, which is neither in the wheel nor part of macOS"),
    ({"libllama.0.dylib": dylib("libllama.0.dylib", (*SYSTEM, "@rpath/libmissing.dylib"))},
     "loads @rpath/libmissing.dylib"),
    ({"libggml.0.dylib": dylib("libggml.0.dylib", SYSTEM, cpu=0x01000007)}, "a x86_64 file in an arm64 wheel"),
    ({"libggml.0.dylib": macho_fat([(0x0100000C, dylib("libggml.0.dylib", SYSTEM))])}, "a fat file in an arm64 wheel"),
    ({"libggml.0.dylib": dylib("libggml.0.dylib", SYSTEM, rpaths=["@loader_path", "/Users/runner/work/build/bin"])},
     "LC_RPATH '/Users/runner/work/build/bin'"),
    ({"libggml.0.dylib": b"\x7fELF" + b"\0" * 60}, "libggml.0.dylib: not a Mach-O library"),
])
def test_dependency_problems_name_the_library_and_the_cause(libs, needle):
    problems = repair_macos.dependency_problems(_wheel_files(**libs), list(LIBRARIES), "arm64")
    assert any(needle in p for p in problems), problems


def test_a_copied_library_is_a_problem_even_unreferenced():
    files = {**_wheel_files(), "llama_cpp/.dylibs/libomp.dylib": macho_dylib(list(SYSTEM))}
    assert any("delocate copied a library" in p for p in repair_macos.dependency_problems(files, list(LIBRARIES), "arm64"))


def test_tags():
    assert repair_macos.is_macos_tag("macosx_14_0_arm64") and not repair_macos.is_macos_tag("win_amd64")
    assert repair_macos.tag_arch("macosx_14_0_arm64") == "arm64"
    assert repair_macos.tag_version("macosx_14_0_arm64") == "14.0"


def test_the_wheels_stage_sends_macos_wheels_to_delocate_with_the_deployment_tag(mac_native, mac_config, mac_repo,
                                                                                   tmp_path, monkeypatch):
    seen = []

    def fake_repair(built, manifest, *, jobs=None):
        seen.append([w.platform_tag for w in built])
        return repair_macos.MacosRepair([w.refreshed(w.path, repaired=True) for w in built])

    monkeypatch.setattr(repair_macos, "repair", fake_repair)
    options = wheels.WheelOptions(out_dir=tmp_path / "dist", python_tags=("cp312",), repo=mac_repo, epoch=315532800)
    result = stage.run(mac_native, mac_config, options)  # on this Linux host too: the platform's tag
    assert seen == [["macosx_14_0_arm64"]]
    assert result.platform_tag == "macosx_14_0_arm64" and all(w.repaired for w in result.wheels)


def test_missing_delocate_names_the_fix(mac_wheels, mac_native, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "delocate" else find_spec(name, *a))
    with pytest.raises(RepairError, match="delocate is not installed: pip install -r requirements/release.txt"):
        repair_macos.repair(mac_wheels, mac_native.manifest)

"""validate on Windows wheels (fake PE DLLs, a delvewheel-shaped graft): the repaired wheels pass; a
tampered DLL, a missing dependency, a grafted nvcuda.dll and a patch that does more are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from build_tools.stages import validate
from build_tools.stages.wheels.repair_windows import INIT

from ..fake_pe import ARM64, make_pe
from ..windows_fakes import GRAFTS, LIBS, graft, patch_block

pytestmark = pytest.mark.windows


def _check(fake_native, win_config, win_repo, wheel_paths, originals):
    built = [replace(w, path=p) for w, p in zip(originals, wheel_paths)]
    return validate.validate(built, fake_native.manifest, win_config, version=originals[0].version,
                             python_tags=sorted({w.python_tag for w in built}), twine=False, repo=win_repo)


@pytest.fixture
def check(fake_native, win_config, win_repo, fake_wheels, tmp_path):
    """Graft every fake wheel (tampering with the first as asked), then validate them all."""
    def run(**tamper):
        paths = [graft(w.path, tmp_path / "out" / w.path.name, **(tamper if i == 0 else {}))
                 for i, w in enumerate(fake_wheels)]
        return _check(fake_native, win_config, win_repo, paths, fake_wheels)
    return run


def _messages(report, check_name):
    return [f.message for f in report.wheels[0].failures if f.check == check_name]


def test_repaired_windows_wheels_pass(check):
    report = check()
    assert report.ok, report.render()


def test_unrepaired_wheels_name_the_missing_runtime(fake_native, win_config, win_repo, fake_wheels):
    report = _check(fake_native, win_config, win_repo, [w.path for w in fake_wheels], fake_wheels)
    assert not report.ok and report.failed_checks() == {"dll-dependency"}
    text = " ".join(_messages(report, "dll-dependency"))
    assert "llama_cpp/lib/libllama.dll imports libstdc++-6.dll, which is not in the wheel" in text
    assert "delvewheel --add-path" in text


def test_tampered_dll_is_refused(check):
    report = check(replace={"llama_cpp/lib/ggml-base.dll": make_pe(["KERNEL32.dll"], payload=b"evil")})
    assert "library-hash" in report.failed_checks()
    assert any("llama_cpp/lib/ggml-base.dll: sha256" in m for m in _messages(report, "library-hash"))
    # the untouched wheel fails only because the set no longer carries identical libraries
    assert {f.check for f in report.wheels[1].failures} == {"libraries-identical"}


def test_missing_dependency_is_refused(check):
    report = check(drop=(f"{LIBS}/libwinpthread-1.dll",))
    assert not report.ok
    msgs = _messages(report, "dll-dependency")
    assert any("imports libwinpthread-1.dll, which is not in the wheel and not part of Windows" in m for m in msgs)


def test_grafted_nvcuda_is_refused(check):
    report = check(grafts={**GRAFTS, "nvcuda.dll": make_pe(["KERNEL32.dll"], payload=b"driver")})
    assert {"graft", "driver-library"} <= report.failed_checks()
    assert any("nvcuda.dll: a GPU driver or NVIDIA runtime DLL was grafted" in m for m in _messages(report, "graft"))


def test_mangled_cuda_runtime_graft_is_refused(check):
    report = check(grafts={**GRAFTS, "cudart64_12-0123abcd.dll": make_pe(["KERNEL32.dll"])})
    assert any("cudart64_12-0123abcd.dll: a GPU driver" in m for m in _messages(report, "graft"))


@pytest.mark.parametrize("name, data, needle", [
    ("extra-1.dll", make_pe(["KERNEL32.dll"]), "no DLL of the wheel imports it"),
    ("kernel32.dll", make_pe([]), "part of Windows"),
    ("tool.dll", make_pe([], dll=False), "a program, not a DLL"),
    ("notes.txt", b"hello", "not a DLL"),
])
def test_unexpected_grafts_are_refused(check, name, data, needle):
    report = check(grafts={**GRAFTS, name: data})
    assert any(needle in m for m in _messages(report, "graft")), report.render()


def test_graft_for_another_machine_is_refused(check):
    grafts = {**GRAFTS, "libwinpthread-1.dll": make_pe(["KERNEL32.dll"], machine=ARM64)}
    report = check(grafts=grafts)
    assert any("built for arm64" in m for m in _messages(report, "graft"))
    assert any("PE file for arm64" in m for m in _messages(report, "architecture"))


def test_patch_that_does_more_is_refused(check):
    report = check(block=patch_block(extra="    __import__('subprocess').run(['calc'])\n"))
    msgs = _messages(report, "payload")
    assert any(INIT in m and "calls" in m for m in msgs), report.render()


def test_patch_naming_another_folder_is_refused(check):
    report = check(block=patch_block(libs="elsewhere"))
    assert any("names 'elsewhere'" in m for m in _messages(report, "payload")), report.render()


def test_init_changed_besides_the_patch_is_refused(check, fake_wheels):
    from build_tools.stages.wheels.inwheel import read_entries

    original = next(e.data for e in read_entries(fake_wheels[0].path) if e.name == INIT)
    from ..windows_fakes import patched_init

    report = check(replace={INIT: patched_init(original + b"\nEVIL = 1\n")})
    assert any(INIT in m and "sha256" in m for m in _messages(report, "payload")), report.render()


def test_grafts_must_be_the_same_in_every_wheel(check):
    grafts = {**GRAFTS, "libgcc_s_seh-1.dll": make_pe(["KERNEL32.dll", "msvcrt.dll", "libwinpthread-1.dll"],
                                                       payload=b"other build")}
    report = check(grafts=grafts)
    assert "libraries-identical" in report.failed_checks()


def test_libs_folder_is_accepted_only_on_windows_wheels():
    """The graft folder is tag-specific only on a Windows wheel: elsewhere the same files are extra."""
    assert not validate._tag_specific(f"{LIBS}/libstdc++-6.dll", "x.dist-info", set())
    assert validate._tag_specific(f"{LIBS}/libstdc++-6.dll", "x.dist-info", set(), LIBS)

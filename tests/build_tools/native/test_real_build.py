"""The real MinGW-w64 cross build: its PE native manifest, delvewheel's graft of the MinGW runtime into
its wheels, validate's verdict, and the tamper cases on real DLLs. Skipped, with the command that makes
them, when the build or delvewheel is absent."""

from __future__ import annotations

import importlib.util

import pytest

from build_tools.common import pe
from build_tools.common.hashing import sha256_file
from build_tools.errors import BuildToolsError
from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages import validate
from build_tools.stages.native import build as native
from build_tools.stages.vendor import current_tree
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import repair_windows
from build_tools.stages.wheels.inwheel import read_entries, write_wheel

from ..windows_fakes import CONFIG, LIBS, RUNTIME

pytestmark = pytest.mark.windows

EPOCH = 1_700_000_000


@pytest.fixture(scope="module")
def real_native():
    lock = load_lock()
    try:
        p = native.plan(load_matrix().get(CONFIG), lock, current_tree(lock), install=False)
    except BuildToolsError as exc:
        pytest.skip(f"{CONFIG} cannot be planned here ({exc})")
    nb = native.find_finished(p)
    if nb is None:
        pytest.skip(f"{CONFIG} is not built: run `python -m build_tools native {CONFIG}`")
    return nb


@pytest.fixture(scope="module")
def repaired(real_native, win_repo, tmp_path_factory):
    if importlib.util.find_spec("delvewheel") is None:
        pytest.skip("delvewheel is not installed: pip install delvewheel (requirements/release.txt)")
    config = real_native.config
    out = tmp_path_factory.mktemp("realwin") / CONFIG
    options = wheels.WheelOptions(out_dir=out, python_tags=("cp311", "cp312"), platform_tag="win_amd64",
                                  repo=win_repo, epoch=EPOCH)
    built = wheels.build_wheels(real_native, config, options)
    return repair_windows.repair(built, real_native.manifest, config)


def test_native_manifest_records_pe_dlls(real_native):
    m = real_native.manifest
    names = {lib.name for lib in m.libraries}
    cpu = {n for n in names if n.startswith("ggml-cpu")}
    assert names - cpu == {"ggml-base.dll", "ggml.dll", "libllama.dll", "libmtmd.dll",
                          "libllama-common.dll", "libllama-cpp-ext.dll",  # llama.cpp's chat layer and its C API
                          "ggml-rpc.dll"}  # the RPC backend (GGML_RPC), a dynamic backend module
    if real_native.config.cpu_variants == "single":
        assert cpu == {"ggml-cpu.dll"} and m.backends == ("cpu", "rpc")
    else:  # one DLL per x86-64 variant, the best loaded at run time (ggml-cpu-haswell.dll, ...)
        assert len(cpu) > 1 and all(n.startswith("ggml-cpu-") for n in cpu) and "cpu-haswell" in m.backends
    for lib in m.libraries:
        image = pe.read_pe(real_native.root / lib.path)
        assert image.machine == "x86_64" and image.is_dll
        assert lib.soname == lib.name and lib.needed == image.imports and not lib.runpath
        for dep in lib.needed:  # ours, Windows', or the MinGW runtime delvewheel grafts
            assert dep in names or pe.is_system_dll(dep) or dep in RUNTIME, (lib.name, dep)
    assert "libstdc++-6.dll" in m.library("libllama.dll").needed


def _validate(real_native, win_repo, ws):
    return validate.validate(ws, real_native.manifest, real_native.config, version=ws[0].version,
                             python_tags=sorted({w.python_tag for w in ws}), twine=False, repo=win_repo)


def test_delvewheel_grafts_the_runtime_and_validate_passes(repaired, real_native, win_repo):
    assert repaired.grafted == tuple(sorted(RUNTIME))
    for w in repaired.wheels:
        names = {e.name for e in read_entries(w.path)}
        assert {f"{LIBS}/{n}" for n in RUNTIME} <= names and w.repaired and w.platform_tag == "win_amd64"
        assert not any(pe.is_driver_dll(n.rsplit("/", 1)[-1]) for n in names)
    report = _validate(real_native, win_repo, repaired.wheels)
    assert report.ok, report.render()


def test_repair_is_reproducible(repaired, real_native, win_repo, tmp_path):
    out = tmp_path / CONFIG
    options = wheels.WheelOptions(out_dir=out, python_tags=("cp311", "cp312"), platform_tag="win_amd64",
                                  repo=win_repo, epoch=EPOCH)
    again = repair_windows.repair(wheels.build_wheels(real_native, real_native.config, options),
                                  real_native.manifest, real_native.config)
    assert [w.sha256 for w in again.wheels] == [w.sha256 for w in repaired.wheels]


def _tampered(w, tmp_path, *, drop=(), add=None, flip=None):
    entries = {e.name: e for e in read_entries(w.path)}
    dist_info = next(n.split("/")[0] for n in entries if n.split("/")[0].endswith(".dist-info"))
    for name in drop:
        entries.pop(name)
    for name, data in (add or {}).items():
        entries[name] = type(next(iter(entries.values())))(name, data)
    if flip:
        e = entries[flip]
        data = bytearray(e.data)
        data[len(data) // 2] ^= 0xFF
        entries[flip] = type(e)(e.name, bytes(data), e.executable)
    dest = tmp_path / w.path.name
    write_wheel(dest, entries.values(), dist_info, EPOCH)
    return w.refreshed(dest)


@pytest.mark.parametrize("case, checks, needle", [
    ("tampered", {"library-hash"}, "llama_cpp/lib/ggml-base.dll: sha256"),
    ("missing", {"dll-dependency"}, "imports libwinpthread-1.dll, which is not in the wheel"),
    ("nvcuda", {"graft", "driver-library"}, "nvcuda.dll: a GPU driver or NVIDIA runtime DLL was grafted"),
])
def test_tampered_real_wheels_are_refused(repaired, real_native, win_repo, tmp_path, case, checks, needle):
    w = repaired.wheels[0]
    if case == "tampered":
        bad = _tampered(w, tmp_path, flip="llama_cpp/lib/ggml-base.dll")
    elif case == "missing":
        bad = _tampered(w, tmp_path, drop=(f"{LIBS}/libwinpthread-1.dll",))
    else:  # a real DLL under the driver's name, as a careless --add-path of System32 would graft it
        real = (real_native.root / "lib" / "ggml.dll").read_bytes()
        bad = _tampered(w, tmp_path, add={f"{LIBS}/nvcuda.dll": real})
    report = _validate(real_native, win_repo, [bad])
    assert checks <= report.failed_checks(), report.render()
    assert any(needle in f.message for f in report.wheels[0].failures), report.render()


def test_repair_refuses_a_wheel_whose_dll_needs_something_unfindable(real_native, win_repo, tmp_path, monkeypatch):
    if importlib.util.find_spec("delvewheel") is None:
        pytest.skip("delvewheel is not installed: pip install delvewheel (requirements/release.txt)")
    options = wheels.WheelOptions(out_dir=tmp_path / CONFIG, python_tags=("cp312",), platform_tag="win_amd64",
                                  repo=win_repo, epoch=EPOCH)
    built = wheels.build_wheels(real_native, real_native.config, options)
    monkeypatch.setattr(repair_windows, "runtime_dirs", lambda config: [])  # the MinGW runtime is not found
    with pytest.raises(repair_windows.RepairError, match="Unable to find library|neither in the wheel"):
        repair_windows.repair(built, real_native.manifest, real_native.config)
    assert sha256_file(built[0].path) == built[0].sha256  # the wheel on disk is left as built

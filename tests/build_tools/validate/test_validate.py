"""validate refuses each kind of broken wheel, naming the failed check."""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from build_tools.inputs.configs import load_matrix
from build_tools.stages import validate
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import inwheel

from ..conftest import fake_native


@pytest.fixture
def check(repo):
    """validate.validate against the sources the session's wheels were built from (``repo``)."""
    def run(ws, native_build, config, twine=False):
        return validate.validate(ws, native_build.manifest, config, version=wheels.expected_version(config, repo),
                                 python_tags=wheels.PYTHON_TAGS, twine=twine, repo=repo)
    return run


def _raw_edit(path: Path, replace_: dict[str, bytes]) -> None:
    """Rewrite entries without regenerating RECORD (what a careless tool would do)."""
    entries = inwheel.read_entries(path)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for e in entries:
            zf.writestr(e.name, replace_.get(e.name, e.data))
    tmp.replace(path)


def _refresh(w):
    return w.refreshed(w.path)


def test_release_wheels_pass_including_twine(check, built, native_build, config):
    report = check(built.wheels, native_build, config, twine=True)
    assert report.ok, report.render()
    assert len(report.wheels) == 5


def test_one_changed_byte_in_one_library(check, wheel_copy, native_build, config):
    w = wheel_copy[2]
    entries = {e.name: e.data for e in inwheel.read_entries(w.path)}
    lib = "llama_cpp/lib/libggml.so.0"
    data = bytearray(entries[lib])
    data[len(data) // 2] ^= 0x01
    inwheel.rewrite(w.path, w.path, replace={lib: bytes(data)})  # RECORD rewritten: only the hash check sees it
    wheel_copy[2] = _refresh(w)
    report = check(wheel_copy, native_build, config)
    assert not report.ok
    bad = report.wheels[2]
    assert {f.check for f in bad.failures} == {"library-hash", "libraries-identical"}
    assert any("libggml.so.0" in f.message for f in bad.failures)
    assert all(not any(f.check == "library-hash" for f in r.failures) for i, r in enumerate(report.wheels) if i != 2)


def test_version_mismatch(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    meta_name = next(e.name for e in inwheel.read_entries(w.path) if e.name.endswith("METADATA"))
    meta = next(e.data for e in inwheel.read_entries(w.path) if e.name == meta_name).decode()
    inwheel.rewrite(w.path, w.path, replace={meta_name: meta.replace(f"Version: {w.version}", "Version: 9.9.9")
                                             .encode()})
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"version", "payload"}
    assert any("METADATA 9.9.9" in f.message for f in report.wheels[0].failures)


def test_wrong_tag(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    wrong = w.path.with_name(w.path.name.replace("cp310-cp310", "cp39-cp39"))
    wheel_name = next(e.name for e in inwheel.read_entries(w.path) if e.name.endswith(".dist-info/WHEEL"))
    text = next(e.data for e in inwheel.read_entries(w.path) if e.name == wheel_name).decode()
    inwheel.rewrite(w.path, wrong, replace={wheel_name: text.replace("cp310-cp310", "cp39-cp39").encode()})
    report = check([w.refreshed(wrong)], native_build, config)
    assert report.failed_checks() == {"tag"}
    messages = " ".join(f.message for f in report.wheels[0].failures)
    assert "cp39" in messages and "intended" in messages


def test_filename_and_wheel_tags_disagree(check, wheel_copy, native_build, config):
    w = wheel_copy[1]
    renamed = w.path.with_name(w.path.name.replace(w.platform_tag, "linux_x86_64"))
    w.path.rename(renamed)
    report = check([replace(w, path=renamed)], native_build, config)
    assert "tag" in report.failed_checks()
    assert any("WHEEL tags" in f.message for f in report.wheels[0].failures)


@pytest.mark.skipif(not wheels.default_platform_tag().endswith("x86_64"), reason="the session's libraries are not x86-64")
def test_libraries_of_another_architecture(check, wheel_copy, native_build, config):
    # x86-64 libraries in a wheel retagged (consistently, RECORD and all) for aarch64: only the ELF headers tell.
    w = wheel_copy[0]
    other = w.platform_tag.replace("x86_64", "aarch64")
    moved = w.path.with_name(w.path.name.replace(w.platform_tag, other))
    wheel_name = next(e.name for e in inwheel.read_entries(w.path) if e.name.endswith(".dist-info/WHEEL"))
    text = next(e.data for e in inwheel.read_entries(w.path) if e.name == wheel_name).decode()
    inwheel.rewrite(w.path, moved, replace={wheel_name: text.replace(w.platform_tag, other).encode()})
    report = check([w.refreshed(moved, platform_tag=other)], native_build, config)
    assert "architecture" in report.failed_checks()
    msg = next(f.message for f in report.wheels[0].failures if f.check == "architecture")
    assert "for x86_64" in msg and other in msg and "llama_cpp/lib/" in msg


def test_elf_machine_readers():
    from build_tools.common import elf

    assert elf.platform_machine("manylinux_2_34_aarch64") == 183 and elf.platform_machine("linux_x86_64") == 62
    assert elf.platform_machine("win_amd64") is None and elf.platform_machine("macosx_11_0_arm64") is None
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00\xb7\x00"
    assert elf.machine_of(header) == 183 and elf.machine_of(b"MZ" + bytes(62)) is None and elf.machine_of(b"") is None


def test_corrupted_record(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    entries = {e.name: e.data for e in inwheel.read_entries(w.path)}
    rec_name = next(n for n in entries if n.endswith("RECORD"))
    lines = entries[rec_name].decode().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("llama_cpp/__init__.py,"))
    path, _h, size = lines[i].split(",")
    lines[i] = f"{path},sha256=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA,{int(size) + 1}"
    _raw_edit(w.path, {rec_name: ("\n".join(lines) + "\n").encode()})
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"record"}
    msgs = [f.message for f in report.wheels[0].failures]
    assert any("RECORD hash" in m for m in msgs) and any("RECORD size" in m for m in msgs)


def test_file_missing_from_record(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    _raw_edit(w.path, {})
    entries = inwheel.read_entries(w.path)
    tmp = w.path.with_suffix(".x")
    with zipfile.ZipFile(tmp, "w") as zf:
        for e in entries:
            zf.writestr(e.name, e.data)
        zf.writestr("llama_cpp/sneaky.py", "print('hi')\n")
    tmp.replace(w.path)
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"record", "unexpected-file"}
    assert any("sneaky.py is in the archive but not in RECORD" in f.message for f in report.wheels[0].failures)


def _consistent(path: Path, entries: list[inwheel.Entry], infos: dict[str, zipfile.ZipInfo] | None = None) -> None:
    """Write ``entries`` with a RECORD that matches them: what a careful attacker would do
    (bypasses the wheel writer, which refuses unsafe names)."""
    dist_info = inwheel.dist_info_dir(e.name for e in entries)
    record = f"{dist_info}/RECORD"
    body = [e for e in entries if e.name != record]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for e in body:
            zf.writestr((infos or {}).get(e.name, e.name), e.data)
        zf.writestr(record, inwheel.render_record(body, record))


def _payload_failures(report, check_name="payload"):
    return [f.message for f in report.wheels[0].failures if f.check == check_name]


def test_edited_python_file_with_consistent_record(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    entries = [replace(e, data=b"import os; os.system('echo pwned')\n" + e.data)
               if e.name == "llama_cpp/__init__.py" else e for e in inwheel.read_entries(w.path)]
    _consistent(w.path, entries)
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"payload"}, report.render()
    (msg,) = _payload_failures(report)
    assert msg.startswith("llama_cpp/__init__.py: sha256") and "changed after it was built" in msg


def test_added_module_with_consistent_record(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    entries = [*inwheel.read_entries(w.path), inwheel.Entry("llama_cpp/evil.py", b"import os\n")]
    _consistent(w.path, entries)
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"unexpected-file"}, report.render()
    (msg,) = _payload_failures(report, "unexpected-file")
    assert msg.startswith("llama_cpp/evil.py:") and "sources" in msg


def test_removed_module_with_consistent_record(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    entries = [e for e in inwheel.read_entries(w.path) if e.name != "llama_cpp/_safety/checks.py"]
    _consistent(w.path, entries)
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"payload"}, report.render()
    assert _payload_failures(report) == ["llama_cpp/_safety/checks.py is missing (the wheels stage puts it in every wheel)"]


@pytest.mark.parametrize("name", ["llama_cpp/../../x.py", "/etc/x.py", "llama_cpp/./x.py", "llama_cpp//x.py",
                                  "llama_cpp\\x.py", "llama_cpp/cafe\u0301.py"])
def test_unnormalized_entry_names(check, wheel_copy, native_build, config, name):
    w = wheel_copy[0]
    _consistent(w.path, [*inwheel.read_entries(w.path), inwheel.Entry(name, b"print('x')\n")])
    report = check([_refresh(w)], native_build, config)
    assert "name" in report.failed_checks(), report.render()
    assert report.failed_checks() <= {"name", "unexpected-file"}
    assert any(repr(name) in m for m in _payload_failures(report, "name"))


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_duplicate_and_symlink_entries(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    entries = inwheel.read_entries(w.path)
    link = zipfile.ZipInfo("llama_cpp/_safety/call_guard.py")
    link.create_system = 3
    link.external_attr = (0o120777) << 16  # a symlink entry
    _consistent(w.path, entries, {"llama_cpp/_safety/call_guard.py": link})
    with zipfile.ZipFile(w.path, "a") as zf:
        zf.writestr("llama_cpp/llama.py", b"print('second copy')\n")
    report = check([_refresh(w)], native_build, config)
    msgs = _payload_failures(report, "name")
    assert any("llama_cpp/llama.py appears twice" in m for m in msgs), report.render()
    assert any("llama_cpp/_safety/call_guard.py is not a regular file" in m for m in msgs), report.render()


def test_unexpected_files(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    inwheel.rewrite(w.path, w.path, replace={"llama_cpp/tests/test_x.py": b"", "vendor/llama.cpp/CMakeLists.txt": b"",
                                             "llama_cpp/_native.cpython-312.pyc": b""})
    report = check([_refresh(w)], native_build, config)
    assert report.failed_checks() == {"unexpected-file"}
    assert len(report.wheels[0].failures) == 3


def test_size_budget(check, built, native_build, config):
    tight = replace(config, wheel_size_budget_mb=1.0)
    report = check(built.wheels[:1], native_build, tight)
    assert report.failed_checks() == {"size-budget"}
    assert "budget of 1 MB" in report.wheels[0].failures[0].message


def test_twine_rejects_broken_metadata(check, wheel_copy, native_build, config):
    w = wheel_copy[0]
    meta_name = next(e.name for e in inwheel.read_entries(w.path) if e.name.endswith("METADATA"))
    meta = next(e.data for e in inwheel.read_entries(w.path) if e.name == meta_name).decode()
    head, _body = meta.split("\n\n", 1)
    head = head.replace("Description-Content-Type: text/markdown", "Description-Content-Type: text/x-rst")
    broken = head + "\n\n" + "Title\n===\n\n.. image::\n\n`unclosed\n"
    inwheel.rewrite(w.path, w.path, replace={meta_name: broken.encode()})
    report = check([_refresh(w)], native_build, config, twine=True)
    assert report.failed_checks() == {"metadata", "payload"}, report.render()


@pytest.fixture
def cuda_wheel(tmp_path, repo):
    cfg = load_matrix().get("cuda-13.0")
    nb = fake_native(tmp_path, cfg)
    (w,) = wheels.build_wheels(nb, cfg, wheels.WheelOptions(out_dir=tmp_path / "out", python_tags=("cp312",),
                                                            repo=repo))
    return cfg, nb, w


def test_cuda_wheel_passes_with_its_runtime_dependencies(check, cuda_wheel):
    cfg, nb, w = cuda_wheel
    report = check([w], nb, cfg)
    assert report.ok, report.render()


def test_cuda_wheel_missing_runtime_dependency(check, cuda_wheel):
    cfg, nb, w = cuda_wheel
    meta_name = next(e.name for e in inwheel.read_entries(w.path) if e.name.endswith("METADATA"))
    meta = next(e.data for e in inwheel.read_entries(w.path) if e.name == meta_name).decode()
    dropped = cfg.cuda.runtime_requires[1]
    inwheel.rewrite(w.path, w.path, replace={meta_name: meta.replace(f"Requires-Dist: {dropped}\n", "").encode()})
    report = check([_refresh(w)], nb, cfg)
    assert report.failed_checks() == {"cuda-runtime", "payload"}
    assert any(dropped in f.message for f in report.wheels[0].failures if f.check == "cuda-runtime")


def test_cuda_wheel_carrying_the_driver(check, cuda_wheel):
    cfg, nb, w = cuda_wheel
    inwheel.rewrite(w.path, w.path, replace={"llama_cpp/lib/libcuda.so.1": b"\x7fELF fake driver"})
    report = check([_refresh(w)], nb, cfg)
    assert "driver-library" in report.failed_checks()
    assert report.failed_checks() <= {"driver-library", "unexpected-file"}


def test_missing_file_is_reported_not_raised(check, built, native_build, config, tmp_path):
    gone = replace(built.wheels[0], path=tmp_path / built.wheels[0].path.name)
    report = check([gone], native_build, config)
    assert report.failed_checks() == {"archive"}


def test_cpu_variants_checked_for_an_all_variants_build(check, built, native_build, config):
    assert "cpu-variants" not in check(built.wheels, native_build, config).failed_checks()  # one CPU backend
    m = native_build.manifest
    claimed = replace(m, cmake={**m.cmake, "configure": [*m.cmake["configure"], "-DGGML_CPU_ALL_VARIANTS=ON"]})
    report = check(built.wheels, replace(native_build, manifest=claimed), config)
    assert all("cpu-variants" in {f.check for f in w.failures} for w in report.wheels)
    messages = [f.message for f in report.wheels[0].failures if f.check == "cpu-variants"]
    assert any("CPU variant haswell is missing" in msg for msg in messages), messages

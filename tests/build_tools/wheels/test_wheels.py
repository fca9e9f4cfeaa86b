"""Wheel assembly: one wheel per CPython tag, reproducible, repaired by retagging only."""

from __future__ import annotations

import hashlib
import json
import stat
import zipfile
from dataclasses import replace

import pytest

from build_tools.common.hashing import sha256_file
from build_tools.stages import wheels as stage_wheels
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import inwheel


def test_one_wheel_per_cpython_tag(built, config, native_build, repo):
    tags = sorted(w.python_tag for w in built.wheels)
    assert tags == list(wheels.PYTHON_TAGS)
    version = wheels.read_project(repo).version
    for w in built.wheels:
        assert w.abi_tag == w.python_tag
        assert w.path.name == f"llama_cpp_python-{version}-{w.python_tag}-{w.python_tag}-{w.platform_tag}.whl"
        assert w.native_key == native_build.key and w.sha256 == sha256_file(w.path)


def test_every_found_interpreter_has_a_wheel(built):
    from build_tools.common import interpreters

    tags = {w.python_tag for w in built.wheels}
    for interp in interpreters.find_all():
        if interp.found:
            assert interp.tag in tags


def test_auditwheel_chose_a_manylinux_tag_and_kept_the_libraries(built, native_build):
    assert built.platform_tag and built.platform_tag.startswith("manylinux_")
    for w in built.wheels:
        assert w.repaired and w.platform_tag == built.platform_tag
        with zipfile.ZipFile(w.path) as zf:
            for lib in native_build.manifest.libraries:
                assert hashlib.sha256(zf.read(f"llama_cpp/lib/{lib.name}")).hexdigest() == lib.sha256
            wheel_file = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
        assert f"Tag: {w.tag}" in wheel_file


def test_layout_permissions_and_timestamps(built, native_build):
    w = built.wheels[0]
    with zipfile.ZipFile(w.path) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        dist_info = inwheel.dist_info_dir(names)
        assert names[-1] == f"{dist_info}/RECORD"
        body = [n for n in names if not n.startswith(dist_info)]
        assert body == sorted(body)
        for i in infos:
            mode = (i.external_attr >> 16) & 0o7777
            assert stat.S_ISREG(i.external_attr >> 16) and i.date_time == (1980, 1, 1, 0, 0, 0)
            assert mode == (0o755 if i.filename.startswith("llama_cpp/lib/") else 0o644), i.filename
            assert i.compress_type == zipfile.ZIP_DEFLATED
        assert json.loads(zf.read("llama_cpp/native-manifest.json")) == native_build.manifest.to_json()
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        meta = zf.read(f"{dist_info}/METADATA").decode()
        assert "Name: llama-cpp-python" in meta and "Requires-Dist: numpy" in meta
        assert "Requires-Python: >=3.10" in meta
        # pip install 'llama-cpp-python[server]' pulls the server's libraries, and only then
        assert "Provides-Extra: server" in meta and 'Requires-Dist: fastapi>=0.110; extra == "server"' in meta
        from packaging.metadata import Metadata
        parsed = Metadata.from_email(meta.encode(), validate=True)
        assert "server" in {str(e) for e in parsed.provides_extra}
        assert not [r for r in parsed.requires_dist if r.name == "fastapi" and r.marker.evaluate({"extra": ""})]
        sbom = json.loads(zf.read(f"{dist_info}/sboms/llama-cpp-python.cdx.json"))
    assert sbom["bomFormat"] == "CycloneDX" and sbom["metadata"]["component"]["name"] == "llama-cpp-python"
    comps = {c["name"]: c for c in sbom["components"]}
    assert comps["llama.cpp"]["externalReferences"][0]["comment"].endswith(native_build.manifest.source["commit"])
    for lib in native_build.manifest.libraries:
        assert comps[f"llama_cpp/lib/{lib.name}"]["hashes"][0]["content"] == lib.sha256
    assert comps["libc.so.6"]["scope"] == "excluded"


def test_rebuild_is_byte_identical(native_build, config, repo, tmp_path):
    a = wheels.build_wheels(native_build, config, wheels.WheelOptions(out_dir=tmp_path / "a", repo=repo))
    b = wheels.build_wheels(native_build, config, wheels.WheelOptions(out_dir=tmp_path / "b", repo=repo))
    assert [(w.path.name, w.sha256) for w in a] == [(w.path.name, w.sha256) for w in b]
    assert a[0].path.read_bytes() == b[0].path.read_bytes()
    other = wheels.build_wheels(native_build, config, wheels.WheelOptions(
        out_dir=tmp_path / "c", python_tags=("cp312",), epoch=1700000000, repo=repo))
    assert other[0].sha256 != next(w for w in a if w.python_tag == "cp312").sha256  # the timestamp is in it


def test_repaired_rebuild_is_byte_identical(built, native_build, config, repo, tmp_path):
    """A release run from scratch reproduces the repaired wheels of the session fixture exactly."""
    res = stage_wheels.run(native_build, config, wheels.WheelOptions(out_dir=tmp_path / config.name, repo=repo),
                              force=True)
    assert [(w.path.name, w.sha256) for w in res.wheels] == [(w.path.name, w.sha256) for w in built.wheels]


def test_single_py3_wheel(native_build, config, tmp_path):
    (w,) = wheels.build_wheels(native_build, config, wheels.WheelOptions(out_dir=tmp_path, single=True))
    assert w.path.name.endswith(f"-py3-none-{wheels.default_platform_tag()}.whl")


def test_wheels_are_reused_by_content_key(built, native_build, config, repo):
    out = built.wheels[0].path.parent
    res = stage_wheels.run(native_build, config, wheels.WheelOptions(out_dir=out, repo=repo))
    assert res.reused and [w.sha256 for w in res.wheels] == [w.sha256 for w in built.wheels]


def test_cuda_config_gets_local_version_and_runtime_requirements(tmp_path):
    from build_tools.inputs.configs import load_matrix

    from ..conftest import fake_native

    cfg = load_matrix().get("cuda-13.0")
    nb = fake_native(tmp_path, cfg)
    (w,) = wheels.build_wheels(nb, cfg, wheels.WheelOptions(out_dir=tmp_path / "out", python_tags=("cp312",)))
    assert w.version.endswith("+cu130") and "+cu130-cp312-cp312-" in w.path.name
    with zipfile.ZipFile(w.path) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
        sbom = json.loads(zf.read(next(n for n in zf.namelist() if n.endswith(".cdx.json"))))
    for req in cfg.cuda.runtime_requires:
        assert f"Requires-Dist: {req}" in meta
    excluded = {c["name"] for c in sbom["components"] if c.get("scope") == "excluded"}
    assert {"libcuda.so.1", "libcudart.so.13"} <= excluded


def test_bad_inputs_are_clear_errors(native_build, config, tmp_path):
    with pytest.raises(wheels.WheelBuildError, match="python tag"):
        wheels.build_wheels(native_build, config, wheels.WheelOptions(out_dir=tmp_path, python_tags=("py39",)))
    other = replace(config, name="not-this-one")
    with pytest.raises(wheels.WheelBuildError, match="native build is for"):
        wheels.build_wheels(native_build, other, wheels.WheelOptions(out_dir=tmp_path))
    with pytest.raises(inwheel.WheelError, match="SOURCE_DATE_EPOCH"):
        inwheel.source_date_epoch("yesterday")


def test_inwheel_edits_rewrite_record(built, tmp_path):
    src = built.wheels[0].path
    out = tmp_path / src.name
    with inwheel.InWheel(src, out) as wh:
        (wh.root / "llama_cpp" / "extra.py").write_text("X = 1\n")
    names = {e.name: e for e in inwheel.read_entries(out)}
    record = inwheel.parse_record(names[f"{inwheel.dist_info_dir(names)}/RECORD"].data.decode())
    assert ("llama_cpp/extra.py", inwheel.record_hash(b"X = 1\n"), "6") in record

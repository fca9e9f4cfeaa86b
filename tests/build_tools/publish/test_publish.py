"""publish: only cleared files, a PEP 503 index, atomic replacement; pip installs from it over HTTP."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from build_tools import dist
from build_tools.common.interpreters import Interpreter
from build_tools.stages import publish, smoke, validate
from build_tools.stages.smoke import runner
from build_tools.stages.wheels import build as wheels


def _stray_name(filename: str) -> str:
    """Another version of the same wheel: ``X-<version>-...`` becomes ``X-<version>.post9-...``."""
    name, version, rest = filename.split("-", 2)
    return f"{name}-{version}.post9-{rest}"


def _passing_smoke(ws) -> smoke.SmokeReport:
    """A smoke report in which every wheel passed (publish's gate input; smoke itself is tested elsewhere)."""
    return smoke.SmokeReport([smoke.SmokeResult(w.filename, w.sha256, "3.x", "pass") for w in ws],
                             [Interpreter("3.x")])


@pytest.fixture
def cleared(built, native_build, config, repo, tmp_path):
    """A dist folder with the release wheels and a release manifest that clears them."""
    d = tmp_path / "dist" / config.name
    d.mkdir(parents=True)
    ws = []
    for w in built.wheels:
        shutil.copyfile(w.path, d / w.path.name)
        ws.append(replace(w, path=d / w.path.name))
    report = validate.validate(ws, native_build.manifest, config, version=wheels.expected_version(config),
                               python_tags=wheels.PYTHON_TAGS, twine=False, repo=repo)
    passing = _passing_smoke(ws)
    validate.save_report(report, d)
    smoke.save_report(passing, d)
    dist.clear(dist.DistDir(d), config=config, wheels=ws, validation=report, smoke=passing,
               native=native_build.manifest, strict=False)
    return d, ws


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_index_layout(cleared, config, tmp_path):
    d, ws = cleared
    index = publish.run([dist.DistDir(d)], tmp_path / "index")
    vdir = tmp_path / "index" / "whl" / config.variant
    page = (vdir / "llama-cpp-python" / "index.html").read_text()
    for w in ws:
        assert f'href="{w.filename}#sha256={w.sha256}"' in page
        assert (vdir / "llama-cpp-python" / w.filename).read_bytes() == w.path.read_bytes()
    assert 'data-requires-python="&gt;=3.10"' in page
    assert '<a href="llama-cpp-python/">llama-cpp-python</a>' in (vdir / "index.html").read_text()
    sums = (vdir / "SHA256SUMS").read_text().splitlines()
    assert sorted(sums) == sorted(f"{w.sha256}  {w.filename}" for w in ws)
    rel = json.loads((vdir / "release-manifest.json").read_text())
    assert {f["sha256"] for f in rel["files"]} == {w.sha256 for w in ws}
    assert rel["releases"][0]["gates"]["validate"] == "passed"
    assert index.variants() == [config.variant] and len(index.new) == len(ws)
    assert not [p for p in (tmp_path / "index").iterdir() if p.name.startswith(".")]


def test_refuses_without_release_manifest(built, tmp_path):
    d = tmp_path / "dist"
    d.mkdir()
    shutil.copyfile(built.wheels[0].path, d / built.wheels[0].filename)
    with pytest.raises(publish.PublishError, match="not passed validate and smoke"):
        publish.run([dist.DistDir(d)], tmp_path / "index")


def test_refuses_a_file_changed_after_validation(cleared, tmp_path):
    d, ws = cleared
    data = bytearray(ws[1].path.read_bytes())
    data[-100] ^= 0xFF
    ws[1].path.write_bytes(bytes(data))
    with pytest.raises(publish.PublishError, match=f"refusing {ws[1].filename}"):
        publish.run([dist.DistDir(d)], tmp_path / "index")
    assert not (tmp_path / "index" / "whl").exists()


def test_unlisted_wheels_are_not_published(cleared, tmp_path):
    d, ws = cleared
    assert ws
    stray = d / _stray_name(ws[0].filename)
    shutil.copyfile(ws[0].path, stray)
    index = publish.run([dist.DistDir(d)], tmp_path / "index")
    assert stray.name not in {f.filename for f in index.files}


def test_clearance_needs_both_gates(built, native_build, config, repo, tmp_path):
    ws = built.wheels
    good = validate.validate(ws, native_build.manifest, config, version=wheels.expected_version(config),
                             python_tags=wheels.PYTHON_TAGS, twine=False, repo=repo)
    bad_validation = validate.ValidationReport(config.name, "x", "y", [validate.WheelReport("a", "b", 1)])
    bad_validation.wheels[0].fail("record", "broken")
    with pytest.raises(publish.PublishError, match="validation"):
        dist.clear(dist.DistDir(tmp_path), config=config, wheels=ws, validation=bad_validation,
                               smoke=_passing_smoke(ws), native=native_build.manifest, strict=False)
    failing = _passing_smoke(ws)
    failing.results[0].status = "fail"
    with pytest.raises(publish.PublishError, match="smoke"):
        dist.clear(dist.DistDir(tmp_path), config=config, wheels=ws, validation=good, smoke=failing,
                               native=native_build.manifest, strict=False)
    skipped = _passing_smoke(ws)
    skipped.results[0].status = "skip"
    with pytest.raises(publish.PublishError, match="smoke"):
        dist.clear(dist.DistDir(tmp_path), config=config, wheels=ws, validation=good, smoke=skipped,
                               native=native_build.manifest, strict=True)
    assert not (tmp_path / dist.CLEARANCE_FILE).exists()


def test_failure_half_way_leaves_the_previous_index(cleared, tmp_path, monkeypatch):
    d, _ws = cleared
    out = tmp_path / "index"
    publish.run([dist.DistDir(d)], out)
    before = _tree(out)
    real_place = publish._place
    calls = []

    def flaky(src: Path, dst: Path) -> None:
        calls.append(dst)
        if len(calls) == 3:
            raise OSError("disk full (injected)")
        real_place(src, dst)

    monkeypatch.setattr(publish, "_place", flaky)
    with pytest.raises(OSError, match="injected"):
        publish.run([dist.DistDir(d)], out)
    assert len(calls) == 3
    assert _tree(out) == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_earlier_files_are_carried_over(cleared, tmp_path):
    d, ws = cleared
    out = tmp_path / "index"
    publish.run([dist.DistDir(d)], out)
    vdir = out / "whl" / ws[0].variant / "llama-cpp-python"
    old = "llama_cpp_python-0.3.0-cp312-cp312-manylinux_2_34_x86_64.whl"
    shutil.copyfile(ws[0].path, vdir / old)
    sums = vdir.parent / "SHA256SUMS"
    sums.write_text(sums.read_text() + f"{ws[0].sha256}  {old}\n")
    manifest = vdir.parent / "release-manifest.json"
    _edit_json(manifest, lambda m: m["files"].append({"filename": old, "sha256": ws[0].sha256,
                                                      "requires_python": ">=3.10"}))
    page = vdir / "index.html"
    page.write_text(page.read_text().replace("  </body>", f'    <a href="{old}#sha256={ws[0].sha256}">{old}</a><br/>\n'
                                                           "  </body>"))
    publish.run([dist.DistDir(d)], out)
    assert old in (vdir / "index.html").read_text() and (vdir / old).is_file()
    (vdir / old).write_bytes(b"damaged")
    with pytest.raises(publish.PublishError, match="was edited"):
        publish.run([dist.DistDir(d)], out)


@pytest.fixture
def served(tmp_path):
    """Serve a directory on 127.0.0.1 (a thread; stopped at teardown)."""
    servers = []

    def serve(root: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield serve
    for s in servers:
        s.shutdown()
        s.server_close()


def test_pip_installs_from_the_served_index(cleared, tmp_path, served, smoke_interpreter):
    d, ws = cleared
    out = tmp_path / "index"
    publish.run([dist.DistDir(d)], out)
    base = served(out)
    variant = ws[0].variant
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_CPP_", "PIP_", "PYTHON"))}
    subprocess.run([str(smoke_interpreter.path), "-m", "venv", str(venv)], check=True, timeout=180, env=env)
    py = venv / "bin" / "python"
    wheel = next(w for w in ws if w.python_tag == smoke_interpreter.tag)
    deps = runner.dependency_wheelhouse(py, smoke_interpreter, runner.requires_dist(wheel.path), timeout=300)
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--index-url",
         f"{base}/whl/{variant}/", "--find-links", str(deps), "llama-cpp-python"],
        capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = ("import llama_cpp, pathlib, json; p = pathlib.Path(llama_cpp.__file__).parent; "
             "print(json.dumps([llama_cpp.__version__, str(p), sorted(x.name for x in (p / 'lib').iterdir())]))")
    proc = subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    version, pkg, libs = json.loads(proc.stdout)
    assert version == ws[0].version.split("+")[0] and pkg.startswith(str(venv))
    assert libs == sorted(lib.name for lib in __import__("build_tools.stages.native.manifest").stages.native.manifest.load_manifest(
        Path(pkg) / "native-manifest.json").libraries)
    import llama_cpp

    if not hasattr(llama_cpp, "LlamaEmbedding"):
        pytest.skip("llama_cpp.LlamaEmbedding does not exist yet: the embedding part needs the runtime")
    models = smoke.fixture_models()
    if models.embedding is None:
        pytest.skip(f"no embedding fixture model: {models.reason}")
    code = ("import sys, numpy as np, llama_cpp; e = llama_cpp.LlamaEmbedding(sys.argv[1]).embed(['a', 'b']); "
            "a = np.asarray(e); assert a.dtype == np.float32 and a.shape[0] == 2 and np.isfinite(a).all(); "
            "print(a.shape)")
    proc = subprocess.run([str(py), "-I", "-c", code, str(models.embedding)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _refused(d: Path, out: Path, match: str) -> None:
    with pytest.raises(publish.PublishError, match=match):
        publish.run([dist.DistDir(d)], out)
    assert not (out / "whl").exists()
    assert not [p for p in out.parent.rglob("*") if p.name in ("index.html", "SHA256SUMS") and out not in p.parents]


@pytest.mark.parametrize("variant", ["..", "../../escaped", "cpu/../../x", "/abs", "", "CPU", ".hidden"])
def test_refuses_a_variant_that_is_not_one_folder(cleared, tmp_path, variant):
    d, _ws = cleared
    _edit_json(d / dist.CLEARANCE_FILE, lambda c: c.__setitem__("variant", variant))
    _refused(d, tmp_path / "out" / "index", r"clearance.json: variant")


@pytest.mark.parametrize("filename", ["../outside.whl", "../../etc/x-1-py3-none-any.whl",
                                      "sub/llama_cpp_python-0.4.0-py3-none-any.whl", "/tmp/x-1-py3-none-any.whl",
                                      "not-a-wheel.txt", "..whl"])
def test_refuses_a_filename_that_is_not_a_plain_wheel_name(cleared, tmp_path, filename):
    d, _ws = cleared
    outside = d.parent / "outside.whl"
    outside.write_bytes(b"not from the build")
    _edit_json(d / dist.CLEARANCE_FILE, lambda c: c["wheels"][0].__setitem__("filename", filename))
    _refused(d, tmp_path / "out" / "index", r"wheels\[0\]\.filename")


def test_refuses_a_cleared_name_that_is_a_link_to_a_file_outside_dist(cleared, tmp_path):
    d, ws = cleared
    outside = tmp_path / "elsewhere.whl"
    shutil.move(ws[0].path, outside)  # same bytes, same sha256: only the link gives it away
    ws[0].path.symlink_to(outside)
    _refused(d, tmp_path / "index", f"refusing {ws[0].filename}: it is a link")


@pytest.mark.parametrize(("edit", "match"), [
    (lambda c: c.__setitem__("wheels", {"a": 1}), r"wheels must be list, got dict"),
    (lambda c: c["wheels"][0].__setitem__("size", "12"), r"wheels\[0\]\.size must be int, got str"),
    (lambda c: c["wheels"][0].__setitem__("size", True), r"wheels\[0\]\.size must be int, got bool"),
    (lambda c: c["wheels"][0].__setitem__("sha256", 5), r"wheels\[0\]\.sha256 5 is not a sha256"),
    (lambda c: c["wheels"][0].__setitem__("requires_python", [">=3.10"]), r"requires_python must be a string"),
    (lambda c: c["wheels"].__setitem__(0, "x.whl"), r"wheels\[0\] must be an object, got str"),
    (lambda c: c.__setitem__("release", "yes"), r"release must be bool, got str"),
    (lambda c: c.__setitem__("variant", 7), r"variant must be str, got int"),
    (lambda c: c.__setitem__("project", "other"), r"project must be 'llama-cpp-python'"),
    (lambda c: c["wheels"].append(dict(c["wheels"][0])), r"lists a filename twice"),
])
def test_refuses_a_clearance_with_wrong_types(cleared, tmp_path, edit, match):
    d, _ws = cleared
    _edit_json(d / dist.CLEARANCE_FILE, edit)
    _refused(d, tmp_path / "index", match)


def test_refuses_a_json_document_that_is_not_an_object(cleared, tmp_path):
    d, _ws = cleared
    (d / dist.CLEARANCE_FILE).write_text("[1, 2]")
    _refused(d, tmp_path / "index", "must be a JSON object")


def _forge_stray(d: Path, ws) -> tuple[str, str]:
    """Add a file that never passed validation to the clearance, with its true sha256 and size."""
    stray = _stray_name(ws[0].filename)
    (d / stray).write_bytes(ws[0].path.read_bytes()[:-1] + b"!")
    digest = hashlib.sha256((d / stray).read_bytes()).hexdigest()

    def add(c):
        entry = dict(c["wheels"][0], filename=stray, sha256=digest)
        c["wheels"].append(entry)
    _edit_json(d / dist.CLEARANCE_FILE, add)
    return stray, digest


def test_a_forged_clearance_is_not_backed_by_validation(cleared, tmp_path):
    d, ws = cleared
    stray, _digest = _forge_stray(d, ws)
    _refused(d, tmp_path / "index", f"refusing {stray}: validation.json has no passing entry")


def test_a_forged_clearance_and_validation_are_not_backed_by_smoke(cleared, tmp_path):
    d, ws = cleared
    stray, digest = _forge_stray(d, ws)
    _edit_json(d / "validation.json", lambda v: v["wheels"].append(
        {"filename": stray, "sha256": digest, "size": 1, "failures": []}))
    _refused(d, tmp_path / "index", f"refusing {stray}: smoke.json gives it 'fail'")


def test_refuses_without_reports(cleared, tmp_path):
    d, _ws = cleared
    (d / "smoke.json").unlink()
    _refused(d, tmp_path / "index", "smoke.json is missing")
    (d / "validation.json").unlink()
    _refused(d, tmp_path / "index", "validation.json is missing")


def test_refuses_a_clearance_of_another_build(cleared, tmp_path):
    d, _ws = cleared
    _edit_json(d / dist.CLEARANCE_FILE, lambda c: c.__setitem__("native_key", "0" * 16))
    _refused(d, tmp_path / "index", "native_key .* disagrees with validation.json")


@pytest.mark.parametrize("line", ["{sha}  ../../escaped-1.0-py3-none-any.whl", "{sha}  sub/x-1.0-py3-none-any.whl",
                                  "nothex  llama_cpp_python-0.3.0-cp312-cp312-manylinux_2_34_x86_64.whl"])
def test_refuses_an_existing_index_with_unsafe_names(cleared, tmp_path, line):
    d, ws = cleared
    out = tmp_path / "index"
    publish.run([dist.DistDir(d)], out)
    before = _tree(out)
    sums = out / "whl" / ws[0].variant / "SHA256SUMS"
    sums.write_text(sums.read_text() + line.format(sha=ws[0].sha256) + "\n")
    with pytest.raises(publish.PublishError, match=r"SHA256SUMS, line \d+"):
        publish.run([dist.DistDir(d)], out)
    before[sums.relative_to(out).as_posix()] = hashlib.sha256(sums.read_bytes()).hexdigest()
    assert _tree(out) == before


def test_refuses_an_existing_index_with_a_foreign_folder_or_bad_manifest(cleared, tmp_path):
    d, ws = cleared
    out = tmp_path / "index"
    publish.run([dist.DistDir(d)], out)
    (out / "whl" / "..evil").mkdir()
    with pytest.raises(publish.PublishError, match="'..evil', which is not a variant folder"):
        publish.run([dist.DistDir(d)], out)
    (out / "whl" / "..evil").rmdir()
    _edit_json(out / "whl" / ws[0].variant / "release-manifest.json",
               lambda m: m["files"][0].__setitem__("filename", "../x.whl"))
    with pytest.raises(publish.PublishError, match=r"release-manifest.json: files\[0\]\.filename"):
        publish.run([dist.DistDir(d)], out)

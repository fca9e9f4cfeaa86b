"""smoke: real venvs (one interpreter by default; all found ones with LLAMA_CPP_SMOKE_ALL=1)."""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path

import pytest

from build_tools.common import interpreters
from build_tools.common.interpreters import Interpreter
from build_tools.errors import SmokeInputError
from build_tools.stages import smoke
from build_tools.stages.smoke import bundle, runner

ALL = os.environ.get("LLAMA_CPP_SMOKE_ALL", "").lower() in ("1", "true", "yes")


def _mtp_ready() -> str | None:
    import llama_cpp

    try:
        params = inspect.signature(llama_cpp.Llama.__init__).parameters
        llama_cpp.SpecConfig, llama_cpp.SpeculativeType  # noqa: B018
    except (AttributeError, ImportError) as exc:
        return f"the MTP runtime API is missing ({exc})"
    if "speculative" not in params:
        return "Llama(speculative=...) is not implemented yet"
    return None


@pytest.fixture(scope="module")
def models():
    return smoke.fixture_models()


def test_wheel_in_a_fresh_venv(built, smoke_interpreter, models):
    interps = [i for i in interpreters.find_all() if i.found] if ALL else [smoke_interpreter]
    ws = [w for w in built.wheels if any(smoke.compatible(w, i) for i in interps)]
    report = smoke.run(ws, interps, models, use_cache=False)
    table = report.render()
    assert len(report.results) == len(ws) and report.results, table
    for r in report.results:
        for stage in ("import", "libraries", "embedding"):
            assert r.stages[stage]["status"] == "pass", f"{stage}: {r.stages[stage]}\n{table}"
        assert "llama_cpp/lib" in r.stages["libraries"]["detail"]
    why = _mtp_ready()
    if why:
        pytest.skip(f"MTP stage not checked: {why}")
    assert report.ok, table


def test_missing_interpreter_is_a_skip_or_with_strict_an_error(built):
    missing = Interpreter("3.14", None, None, "not installed")
    w = next(w for w in built.wheels if w.python_tag == "cp314")
    report = smoke.run([w], [missing], smoke.SmokeModels())
    assert [r.status for r in report.results] == ["skip"] and not report.ok
    assert "not installed" in report.render()
    strict = smoke.run([w], [missing], smoke.SmokeModels(), strict=True)
    assert strict.verdict(w.filename) == "skip" and not strict.ok
    with pytest.raises(interpreters.InterpreterError, match="Python 3.99"):
        interpreters.find_all(("3.99",), strict=True)


def test_tampered_wheel_file_fails_before_install(built, smoke_interpreter, tmp_path):
    import dataclasses
    import shutil

    w = next(w for w in built.wheels if w.python_tag == smoke_interpreter.tag)
    copy = tmp_path / w.filename
    shutil.copyfile(w.path, copy)
    copy.write_bytes(copy.read_bytes()[:-10] + b"0123456789")
    r = runner.run_cell(dataclasses.replace(w, path=copy), smoke_interpreter, smoke.SmokeModels(), stages=["import"])
    assert r.status == "fail" and "changed since it was built" in r.reason


def test_unknown_stage_is_refused(built):
    with pytest.raises(SmokeInputError, match="unknown smoke stage"):
        smoke.run(built.wheels, [], smoke.SmokeModels(), stages=["import", "bogus"])


def test_interpreters_from_explicit_paths(monkeypatch, smoke_interpreter, tmp_path):
    # The real executable: a pyenv shim found on PATH would not run once PATH is emptied.
    real = Path(subprocess.run([str(smoke_interpreter.path), "-c", "import sys; print(sys.executable)"],
                               capture_output=True, text=True, check=True).stdout.strip())
    monkeypatch.setenv(interpreters.ENV, str(real))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    found = interpreters.find(smoke_interpreter.version)
    assert found.path == real and found.full_version.startswith(smoke_interpreter.version)
    other = "3.10" if smoke_interpreter.version != "3.10" else "3.11"
    monkeypatch.setattr(interpreters, "candidates", lambda v: iter([real]))
    assert not interpreters.find(other).found


def test_gpu_bundle_runs_on_the_cpu(built, smoke_interpreter, models, tmp_path, monkeypatch):
    """The GPU machine path end to end, with ``--allow-cpu``: prepare a bundle of a cpu-host wheel, run its run.sh."""
    import json
    import shutil
    import subprocess

    w = next(w for w in built.wheels if w.python_tag == smoke_interpreter.tag)
    deps = runner.dependency_wheelhouse(smoke_interpreter.path, smoke_interpreter, runner.requires_dist(w.path),
                                        timeout=300)

    def offline_download(reqs, dest, python, platforms):  # the smoke cache already holds them
        for dep in deps.glob("*.whl"):
            shutil.copyfile(dep, dest / dep.name)

    monkeypatch.setattr(bundle, "_pip_download", offline_download)
    out = tmp_path / "bundle"
    meta = bundle.prepare_bundle(out, [w.path], config="cpu-host", pythons=[smoke_interpreter.version])
    assert meta["wheels"] == {smoke_interpreter.version: w.filename}
    assert set(meta["models"]) == {"generation", "embedding", "mtp"}
    # No repository and no site-packages on the path: what a GPU machine has.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = tmp_path / "report.json"
    proc = subprocess.run(["sh", str(out / "run.sh"), "--allow-cpu", "--python", str(smoke_interpreter.path),
                           "--out", str(result)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env, check=False)
    assert result.is_file(), proc.stdout + proc.stderr
    stages = json.loads(result.read_text())["stages"]
    assert list(stages) == ["import", "libraries", "chat", "backends", "generation", "embedding", "mtp"]
    for name in ("import", "libraries", "chat", "backends", "generation", "embedding"):
        assert stages[name]["status"] == "pass", f"{name}: {stages[name]}\n{proc.stdout}"
    assert "allowed by --allow-cpu" in stages["backends"]["detail"]
    why = _mtp_ready()
    if why:
        pytest.skip(f"MTP stage not checked: {why}")
    assert proc.returncode == 0, proc.stdout + proc.stderr

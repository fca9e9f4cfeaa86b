"""smoke: real venvs (one interpreter by default; all found ones with LLAMA_CPP_SMOKE_ALL=1)."""

from __future__ import annotations

import inspect
import os

import pytest

from build_tools import interpreters, smoke
from build_tools.interpreters import Interpreter

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
    report = smoke.smoke(ws, interps, models, use_cache=False)
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
    report = smoke.smoke([w], [missing], smoke.SmokeModels())
    assert [r.status for r in report.results] == ["skip"] and not report.ok
    assert "not installed" in report.render()
    strict = smoke.smoke([w], [missing], smoke.SmokeModels(), strict=True)
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
    r = smoke.run_cell(dataclasses.replace(w, path=copy), smoke_interpreter, smoke.SmokeModels(), stages=["import"])
    assert r.status == "fail" and "changed since it was built" in r.reason


def test_unknown_stage_is_refused(built):
    with pytest.raises(smoke.SmokeError, match="unknown smoke stage"):
        smoke.smoke(built.wheels, [], smoke.SmokeModels(), stages=["import", "bogus"])


def test_interpreters_from_explicit_paths(monkeypatch, smoke_interpreter, tmp_path):
    monkeypatch.setenv(interpreters.ENV, str(smoke_interpreter.path))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    found = interpreters.find(smoke_interpreter.version)
    assert found.path == smoke_interpreter.path and found.full_version.startswith(smoke_interpreter.version)
    other = "3.10" if smoke_interpreter.version != "3.10" else "3.11"
    monkeypatch.setattr(interpreters, "candidates", lambda v: iter([smoke_interpreter.path]))
    assert not interpreters.find(other).found

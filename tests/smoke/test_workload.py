"""The workload's stage registry and numeric comparisons (no venv, no wheel)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import numpy as np
import pytest

from build_tools.stages.smoke import STAGES, workload
from build_tools.stages.smoke.workload import Context, Stage, compare_logits, greedy_agrees, offloaded, run_stages


def test_stage_lists_come_from_the_registry():
    assert STAGES == workload.RELEASE_STAGES == ("import", "libraries", "embedding", "mtp")
    assert set(workload.RELEASE_STAGES) | set(workload.GPU_STAGES) == set(workload.REGISTRY)
    assert [n for n, s in workload.REGISTRY.items() if s.gate] == ["import", "backends"]


def test_workload_imports_only_the_standard_library():
    tree = ast.parse(Path(workload.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"llama_cpp", "numpy", "__future__"} <= set(__import__("sys").stdlib_module_names)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def _ctx(**kw) -> Context:
    args = {"version": "", "require_gpu": False, "allow_cpu": False, **{f"{r}_model": "" for r in workload.MODEL_ROLES}}
    return Context(argparse.Namespace(**{**args, **kw}))


def test_failed_gate_stops_the_later_stages(monkeypatch):
    calls = []

    def ok(ctx):
        calls.append("ok")
        return "fine"

    def boom(ctx):
        raise AssertionError("no device")

    monkeypatch.setattr(workload, "REGISTRY", {"a": Stage(ok), "b": Stage(boom), "g": Stage(boom, gate=True),
                                               "c": Stage(ok)})
    res = run_stages(["a", "b", "c"], _ctx())
    assert [r["status"] for r in res.values()] == ["pass", "fail", "pass"] and res["b"]["detail"] == "no device"
    res = run_stages(["a", "g", "c"], _ctx())
    assert res["c"] == {"status": "fail", "detail": "not run: g failed", "seconds": 0.0}
    assert calls == ["ok", "ok", "ok"]


def test_an_unexpected_exception_is_a_result_with_its_type(monkeypatch):
    def broken(ctx):
        raise KeyError("x")

    monkeypatch.setattr(workload, "REGISTRY", {"x": Stage(broken)})
    (res,) = run_stages(["x"], _ctx()).values()
    assert res["status"] == "fail" and res["detail"] == "KeyError: 'x'" and "Traceback" in res["traceback"]


def test_a_stage_without_its_model_fails_naming_the_option():
    with pytest.raises(AssertionError, match="no --mtp-model given"):
        _ctx().model("mtp")
    assert _ctx(embedding_model="/m.gguf").model("embedding") == "/m.gguf"


def test_main_refuses_unknown_stages(tmp_path):
    with pytest.raises(SystemExit):
        workload.main(["--out", str(tmp_path / "r.json"), "--stages", "import,bogus"])


def test_comparisons():
    rng = np.random.default_rng(0)
    cpu = rng.normal(size=(4, 50)).astype(np.float32)
    ok, diff, bound = compare_logits(cpu, cpu + 1e-4)
    assert ok and diff < bound
    assert not compare_logits(cpu, rng.normal(size=cpu.shape))[0]  # a broken backend
    assert not compare_logits(cpu, cpu[:3])[0]
    assert not compare_logits(cpu, np.full_like(cpu, np.nan))[0]
    ids = [int(i) for i in cpu.argmax(1)]
    assert greedy_agrees(ids, ids, cpu, 1e-4) == (True, "4 greedy tokens identical")
    tied = cpu.copy()
    second = int(np.argsort(tied[1])[-2])
    tied[1, second] = tied[1, ids[1]] - 1e-5  # the CPU's top two are a near-tie at step 1
    flipped = [ids[0], second, 7, 7]
    assert greedy_agrees(ids, flipped, tied, 1e-4)[0]
    ok, why = greedy_agrees(ids, [ids[0], second, 7, 7], cpu, 1e-6)
    assert not ok and "token 1" in why
    assert not greedy_agrees(ids, ids[:2], cpu, 1e-4)[0]
    assert offloaded(["x", "load_tensors: offloaded 3/3 layers to GPU"]) == (3, 3)
    assert offloaded(["nothing"]) is None

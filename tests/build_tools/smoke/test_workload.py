"""The workload's stage registry and numeric comparisons (no venv, no wheel)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import numpy as np
import pytest

from build_tools.stages.smoke import STAGES, workload
from build_tools.stages.smoke.workload import (
    Context,
    Stage,
    compare_distributions,
    compare_logits,
    greedy_agrees,
    offloaded,
    run_stages,
)


def test_stage_lists_come_from_the_registry():
    assert STAGES == workload.RELEASE_STAGES == ("import", "libraries", "chat", "embedding", "mtp")
    assert set(workload.RELEASE_STAGES) | set(workload.GPU_STAGES) == set(workload.REGISTRY)
    assert [n for n, s in workload.REGISTRY.items() if s.gate] == ["import", "backends"]
    # the GPU stages compare a real model too; a GPU bundle (fixtures only) runs the others
    assert "real-generation" in workload.GPU_STAGES and "real-generation" not in workload.FIXTURE_GPU_STAGES
    assert set(workload.STAGE_MODELS.values()) == set(workload.MODEL_ROLES)


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
    assert greedy_agrees(ids, ids, cpu, cpu) == (True, "4 greedy tokens identical")
    tied = cpu.copy()
    second = int(np.argsort(tied[1])[-2])
    tied[1, second] = tied[1, ids[1]] - 1e-5  # the CPU's top two are a near-tie at step 1
    gpu = tied.copy()
    gpu[1, second] += 2e-5  # ... which the GPU's logits reverse
    flipped = [ids[0], second, 7, 7]
    assert greedy_agrees(ids, flipped, tied, gpu)[0]
    ok, why = greedy_agrees(ids, [ids[0], second, 7, 7], cpu, cpu + 1e-6)
    assert not ok and "token 1" in why
    assert not greedy_agrees(ids, ids[:2], cpu, cpu)[0]
    assert offloaded(["x", "load_tensors: offloaded 3/3 layers to GPU"]) == (3, 3)
    assert offloaded(["nothing"]) is None


def test_a_greedy_divergence_is_accepted_only_between_near_tied_choices():
    cpu = np.zeros((3, 10))
    cpu[:, 0] = 5.0
    cpu[1, 1] = 5.0 - 1e-5  # a near-tie of the top two at step 1
    ids = [0, 0, 0]
    gpu = cpu + 1e-4
    gpu[1, 0] -= 2e-4  # the backends' logits differ by 1e-4 each
    assert greedy_agrees(ids, [0, 1, 4], cpu, gpu)[0]  # the GPU took the other near-tied token
    ok, why = greedy_agrees(ids, [0, 2, 4], cpu, gpu)  # ... but not a token 5 logits behind
    assert not ok and "token 1: CPU 0, GPU 2" in why


def test_next_token_distributions_tolerate_tail_noise_not_a_broken_backend():
    rng = np.random.default_rng(1)
    cpu = rng.normal(scale=6.0, size=(8, 1000))
    cpu[:, 0] = 30.0  # a confident top token per row, as a real model's
    tail = cpu + np.where(cpu < 0, rng.normal(scale=1.5, size=cpu.shape), 0.0)  # quantization noise in the tail
    ok, worst, mean = compare_distributions(cpu, tail)
    assert ok and worst < 1e-3
    assert not compare_logits(cpu, tail)[0]  # what a max-|diff| bound would have refused
    ok, worst, mean = compare_distributions(cpu, rng.normal(scale=6.0, size=cpu.shape))  # a broken backend
    assert not ok and mean > 1.0
    assert not compare_distributions(cpu, cpu[:3])[0] and not compare_distributions(cpu, cpu * np.nan)[0]


def test_core_libraries_are_recognised_per_platform():
    linux = ["libggml-base.so.0", "libggml.so.0", "libllama.so.0", "libggml-cpu-haswell.so"]
    msvc = ["ggml-base.dll", "ggml.dll", "llama.dll", "ggml-cpu-haswell.dll"]
    mingw = ["ggml-base.dll", "ggml.dll", "libllama.dll", "libmtmd.dll"]
    mac = ["libggml-base.0.dylib", "libggml.0.dylib", "libllama.0.dylib"]
    for names in (linux, msvc, mingw, mac):
        assert not any(workload.core_library_missing(names, core) for core in workload.CORE_LIBRARIES), names
    # ggml-base is not ggml, and a variant is not the core
    assert workload.core_library_missing(["ggml-base.dll", "ggml-cpu-x64.dll"], "ggml")
    assert workload.core_library_missing(["libggml.so.0"], "ggml-base")
    assert workload.core_library_missing(["libllama-foo.so"], "llama")


def _status(name, loaded, reason=None, devices=()):
    return argparse.Namespace(name=name, loaded=loaded, reason=reason, path=None,
                              devices=[argparse.Namespace(name=d, description=d, type="GPU") for d in devices])


def test_cuda_report_names_the_missing_driver():
    no_driver = "libcuda.so.1 not found (NVIDIA driver not installed)"
    cpu = _status("CPU", True)
    assert workload.cuda_report([cpu], False, "libcuda.so.1") == (None, None)  # not a CUDA wheel
    problem, summary = workload.cuda_report([_status("CUDA", False, no_driver), cpu], False, "libcuda.so.1")
    assert problem is None and no_driver in summary and "the CPU serves" in summary
    # CPU fallback alone is not enough: the report must say why CUDA did not load
    for wrong in ("libcublas.so.13 not found (CUDA runtime ...)", "ggml_backend_load failed", None):
        problem, _ = workload.cuda_report([_status("CUDA", False, wrong), cpu], False, "libcuda.so.1")
        assert problem and "must be reported as 'libcuda.so.1 not found (NVIDIA driver not installed)'" in problem
    win = "nvcuda.dll not found (NVIDIA driver not installed)"
    assert workload.cuda_report([_status("CUDA", False, win), cpu], False, "nvcuda.dll")[0] is None
    assert workload.cuda_report([_status("CUDA", False, no_driver)], False, "libcuda.so.1")[0]  # no CPU either
    assert workload.cuda_report([_status("CUDA", True, devices=["H100"]), cpu], False, "libcuda.so.1")[0]
    # with the driver installed, CUDA serves, or says why (no device): both are fine
    assert workload.cuda_report([_status("CUDA", True, devices=["H100"]), cpu], True, "libcuda.so.1")[0] is None
    assert workload.cuda_report([_status("CUDA", False, "no usable device"), cpu], True, "libcuda.so.1")[0] is None


def test_offload_problems():
    assert workload.offload_problem(999, (3, 3)) is None and workload.offload_problem(0, None) is None
    assert "only 2/3" in workload.offload_problem(999, (2, 3))
    assert "did not log" in workload.offload_problem(999, None)


def test_the_cpu_reference_process_hides_every_gpu(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, env, **kw):
        seen.update(cmd=cmd, env=env)
        np.savez(cmd[cmd.index("--out") + 1], ids=np.arange(3), logits=np.zeros((3, 4)), seconds=np.float64(1))
        return argparse.Namespace(returncode=0, stdout="", stderr="")

    monkeypatch.setenv("LLAMA_CPP_REQUIRE_GPU", "1")
    monkeypatch.setenv("VK_DRIVER_FILES", "/lvp.json")
    monkeypatch.setattr(workload.subprocess, "run", fake_run)
    ref = workload.cpu_reference("generation", "/m.gguf")
    assert list(ref["ids"]) == [0, 1, 2]
    assert seen["env"]["GGML_VK_VISIBLE_DEVICES"] == "" and seen["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "LLAMA_CPP_REQUIRE_GPU" not in seen["env"] and seen["env"]["VK_DRIVER_FILES"] == "/lvp.json"
    assert seen["cmd"][seen["cmd"].index("--cpu-reference") + 1] == "generation"
    # inside, a visible GPU device is refused before anything runs
    monkeypatch.setattr(workload, "_gpu_backends", lambda: [_status("Vulkan", True, devices=["llvmpipe"])])
    with pytest.raises(SystemExit, match="still sees GPU devices"):
        workload.main(["--out", str(tmp_path / "r.npz"), "--cpu-reference", "generation", "--reference-model", "m"])

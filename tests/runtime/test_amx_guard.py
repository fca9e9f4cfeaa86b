"""ggml's AMX kernels at the pinned commit crash (their tile configuration is compiled away), so
a CPU backend that has them loads models without extra buffer types unless LLAMA_CPP_AMX=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp._core import model as _core_model
from llama_cpp._native import loader as _loader

REPO = Path(__file__).resolve().parents[2]


def _extra_bufts_seen(monkeypatch, info: str, env: str | None) -> list[bool]:
    monkeypatch.setattr(_core_model, "_amx_verdict", None)
    monkeypatch.setattr(_loader, "system_info", lambda: info)
    if env is None:
        monkeypatch.delenv("LLAMA_CPP_AMX", raising=False)
    else:
        monkeypatch.setenv("LLAMA_CPP_AMX", env)
    C = _core_model.native_lib()
    real, seen = C.llama_model_load_from_file, []

    def spy(path, lp):
        seen.append(bool(lp.use_extra_bufts))
        return real(path, lp)

    monkeypatch.setattr(C, "llama_model_load_from_file", spy)
    _core_model.LlamaModel(fixture_path("llama_spm")).close()
    return seen


def test_an_amx_backend_loads_without_extra_buffers(monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="llama_cpp"):
        assert _extra_bufts_seen(monkeypatch, "CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 | ", None) == [False]
    assert any("AMX" in r.getMessage() and "LLAMA_CPP_AMX=1" in r.getMessage() for r in caplog.records)


def test_other_backends_and_the_override_keep_extra_buffers(monkeypatch):
    assert _extra_bufts_seen(monkeypatch, "CPU : AVX2 = 1 | REPACK = 1 | ", None) == [True]
    assert _extra_bufts_seen(monkeypatch, "CPU : AVX2 = 1 | AMX_INT8 = 1 | ", "1") == [True]
    monkeypatch.setattr(_core_model, "_amx_verdict", None)  # later tests see the real backend again


def _amx_host() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.realmodel
@pytest.mark.skipif(not _amx_host(), reason="this CPU has no AMX")
def test_release_cpu_build_serves_a_quantized_model_on_an_amx_cpu():
    # The cpu release build picks its sapphirerapids variant here; Gemma's Q4_K/Q8_0 weights hit
    # the AMX matmul, which killed the process with SIGILL before the guard.
    from build_tools.inputs.configs import load_matrix
    from build_tools.inputs.lock import load_lock
    from build_tools.stages.native import build as native
    from build_tools.stages.vendor import current_tree
    from tests.runtime.realmodels import GEMMA_PACKAGE, gemma_path, missing

    if missing(GEMMA_PACKAGE):
        pytest.skip(f"{GEMMA_PACKAGE} is not installed (pip install -r requirements/realmodels.txt)")
    lock = load_lock()
    nb = native.find_finished(native.plan(load_matrix().get("cpu"), lock, current_tree(lock), install=False))
    if nb is None:
        pytest.skip("the cpu release build is not in the cache: nox -s native -- cpu")
    code = ("from llama_cpp import Llama\nfrom llama_cpp._native import loader as _loader\n"
            f"llm = Llama({str(gemma_path())!r}, n_threads=2, verbose=False)\n"
            "out = llm.create_completion('The capital of France is a city called', max_tokens=6, temperature=0)\n"
            "cpu = [s.path.name for s in _loader.backends() if s.loaded and s.path]\n"
            "print(cpu, repr(out['choices'][0]['text']))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_CPP_")}
    env.update(LLAMA_CPP_LIB_PATH=str(nb.lib_dir), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "Paris" in done.stdout, done.stdout

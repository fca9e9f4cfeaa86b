"""What a configuration's smoke cells run, and on which device: one :class:`SmokeTarget` per backend.

- cpu, cuda (on a machine without a GPU): the release stages; the CUDA wheel must load, report why
  CUDA did not, and serve on the CPU.
- vulkan: the GPU stages (every layer offloaded, results against the CPU, MTP) on Mesa's lavapipe,
  a Vulkan device that runs on the CPU. ggml-vulkan skips CPU-type devices unless asked, so the
  workload gets ``GGML_VK_VISIBLE_DEVICES=0`` and the lavapipe driver alone (``VK_DRIVER_FILES``):
  a passing cell proves the layers ran through the Vulkan backend, not a silent CPU fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...common import syspkg
from ...errors import SmokeInputError
from ...inputs.configs import BuildConfig
from .runner import STAGES
from .workload import GPU_STAGES

ICD_DIRS = (Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d"), Path("/usr/local/share/vulkan/icd.d"))


@dataclass(frozen=True)
class SmokeTarget:
    stages: tuple[str, ...]
    require_gpu: bool = False
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"  # what the GPU side runs on, for the report


def lavapipe_icd(dirs: tuple[Path, ...] | None = None) -> Path | None:
    """The lavapipe ICD manifest (``lvp_icd.<arch>.json``), if Mesa's Vulkan drivers are installed."""
    for d in ICD_DIRS if dirs is None else dirs:
        found = sorted(d.glob("lvp_icd*.json")) if d.is_dir() else []
        if found:
            return found[0]
    return None


def software_vulkan_env(icd: Path) -> dict[str, str]:
    return {"VK_DRIVER_FILES": str(icd), "VK_ICD_FILENAMES": str(icd), "GGML_VK_VISIBLE_DEVICES": "0"}


def stages_for(config: BuildConfig) -> tuple[str, ...]:
    """The workload stages whose passing clears ``config``'s wheels."""
    return tuple(GPU_STAGES) if config.backend == "vulkan" else tuple(STAGES)


def target_for(config: BuildConfig, *, install: bool = True) -> SmokeTarget:
    """The smoke target of ``config`` (installing the software Vulkan device when allowed)."""
    if config.backend != "vulkan":
        return SmokeTarget(stages_for(config))
    assert config.vulkan is not None
    icd = lavapipe_icd()
    mgr = syspkg.manager()
    if icd is None and install and mgr is not None and config.vulkan.packages(mgr, smoke=True):
        syspkg.ensure(mgr, config.vulkan.packages(mgr, smoke=True), why="the Vulkan smoke test's software device")
        icd = lavapipe_icd()
    if icd is None:
        raise SmokeInputError("the Vulkan smoke test needs Mesa's lavapipe driver (lvp_icd.*.json in "
                              f"{', '.join(map(str, ICD_DIRS))}): install mesa-vulkan-drivers and libvulkan1")
    return SmokeTarget(stages_for(config), require_gpu=True, env=software_vulkan_env(icd), device=f"lavapipe ({icd.name})")

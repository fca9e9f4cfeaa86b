"""What a configuration's smoke cells run, and on which device: one :class:`SmokeTarget` per backend.

- cpu, cuda (on a machine without a GPU): the release stages; the CUDA wheel must load, report why
  CUDA did not, and serve on the CPU.
- vulkan: the GPU stages (every layer offloaded, greedy tokens and logits against a pure-CPU
  process on the fixtures and on Gemma 3 270M, embeddings, MTP) on Mesa's lavapipe, a Vulkan device
  that runs on the CPU. ggml-vulkan skips CPU-type devices unless asked, so the
  workload gets ``GGML_VK_VISIBLE_DEVICES=0`` and the lavapipe driver alone (``VK_DRIVER_FILES``):
  a passing cell proves the layers ran through the Vulkan backend, not a silent CPU fallback.
- metal (on GitHub's macos-14 runners): the release stages with no Metal device
  (``GGML_METAL_DEVICES=0``): the Metal backend loads from the wheel and reports no device, the
  CPU variants serve. The runners' paravirtual GPU advertises MTLGPUFamilyApple5 without simdgroup
  reduction or matrix multiply, and ggml aborts on ops it then cannot encode (RMS_NORM), so a GPU
  cell there would test the virtual machine, not the wheel.
- a cross-built aarch64 configuration (on an x86-64 host): the release stages inside the arm64
  Debian userland under qemu-user (:mod:`.emulated`), on the interpreters Debian ships there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...common import interpreters, syspkg
from ...errors import SmokeInputError
from ...inputs.configs import BuildConfig
from .runner import STAGES, Sandbox
from .workload import GPU_STAGES

NO_METAL_DEVICE = {"GGML_METAL_DEVICES": "0"}  # ggml-metal registers that many devices (at most)
ICD_DIRS = (Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d"), Path("/usr/local/share/vulkan/icd.d"))


@dataclass(frozen=True)
class SmokeTarget:
    stages: tuple[str, ...]
    require_gpu: bool = False
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"  # what the GPU side runs on, for the report
    sandboxes: tuple[Sandbox, ...] = ()  # cells run in another machine's userlands (emulated)

    def interpreters(self, host: list[interpreters.Interpreter]) -> list[interpreters.Interpreter]:
        """The interpreters the cells run on: the host's, or the same versions from the first
        sandbox that has each (a skip naming every sandbox's reason otherwise)."""
        if not self.sandboxes:
            return host
        out = []
        for i in host:
            found = [sb.interpreters([i.version])[0] for sb in self.sandboxes]
            hit = next((f for f in found if f.found), None)
            out.append(hit or interpreters.Interpreter(i.version, reason="; ".join(f.reason or "not found" for f in found)))
        return out

    def sandbox_for(self, interp: interpreters.Interpreter) -> Sandbox | None:
        """The sandbox ``interp`` (one of :meth:`interpreters`) lives in; None on the host."""
        return next((sb for sb in self.sandboxes if sb.interpreters([interp.version])[0].path == interp.path), None)


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
    """The smoke target of ``config`` (installing the software Vulkan device or the emulated
    userland when allowed)."""
    if config.cross is not None and not config.cross.is_native():
        return _emulated(config, install=install)
    if config.backend == "metal":
        return SmokeTarget(stages_for(config), env=dict(NO_METAL_DEVICE), device="cpu (no Metal device: GGML_METAL_DEVICES=0)")
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


def _emulated(config: BuildConfig, *, install: bool) -> SmokeTarget:
    from . import emulated

    assert config.cross is not None
    if (config.cross.system_name, config.cross.system_processor) != ("Linux", "aarch64"):
        raise SmokeInputError(f"{config.name}: no emulated userland for {config.cross.triple} wheels; smoke-test "
                              "them on their own platform (the release workflow's job for it)")
    userlands = tuple(emulated.ensure(suite, install=install) for suite in emulated.SUITES)
    return SmokeTarget(stages_for(config), sandboxes=userlands,
                       device=f"qemu-user, Debian {' and '.join(u.suite for u in userlands)} arm64")

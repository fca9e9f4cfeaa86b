"""The Vulkan native build in the cache and Mesa's lavapipe, for the tests that need them; each
skips naming exactly what is missing and the command that makes it (.ci/run's vulkan tier,
``nox -s release -- vulkan-dev``, builds the one and installs the other)."""

from __future__ import annotations

import pytest

from build_tools.stages.smoke import target as smoke_target

from ..syspkgs import missing_apt, skip_message

# The release build, else the quick one .ci/run's vulkan tier makes (same shaders, one CPU backend).
CONFIGS = ("vulkan", "vulkan-dev")


def vulkan_build():
    """The finished ``vulkan`` (else ``vulkan-dev``) NativeBuild, or a skip naming the keys looked for."""
    from build_tools.inputs.configs import load_matrix
    from build_tools.inputs.lock import load_lock
    from build_tools.stages.native import build as native
    from build_tools.stages.vendor import current_tree

    keys = []
    for name in CONFIGS:
        try:
            lock = load_lock()
            p = native.plan(load_matrix().get(name), lock, current_tree(lock), install=False)
        except Exception as exc:  # noqa: BLE001 - any missing piece means: not built here
            pytest.skip(f"no Vulkan toolchain here ({exc})")
        nb = native.find_finished(p)
        if nb is not None:
            return nb
        keys.append(f"{name} {p.key[:16]}")
    pytest.skip(f"no Vulkan native build in the cache ({', '.join(keys)}): nox -s release -- vulkan-dev (or vulkan)")


def lavapipe_env() -> dict[str, str]:
    """The environment that makes lavapipe the one Vulkan device, or a skip naming its apt packages."""
    from build_tools.inputs.configs import load_matrix

    icd = smoke_target.lavapipe_icd()
    if icd is None:
        vk = load_matrix().get("vulkan").vulkan
        assert vk is not None
        wanted = vk.packages("apt", smoke=True)
        pytest.skip(skip_message(missing_apt(wanted) or wanted, "Mesa's lavapipe (a Vulkan device on the CPU)"))
    return smoke_target.software_vulkan_env(icd)

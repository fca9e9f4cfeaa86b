"""The Vulkan build's pieces: the headers and loader to link against, and ``glslc`` for ggml's shaders.

They come from the system's package manager ([config.vulkan] names the packages per manager);
installed here when missing and running as root. Their versions enter the content key: a newer
``glslc`` compiles different SPIR-V into ``libggml-vulkan.so``. Nothing of this is shipped.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ...common import debfile, proc, syspkg
from ...common.paths import cache_root, downloads_dir
from ...errors import ToolNotFoundError
from ...inputs.configs import VulkanSpec


@dataclass(frozen=True)
class VulkanToolchain:
    glslc: Path
    versions: dict[str, str]
    include_dir: Path | None = None  # pinned headers newer than the distribution's, if any

    def cmake_defines(self) -> dict[str, str]:
        d = {"Vulkan_GLSLC_EXECUTABLE": str(self.glslc)}
        if self.include_dir is not None:
            d["Vulkan_INCLUDE_DIR"] = str(self.include_dir)
        return d


def provision(spec: VulkanSpec, *, install: bool = True) -> VulkanToolchain:
    """Make sure the packages are installed (``install``: install what is missing, as root); return
    ``glslc`` and the versions for the key."""
    mgr = syspkg.manager()
    if mgr is None or not spec.packages(mgr):
        raise ToolNotFoundError("the Vulkan build needs apt or dnf to install glslc and the Vulkan headers "
                                "([config.vulkan] in manifests/configs.toml), or install them by hand")
    got = syspkg.ensure(mgr, spec.packages(mgr), why="the Vulkan build", install=install)
    versions = {f"{mgr}:{p}": v for p, v in got.items()}
    glslc = shutil.which("glslc")
    if glslc is None:
        raise ToolNotFoundError(f"glslc is not on PATH although {', '.join(spec.packages(mgr))} are installed: "
                                "add the package that provides glslc to [config.vulkan]")
    first = proc.run([glslc, "--version"], what="glslc --version", error=ToolNotFoundError).stdout.splitlines()
    versions["glslc"] = first[0].strip() if first else "unknown"
    include = None
    if spec.headers_deb and spec.headers_sha256:
        # This llama.cpp needs VK_EXT_layer_settings (headers >= 1.3.261); bookworm and the
        # manylinux image ship older ones. Headers only: linking stays against the system loader,
        # and ggml-vulkan resolves every function through the loader at run time.
        deb = debfile.fetch(spec.headers_deb, spec.headers_sha256, downloads_dir())
        root = debfile.extract(deb, cache_root() / "toolchains" / f"vulkan-headers-{spec.headers_sha256[:16]}",
                               "usr/include/")
        include = root / "usr" / "include"
        versions["vulkan-headers"] = f"{deb.name} {spec.headers_sha256[:16]}"
    return VulkanToolchain(Path(glslc), versions, include)

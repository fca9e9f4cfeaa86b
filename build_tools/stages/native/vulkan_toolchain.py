"""The Vulkan build's pieces: the headers and loader to link against, and ``glslc`` for ggml's shaders.

They come from the system's package manager ([config.vulkan] names the packages per manager);
installed here when missing and running as root. Their versions enter the content key: a newer
``glslc`` compiles different SPIR-V into ``libggml-vulkan.so``. Nothing of this is shipped.

Where the package manager has no ``glslc`` (AlmaLinux 8, the manylinux_2_28 image the release
builds in: its repositories carry neither shaderc nor glslc), it is built from pinned sources
(:data:`GLSLC_SOURCES`: the upstream tarballs of the glslc Debian 12 ships, from Debian's pool,
sha256-checked) into the cache, and the sources' hashes enter the key with its version.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ...common import debfile, proc, syspkg
from ...common.compilers import find_cmake, find_ninja
from ...common.fsutil import staging_dir
from ...common.paths import cache_root, downloads_dir
from ...errors import ToolNotFoundError
from ...inputs.configs import VulkanSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedSource:
    pool_path: str  # in Debian's pool (debfile.DEBIAN_MIRROR)
    sha256: str
    into: str  # where it is unpacked, relative to the build folder


# shaderc 2023.2 with the glslang and SPIRV-Tools it was released with, and the SPIRV-Headers
# 1.3.239 they build against: the glslc of Debian 12's package (the apt path), so both paths
# compile the same SPIR-V. Upstream tarballs as Debian's pool serves them (sha256 as the signed
# .dsc lists them); SPIRV-Headers from its Debian package (sha256 from apt's signed index), since
# the pool no longer serves that upstream tarball: SPIRV-Tools needs only its include/ (headers and
# grammar JSON files) when SPIRV-Headers_SOURCE_DIR names it.
GLSLC_SOURCES = (
    PinnedSource("pool/main/s/shaderc/shaderc_2023.2.orig.tar.gz",
                 "06c4e2fdd63d62b73450d7011b72e7720b416182fb883fb0aac0afe6db2df3f6", "src"),
    PinnedSource("pool/main/g/glslang/glslang_12.0.0.orig.tar.gz",
                 "7cb45842ec1d4b6ea775d624c3d2d8ba9450aa416b0482b0cc7e4fdd399c3d75", "src/third_party/glslang"),
    PinnedSource("pool/main/s/spirv-tools/spirv-tools_2023.1.orig.tar.gz",
                 "f3d8245aeb89f098c01dddaa566f9c0f2aab4a3d62a9020afaeb676b5e7e64d4", "src/third_party/spirv-tools"),
    PinnedSource("pool/main/s/spirv-headers/spirv-headers_1.6.1+1.3.239.0-1_all.deb",
                 "0af7d53fb033dbcf0a35a2f27e5a4a609e1e2755477d4188743f3e4e3a62c760", "spirv-headers"),
)
GLSLC_PACKAGE = "glslc"  # the package name [config.vulkan] uses for it
# shaderc, glslang and SPIRV-Tools stamp the build date into `glslc --version` (whose first line
# enters the key) unless SOURCE_DATE_EPOCH fixes it: shaderc 2023.2's release month, 2023-02-01.
GLSLC_SOURCE_DATE_EPOCH = "1675209600"
# Only glslc is built: no tests, examples, other executables, or install rules.
_GLSLC_CMAKE = ("-DCMAKE_BUILD_TYPE=Release", "-DSHADERC_SKIP_TESTS=ON", "-DSHADERC_SKIP_EXAMPLES=ON",
                "-DSHADERC_SKIP_COPYRIGHT_CHECK=ON", "-DSHADERC_SKIP_INSTALL=ON", "-DSPIRV_SKIP_TESTS=ON",
                "-DSPIRV_SKIP_EXECUTABLES=ON", "-DENABLE_GLSLANG_BINARIES=OFF", "-DENABLE_CTEST=OFF",
                "-DBUILD_SHARED_LIBS=OFF")


def glslc_sources_key(sources: tuple[PinnedSource, ...] = GLSLC_SOURCES) -> str:
    """What the content key records for a glslc built from ``sources``."""
    return " + ".join(f"{t.pool_path.rsplit('/', 1)[-1]} {t.sha256[:16]}" for t in sources)


def _unpack(archive: Path, dest: Path) -> None:
    """A ``.deb``'s ``usr/``, or a tarball's single top folder's contents, into ``dest`` (nothing
    that links or leads outside it)."""
    if archive.name.endswith(".deb"):
        debfile.extract(archive, dest, "usr/")
        return
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts[1:]
            if not parts:
                continue
            m.name = str(Path(*parts))
            members.append(m)
        tar.extractall(dest, members=members, filter="data")


def glslc_path(sources: tuple[PinnedSource, ...] = GLSLC_SOURCES) -> Path:
    """Where :func:`build_glslc` puts the glslc of ``sources`` (under the cache root)."""
    digest = hashlib.sha256("".join(t.sha256 for t in sources).encode() + GLSLC_SOURCE_DATE_EPOCH.encode()).hexdigest()[:16]
    return cache_root() / "toolchains" / f"glslc-{digest}" / "bin" / "glslc"


def build_glslc(sources: tuple[PinnedSource, ...] = GLSLC_SOURCES, *, jobs: int | None = None) -> Path:
    """``glslc`` built from ``sources`` into the cache (once per set of sources); its path."""
    exe = glslc_path(sources)
    root = exe.parent.parent
    if exe.is_file():
        return exe
    # Captured, not printed: `native --print-key` (which provisions) prints only the key on stdout.
    log.info("building glslc from its pinned sources into %s (a few minutes, once)", root)
    with staging_dir(root) as tmp:
        for t in sources:
            _unpack(debfile.fetch(t.pool_path, t.sha256, downloads_dir()), tmp / t.into)
        src, build, headers = tmp / "src", tmp / "build", tmp / "spirv-headers" / "usr"
        cmake = str(find_cmake())
        env = {**os.environ, "SOURCE_DATE_EPOCH": GLSLC_SOURCE_DATE_EPOCH}
        proc.run([cmake, "-S", str(src), "-B", str(build), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={find_ninja()}",
                  f"-DPython3_EXECUTABLE={sys.executable}", f"-DPYTHON_EXECUTABLE={sys.executable}",
                  f"-DSPIRV-Headers_SOURCE_DIR={headers}", *_GLSLC_CMAKE],
                 what="configuring glslc (shaderc)", error=ToolNotFoundError, env=env)
        proc.run([cmake, "--build", str(build), "--target", "glslc_exe", *(["-j", str(jobs)] if jobs else [])],
                 what="building glslc (shaderc)", error=ToolNotFoundError, timeout=7200, env=env)
        (tmp / "bin").mkdir()
        shutil.copy2(build / "glslc" / "glslc", tmp / "bin" / "glslc")
        for d in {t.into.split("/", 1)[0] for t in sources} | {"build"}:
            shutil.rmtree(tmp / d)
    return exe


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
    packages = list(spec.packages(mgr))
    from_source = (GLSLC_PACKAGE in packages and shutil.which("glslc") is None
                   and syspkg.version(mgr, GLSLC_PACKAGE) is None and syspkg.available(mgr, GLSLC_PACKAGE) is False)
    if from_source:
        packages.remove(GLSLC_PACKAGE)
    got = syspkg.ensure(mgr, packages, why="the Vulkan build", install=install)
    versions = {f"{mgr}:{p}": v for p, v in got.items()}
    if from_source:
        if not install and not glslc_path().is_file():
            raise ToolNotFoundError(f"{mgr} offers no {GLSLC_PACKAGE} package here and glslc is not built yet "
                                    f"({glslc_path()}): run the native step so that it builds it from its pinned sources")
        glslc: str | None = str(build_glslc())
        versions["glslc-source"] = glslc_sources_key()
    else:
        glslc = shutil.which("glslc")
    if glslc is None:
        raise ToolNotFoundError(f"glslc is not on PATH although {', '.join(packages)} are installed: "
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

"""Step 2: build llama.cpp's shared libraries once per configuration, keyed by content.

The result lives in the cache outside the clone at ``native/<config>-<key16>/``::

    lib/                  the staged libraries, each under its SONAME (RUNPATH=$ORIGIN)
    native-manifest.json  written last: its presence marks a finished build
    build.log             the configure and build output
    tools/                llama.cpp's own programs, on demand (never packaged)

The CMake tree is kept beside it (``native/build/<config>-<key16>``) so reference tools
can be added later without recompiling the libraries.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ... import RECIPE_VERSION
from ...common import proc
from ...common.compilers import Toolchain, detect
from ...common.fsutil import staging_dir
from ...common.hashing import sha256_file, sha256_json
from ...common.locks import exclusive
from ...common.paths import native_cache_dir
from ...errors import ManifestError, MissingInputError, NativeBuildError, ToolNotFoundError
from ...inputs.configs import BuildConfig
from ...inputs.lock import SourceLock
from ..vendor import VendoredTree
from .manifest import MANIFEST_NAME, LibraryRecord, NativeManifest, describe_library, load_manifest, verify_files

log = logging.getLogger(__name__)

# ggml, ggml-base and every backend module are their dependencies; llama-cpp-ext brings llama-common
LIBRARY_TARGETS = ("llama", "mtmd", "llama-cpp-ext")
EXT_NAME = "llama-cpp-ext"
#: the C API over llama.cpp's common library (chat templates and parsers), added to llama.cpp's own
#: configure through EXT_INJECT (llama.cpp stays the top-level project, its defaults unchanged)
EXT_SOURCE_DIR = Path(__file__).resolve().parents[3] / "cmake" / "chat_shim"
EXT_INJECT = "inject.cmake"
_ANY_EXT = "*"  # the extension's hash in the build-tree key: one CMake tree serves every version of it
REFERENCE_TOOLS = (
    "llama-completion", "llama-embedding", "llama-bench", "llama-tokenize", "llama-simple",
    "llama-speculative-simple", "llama-mtmd-cli", "llama-fit-params",
)
_LIB_PATTERN = re.compile(r"^lib.+\.so(\.\d+)*$|^.+\.(dylib|dll)$")
_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
# libraries only llama.cpp's programs load (tools/*/CMakeLists.txt: llama-<tool>-impl), never packaged
_TOOLS_ONLY = re.compile(r"^(lib)?llama-.+-impl[.-]")


@dataclass(frozen=True)
class NativeBuild:
    """A finished, verified native build of one configuration."""

    config: BuildConfig
    key: str
    root: Path
    manifest: NativeManifest
    reused: bool
    seconds: float = 0.0

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_NAME

    @property
    def tools_dir(self) -> Path:
        return self.root / "tools"


def ext_sources_sha256(directory: Path = EXT_SOURCE_DIR) -> str:
    """The content hash of the extension library's sources (``cmake/chat_shim/``): part of the key."""
    files = sorted(f for f in directory.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    if not files:
        raise MissingInputError(f"{directory} holds no sources of {EXT_NAME}")
    return sha256_json({f.relative_to(directory).as_posix(): sha256_file(f) for f in files})


def build_dir_name(config_name: str, key_inputs: dict[str, object], source_dirs: tuple[Path, ...] = ()) -> str:
    """The CMake tree of a key: the key without the extension's hash, so that a change to the
    extension recompiles only the extension, never llama.cpp (ninja is incremental).

    The source locations (the vendored tree, the extension) are part of the name: CMake refuses a tree
    configured from another checkout's sources, and every compile line maps those paths. The results
    stay keyed by content alone, so a second clone reuses them without building.
    """
    inputs = dict(key_inputs)
    if "extensions" in inputs:
        inputs["extensions"] = {name: _ANY_EXT for name in inputs["extensions"]}  # type: ignore[union-attr]
    if source_dirs:
        inputs["source_dirs"] = [Path(d).resolve().as_posix() for d in source_dirs]
    return f"{config_name}-{sha256_json(inputs)[:16]}"


@dataclass(frozen=True)
class BuildPlan:
    """Everything that determines a build's output, and the key that names it."""

    config: BuildConfig
    tree: VendoredTree
    defines: dict[str, str]
    toolchain: Toolchain
    toolchain_versions: dict[str, str]
    extra_defines: dict[str, str]
    env: dict[str, str]
    ext_sha256: str = ""

    @property
    def key_inputs(self) -> dict[str, object]:
        return {
            "recipe": RECIPE_VERSION,
            "tree_sha256": self.tree.tree_sha256,
            "backend": self.config.backend,
            "defines": self.defines,
            "toolchain": self.toolchain_versions,
            # only where it is set: the Linux configurations' keys stay as they were
            **({"platform": self.config.platform} if self.config.platform else {}),
            "extensions": {EXT_NAME: self.ext_sha256},
        }

    @property
    def key(self) -> str:
        return sha256_json(self.key_inputs)

    @property
    def dir_name(self) -> str:
        return f"{self.config.name}-{self.key[:16]}"

    @property
    def build_dir(self) -> Path:
        return native_cache_dir() / "build" / build_dir_name(self.config.name, self.key_inputs,
                                                             (self.tree.path, EXT_SOURCE_DIR))


# Metal, its shader library compiled into libggml-metal (no .metallib file beside it to lose or
# mismatch), for arm64 only; the deployment target is the wheel's macOS tag (wheels/build.py).
MACOS_DEPLOYMENT_TARGET = "14.0"
METAL_DEFINES = {
    "GGML_METAL": "ON",
    "GGML_METAL_EMBED_LIBRARY": "ON",
    "CMAKE_OSX_ARCHITECTURES": "arm64",
    "CMAKE_OSX_DEPLOYMENT_TARGET": MACOS_DEPLOYMENT_TARGET,
}


def cmake_defines(config: BuildConfig, lock: SourceLock) -> dict[str, str]:
    """The path-free CMake definitions of a configuration (they enter the content key)."""
    d: dict[str, str] = {
        "CMAKE_BUILD_TYPE": "Release",
        "BUILD_SHARED_LIBS": "ON",
        "CMAKE_BUILD_WITH_INSTALL_RPATH": "ON",
        "CMAKE_INSTALL_RPATH": "$ORIGIN",
        "LLAMA_BUILD_NUMBER": str(lock.build_number),
        "LLAMA_BUILD_COMMIT": lock.short_commit,
        # Library targets are all a wheel needs; tools and examples are configured so that the
        # reference programs can be built on demand from this same tree, and never packaged.
        "LLAMA_BUILD_COMMON": "ON",
        "LLAMA_BUILD_TOOLS": "ON",
        "LLAMA_BUILD_EXAMPLES": "ON",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_SERVER": "ON",  # configured only: benchmarks/server.py builds llama-server on demand
        "LLAMA_BUILD_APP": "OFF",
        "LLAMA_BUILD_MTMD": "ON",
        "LLAMA_USE_PREBUILT_UI": "OFF",
        "LLAMA_OPENSSL": "OFF",
        "GGML_BACKEND_DL": "ON",
        "GGML_NATIVE": "OFF",  # incompatible with GGML_BACKEND_DL; "single" pins ISA flags instead
        "GGML_CPU_ALL_VARIANTS": "ON" if config.cpu_variants == "all" else "OFF",
        "GGML_CUDA": "ON" if config.backend == "cuda" else "OFF",
    }
    if config.backend == "vulkan":
        d["GGML_VULKAN"] = "ON"  # only here: the other configurations' keys stay as they were
    if config.backend == "metal":
        d.update(METAL_DEFINES)
    if config.target[0] == "Darwin":
        d["CMAKE_INSTALL_RPATH"] = "@loader_path"  # the dylibs find each other beside themselves
        # ... and name each other @loader_path/<name>, not @rpath/<name>: delocate-wheel rewrites every
        # reference between a wheel's own libraries to @loader_path/<relative path> (changing the bytes
        # the native manifest records), unless it already reads so.
        d["CMAKE_INSTALL_NAME_DIR"] = "@loader_path"
        d["CMAKE_BUILD_WITH_INSTALL_NAME_DIR"] = "ON"
    if config.cuda is not None:
        d["CMAKE_CUDA_ARCHITECTURES"] = ";".join(config.cuda.architectures)
        if config.cuda.fa_quants is not None:
            d["GGML_CUDA_FA_QUANTS"] = config.cuda.fa_quants
        if config.cuda.no_vmm:
            d["GGML_CUDA_NO_VMM"] = "ON"
    d.update(dict(config.cmake))
    return dict(sorted(d.items()))


def plan(config: BuildConfig, lock: SourceLock, tree: VendoredTree, toolchain: Toolchain | None = None,
         *, install: bool = True) -> BuildPlan:
    """Resolve a configuration into a build plan (provisioning a CUDA toolkit if one is needed;
    ``install=False`` refuses to install missing system packages, for probes of the cache)."""
    toolchain = toolchain or detect()
    versions = dict(toolchain.versions)
    extra = {"CMAKE_C_COMPILER": str(toolchain.cc), "CMAKE_CXX_COMPILER": str(toolchain.cxx),
             "CMAKE_PROJECT_llama.cpp_INCLUDE": (EXT_SOURCE_DIR / EXT_INJECT).as_posix()}
    env: dict[str, str] = {}
    if config.cuda is not None:
        from .cuda_toolkit import provision  # imported lazily: CPU builds never need it

        kit = provision(config.cuda)
        versions.update(kit.versions)
        extra.update(kit.cmake_defines())
        env.update(kit.env())
    if config.cross is not None and not config.cross.is_native():
        from .cross_toolchain import provision as provision_cross

        cross = provision_cross(config.cross, all_variants=config.cpu_variants == "all", install=install)
        versions.pop("libc", None)  # the host's; the target's C library is a package in [config.cross]
        versions.update(cross.versions)
        extra.update(cross.cmake_defines())
    if config.vulkan is not None:
        from .vulkan_toolchain import provision as provision_vulkan

        vk = provision_vulkan(config.vulkan, install=install)
        versions.update(vk.versions)
        extra.update(vk.cmake_defines())
    return BuildPlan(config, tree, cmake_defines(config, lock), toolchain, versions, extra, env, ext_sources_sha256())


def result_dir(p: BuildPlan) -> Path:
    return native_cache_dir() / p.dir_name


def _prefix_map_flags(p: BuildPlan, build_dir: Path) -> dict[str, str]:
    """Compiler flags that keep the checkout and cache locations out of the binaries.

    Assert messages embed ``__FILE__``; mapped, the same key gives the same bytes in any clone.
    """
    if os.name == "nt":
        return {}
    maps = (f"-ffile-prefix-map={p.tree.path}=/llama.cpp -ffile-prefix-map={build_dir}=/build "
            f"-ffile-prefix-map={EXT_SOURCE_DIR}=/{EXT_NAME}")
    return {"CMAKE_C_FLAGS": maps, "CMAKE_CXX_FLAGS": maps}


_LOCKED_GIT = """#!/bin/sh
# Stand-in for git while configuring the vendored llama.cpp: it has no history of its own, and the
# real git would describe the enclosing checkout instead (ggml embeds that commit in its library).
case "$*" in
  "rev-parse --short HEAD") echo {short} ;;
  "rev-list --count HEAD") echo {build} ;;
  "diff-index --quiet HEAD -- .") exit 0 ;;
  describe*) echo {short} ;;
  *) exit 1 ;;
esac
"""
# The same for Windows, where CMake runs a .cmd through cmd.exe (FindGit itself looks for git.cmd).
# Arguments are compared one by one, %~N without quotes: a launcher may quote each one.
_LOCKED_GIT_CMD = """@echo off\r
rem Stand-in for git while configuring the vendored llama.cpp (see _LOCKED_GIT in build.py).\r
if "%~1"=="describe" goto short\r
if "%~1 %~2 %~3"=="rev-parse --short HEAD" if "%~4"=="" goto short\r
if "%~1 %~2 %~3"=="rev-list --count HEAD" if "%~4"=="" goto build\r
if "%~1 %~2 %~3 %~4 %~5"=="diff-index --quiet HEAD -- ." if "%~6"=="" exit /b 0\r
exit /b 1\r
:short\r
echo {short}\r
exit /b 0\r
:build\r
echo {build}\r
exit /b 0\r
"""


def _host_is_windows() -> bool:
    return os.name == "nt"


def _locked_git(p: BuildPlan, *, windows: bool = False) -> Path:
    """A tiny ``git`` answering from the source lock, so version strings name the pinned commit
    (a shell script, or for a build on Windows a ``.cmd`` file)."""
    commit = p.defines["LLAMA_BUILD_COMMIT"]
    template = _LOCKED_GIT_CMD if windows else _LOCKED_GIT
    script = template.format(short=commit, build=p.defines["LLAMA_BUILD_NUMBER"])
    path = native_cache_dir() / "bin" / f"git-{sha256_json(script)[:12]}{'.cmd' if windows else ''}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(script.encode("ascii"))  # bytes: the .cmd keeps its CR LF on every host
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return path


def _configure_cmd(p: BuildPlan, build_dir: Path) -> list[str]:
    # A configuration's own compiler flags (in the key) come first; the path maps are appended.
    maps = {k: " ".join(filter(None, (p.defines.get(k), v))) for k, v in _prefix_map_flags(p, build_dir).items()}
    windows = _host_is_windows()
    # Every host: ggml's CMakeLists runs `git rev-parse` in the vendored tree, which has no .git, so
    # the real git answers with the enclosing checkout's commit.
    git = str(_locked_git(p, windows=windows))
    paths = {**p.extra_defines, "CMAKE_MAKE_PROGRAM": str(p.toolchain.ninja), "GIT_EXE": git, "GIT_EXECUTABLE": git}
    if windows:
        # CMake copies CMAKE_<LANG>_COMPILER into generated .cmake files, where a backslash reads as an
        # escape ("Invalid character escape '\P'" for C:\Program Files\LLVM\bin\clang.exe).
        paths = {k: v.replace("\\", "/") for k, v in paths.items()}
    defs = {**p.defines, **maps, **paths}
    return [
        str(p.toolchain.cmake), "-S", str(p.tree.path), "-B", str(build_dir), "-G", "Ninja",
        *(f"-D{k}={v}" for k, v in sorted(defs.items())),
    ]


def _build_cmd(p: BuildPlan, build_dir: Path, targets: tuple[str, ...], jobs: int | None) -> list[str]:
    cmd = [str(p.toolchain.cmake), "--build", str(build_dir), "--target", *targets]
    if jobs:
        cmd += ["--parallel", str(jobs)]
    return cmd


def _run_logged(cmd: list[str], log_file: Path, label: str, env: dict[str, str]) -> None:
    """Run ``cmd`` appending its output to ``log_file``, reporting ninja's progress as it goes."""
    with open(log_file, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            child = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, **env}, errors="replace",
            )
        except FileNotFoundError as exc:
            raise ToolNotFoundError(f"{cmd[0]} is not installed (or not on PATH): needed for [{label}]") from exc
        assert child.stdout is not None
        last_report = 0.0
        last_pct = -1
        outer = 0  # the largest step count seen: the build's own; a nested ninja (ggml-vulkan's
        # shader generator, an ExternalProject) prints its own smaller "[n/m]" counter in between
        for line in child.stdout:
            out.write(line)
            m = _PROGRESS.match(line)
            if m:
                done, total = int(m.group(1)), int(m.group(2))
                if total < outer:
                    continue
                if total > outer:
                    outer, last_pct = total, -1
                pct = done * 100 // max(total, 1)
                now = time.monotonic()
                if pct >= last_pct + 10 or now - last_report > 30 or done == total:
                    log.info("[%s] %d/%d steps (%d%%)", label, done, total, pct)
                    last_report, last_pct = now, pct
        rc = child.wait()
    if rc != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
        raise NativeBuildError(
            f"[{label}] `{' '.join(cmd[:3])} …` failed with exit code {rc}; full log: {log_file}\n"
            + "\n".join(tail)
        )


def _stage_libraries(bin_dir: Path, lib_dir: Path) -> list[str]:
    """Copy each built library to ``lib_dir`` under its SONAME (one real file, no symlinks)."""
    from ...common.elf import is_elf, read_dynamic

    lib_dir.mkdir(parents=True)
    staged: list[str] = []
    for entry in sorted(bin_dir.iterdir()):
        if entry.is_symlink() or not entry.is_file() or not _LIB_PATTERN.match(entry.name):
            continue
        if _TOOLS_ONLY.match(entry.name):
            continue  # built by the reference tools in a CMake tree several keys share
        name = entry.name
        if is_elf(entry):
            name = read_dynamic(entry).soname or entry.name
        elif entry.name.endswith(".dylib"):
            name = _install_name(entry) or entry.name
        if (lib_dir / name).exists():
            raise NativeBuildError(f"two built libraries would be staged as {name}")
        shutil.copy2(entry, lib_dir / name)
        os.chmod(lib_dir / name, 0o755)
        staged.append(name)
    if not staged:
        raise NativeBuildError(f"the build produced no libraries in {bin_dir}")
    return staged


def _install_name(path: Path) -> str | None:
    """A dylib's install name's file name (``@rpath/libllama.0.dylib``): what the others load it by."""
    from llama_cpp._native.binfmt import read_dependencies

    try:
        install = read_dependencies(path).install_name
    except ValueError as exc:
        raise NativeBuildError(f"{path}: not a readable Mach-O library ({exc})") from None
    return install.rsplit("/", 1)[-1] if install else None


def _backend_names(names: list[str]) -> tuple[str, ...]:
    out = []
    for n in names:
        m = re.match(r"^(?:lib)?ggml-(.+?)\.(so|dll|dylib)", n)
        if m and m.group(1) != "base":
            out.append(m.group(1))
    return tuple(sorted(out))


def find_finished(p: BuildPlan) -> NativeBuild | None:
    """The cached result for this plan's key, if a finished one exists and is intact."""
    root = result_dir(p)
    if not (root / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = load_manifest(root)
    except ManifestError as exc:
        log.warning("ignoring cached build %s: %s", root, exc)
        return None
    if manifest.key != p.key:
        log.warning("ignoring cached build %s: its manifest has key %s", root, manifest.key[:16])
        return None
    return NativeBuild(p.config, p.key, root, manifest, reused=True)


def build(p: BuildPlan, *, jobs: int | None = None, force: bool = False) -> NativeBuild:
    """Return the native build for ``p``: the cached one when its key exists, else a new one."""
    final = result_dir(p)
    with exclusive(final.with_name(final.name + ".lock")):
        if not force:
            cached = find_finished(p)
            if cached is not None:
                log.info("[%s] cache hit %s: nothing to compile", p.config.name, final)
                return cached
        _remove_stale_staging(final)
        started = time.monotonic()
        build_dir = p.build_dir
        build_dir.mkdir(parents=True, exist_ok=True)
        log.info("[%s] building key %s in %s", p.config.name, p.key[:16], build_dir)
        with staging_dir(final) as stage, exclusive(_build_dir_lock(build_dir)):
            log_file = stage / "build.log"
            _configure_if_changed(p, build_dir, log_file)
            _run_logged(_build_cmd(p, build_dir, LIBRARY_TARGETS, jobs), log_file, p.config.name, p.env)
            staged = _stage_libraries(build_dir / "bin", stage / "lib")
            libs = tuple(describe_library(stage, f"lib/{name}") for name in staged)
            manifest = NativeManifest(
                config=p.config.to_json(),
                key=p.key,
                key_inputs=p.key_inputs,
                source={**p.tree.to_json()},
                toolchain={**p.toolchain.to_json(), "versions": p.toolchain_versions},
                cmake={
                    "configure": _configure_cmd(p, build_dir),
                    "build": _build_cmd(p, build_dir, LIBRARY_TARGETS, jobs),
                },
                libraries=libs,
                backends=_backend_names(staged),
            )
            _check_runpath(libs, p.defines["CMAKE_INSTALL_RPATH"])
            manifest.write(stage)  # last: a manifest marks the result finished
        seconds = time.monotonic() - started
        log.info("[%s] built %d libraries in %.0f s -> %s", p.config.name, len(libs), seconds, final)
        return NativeBuild(p.config, p.key, final, manifest, reused=False, seconds=seconds)


def _build_dir_lock(build_dir: Path) -> Path:
    """Held while ninja runs in a CMake tree: results of several keys can share one tree."""
    return build_dir.with_name(build_dir.name + ".lock")


_CONFIGURED = ".llama-cpp-python-configure.json"


def _configure_if_changed(p: BuildPlan, build_dir: Path, log_file: Path) -> None:
    """Configure the tree unless it was configured with this very command (a tree shared by several
    keys is reconfigured in place: the extension's path or sources changed, llama.cpp's did not)."""
    import json

    cmd = _configure_cmd(p, build_dir)
    stamp = build_dir / _CONFIGURED
    if (build_dir / "build.ninja").exists() and stamp.is_file():
        try:
            if json.loads(stamp.read_text(encoding="utf-8")) == cmd:
                return
        except ValueError:
            pass
    _run_logged(cmd, log_file, f"{p.config.name} configure", p.env)
    stamp.write_text(json.dumps(cmd), encoding="utf-8")


def _remove_stale_staging(final: Path) -> None:
    """Delete staging dirs of earlier runs that died (killed, power loss): we hold the key's lock."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        log.info("removing the remains of an interrupted build: %s", stale)
        shutil.rmtree(stale, ignore_errors=True)


def _check_runpath(libs: tuple[LibraryRecord, ...], expected: str = "$ORIGIN") -> None:
    """Only the recipe's own search path (``$ORIGIN``; a Mach-O file's LC_RPATH ``@loader_path``)."""
    for lib in libs:
        if lib.rpath or (lib.runpath and lib.runpath != (expected,)):
            raise NativeBuildError(
                f"{lib.path} has RUNPATH {lib.runpath} RPATH {lib.rpath}; expected only {expected} "
                f"(the recipe sets CMAKE_INSTALL_RPATH={expected}; a build path leaked in)"
            )


TOOLS_RECIPE = 3  # bump when the staged tools layout changes
LOG_FLUSH_SHIM = "libllama-cpp-python-logflush.so"
_LOG_FLUSH_C = r"""
/* Preloaded into llama.cpp's reference programs by the tests and benchmarks: their logger is a
   leaked singleton whose worker thread is never joined, so the last lines of output (stdout too)
   are lost at exit now and then. This drains it at exit, before any library is torn down. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

static void flush_common_log(void) {
    void *(*log_main)(void) = (void *(*)(void)) dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void (*log_flush)(void *) = (void (*)(void *)) dlsym(RTLD_DEFAULT, "_Z16common_log_flushP10common_log");
    if (log_main && log_flush) {
        log_flush(log_main());
    }
}

__attribute__((constructor)) static void register_flush(void) { atexit(flush_common_log); }
"""


def exe_suffix(config: BuildConfig) -> str:
    """``.exe`` for programs built for Windows (here, or cross-built with MinGW-w64), else nothing."""
    target = config.cross.system_name if config.cross is not None else platform.system()
    return ".exe" if target == "Windows" else ""


def tool_env(tools_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run a staged reference program in (its logger drained at exit)."""
    env = dict(os.environ if base is None else base)
    shim = tools_dir / LOG_FLUSH_SHIM
    if shim.is_file():
        env["LD_PRELOAD"] = " ".join(filter(None, [str(shim), env.get("LD_PRELOAD")]))
    return env


def _build_log_flush_shim(cc: Path, out: Path) -> None:
    src = out.with_suffix(".c")
    src.write_text(_LOG_FLUSH_C)
    try:
        proc.run([cc, "-shared", "-fPIC", "-O2", "-o", out, src, "-ldl"],
                 what="compiling the log-flush shim for the reference tools", error=NativeBuildError)
    finally:
        src.unlink()


def build_reference_tools(nb: NativeBuild, p: BuildPlan, tools: tuple[str, ...] = REFERENCE_TOOLS,
                          jobs: int | None = None) -> Path:
    """Build llama.cpp's own programs from the same tree into ``<result>/tools`` (never packaged).

    The packaged libraries are linked in from ``lib/`` so the programs run exactly the bytes a wheel
    carries; the tools-only libraries (``libllama-common``, ``libllama-*-impl``) are copied beside them.
    """
    import json

    from ...common.elf import is_elf, read_dynamic

    tools_dir = nb.tools_dir
    stamp = tools_dir / ".tools.json"
    if stamp.is_file():
        recorded = json.loads(stamp.read_text())
        if isinstance(recorded, dict) and recorded.get("recipe") == TOOLS_RECIPE \
                and set(recorded.get("tools", ())).issuperset(tools):
            return tools_dir
    build_dir = p.build_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(nb.root.with_name(nb.root.name + ".lock")), exclusive(_build_dir_lock(build_dir)):
        log_file = nb.root / "tools.log"
        _configure_if_changed(p, build_dir, log_file)
        _run_logged(_build_cmd(p, build_dir, tools, jobs), log_file, f"{nb.config.name} tools", p.env)
        packaged = {lib.name for lib in nb.manifest.libraries}
        with staging_dir(tools_dir) as stage:
            suffix = exe_suffix(nb.config)
            for tool in tools:
                src = build_dir / "bin" / f"{tool}{suffix}"
                if not src.is_file():
                    raise NativeBuildError(f"tool {src.name} was not produced in {build_dir / 'bin'}")
                shutil.copy2(src, stage / src.name)
            for lib in nb.manifest.libraries:
                os.symlink(os.path.relpath(nb.root / lib.path, stage), stage / lib.name)
            for entry in sorted((build_dir / "bin").iterdir()):
                if entry.is_symlink() or not entry.is_file() or not _LIB_PATTERN.match(entry.name):
                    continue
                name = (read_dynamic(entry).soname if is_elf(entry) else None) or entry.name
                if name not in packaged:
                    shutil.copy2(entry, stage / name)
            if os.name != "nt" and platform.system() == "Linux" and not suffix:
                _build_log_flush_shim(p.toolchain.cc, stage / LOG_FLUSH_SHIM)
            (stage / ".tools.json").write_text(json.dumps({"recipe": TOOLS_RECIPE, "tools": sorted(tools)}))
    return tools_dir


def verify(nb_root: Path) -> list[str]:
    """Rehash a build result against its manifest; also flag libraries the manifest does not list."""
    manifest = load_manifest(nb_root)
    problems = verify_files(manifest, nb_root)
    listed = {lib.path for lib in manifest.libraries}
    lib_dir = nb_root / "lib"
    if lib_dir.is_dir():
        for f in sorted(lib_dir.iterdir()):
            rel = f"lib/{f.name}"
            if rel not in listed:
                problems.append(f"{rel}: not in the manifest")
    return problems


def run(config: BuildConfig, lock: SourceLock, tree: VendoredTree, *, allow_build: bool = True,
        jobs: int | None = None) -> NativeBuild:
    """The stage: the configuration's native build, reused from the cache, else built if ``allow_build``."""
    p = plan(config, lock, tree)
    nb = find_finished(p)
    if nb is not None:
        return nb
    if not allow_build:
        raise MissingInputError(f"no finished native build of {config.name} (key {p.key[:16]}): run "
                                f"`nox -s native -- {config.name}` first")
    return build(p, jobs=jobs)


def from_root(config: BuildConfig, root: Path) -> NativeBuild:
    """A finished native build at ``root`` (a CI artifact), verified against its manifest."""
    manifest = load_manifest(root)
    if manifest.config_name != config.name:
        raise ManifestError(f"{root} holds a native build of {manifest.config_name!r}, not {config.name!r}")
    problems = verify(root)
    if problems:
        raise ManifestError(f"{root} does not match its native manifest: {problems}")
    return NativeBuild(config, manifest.key, root, manifest, reused=True)

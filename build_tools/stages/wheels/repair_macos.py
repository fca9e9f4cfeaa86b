"""Step 3b for macOS wheels: delocate checks that the libraries need nothing outside the wheel and macOS.

The Metal build links only system frameworks and libraries (Metal, Foundation, Accelerate,
``/usr/lib/libc++.1.dylib``, ``libSystem``) and its own dylibs as ``@loader_path/<name>`` (with
LC_RPATH ``@loader_path``), so ``delocate-wheel`` must find nothing to copy into
``llama_cpp/.dylibs/`` and no install name to rewrite: it rewrites any other reference between a
wheel's libraries to that form, and a rewrite would change the bytes the native manifest records
and replace the linker's signature. It also checks every binary is arm64 and built for the wheel's macOS
version. As for auditwheel, anything the repair changes beyond WHEEL and RECORD is a
:class:`RepairError`; :func:`dependency_problems` is the same rule for the files themselves.
delocate runs on macOS only (it calls ``install_name_tool`` and ``codesign``): the release
workflow's macos-14 job.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...errors import RepairError
from ..native.manifest import NativeManifest
from .build import PACKAGE, BuiltWheel
from .inwheel import parse_wheel_name, read_entries, rewrite

log = logging.getLogger(__name__)

# Where macOS keeps what every Mac has: a dependency there is never copied into a wheel.
SYSTEM_PREFIXES = ("/usr/lib/", "/System/Library/")
_MACHO_64 = 0xFEEDFACF
_CPU = {0x0100000C: "arm64", 0x01000007: "x86_64"}


@dataclass(frozen=True)
class MacosRepair:
    wheels: list[BuiltWheel]


def is_macos_tag(platform_tag: str) -> bool:
    return platform_tag.startswith("macosx_")


def tag_arch(platform_tag: str) -> str:
    """``macosx_14_0_arm64`` -> ``arm64``."""
    return platform_tag.rsplit("_", 1)[-1]


def tag_version(platform_tag: str) -> str:
    """``macosx_14_0_arm64`` -> ``14.0``."""
    parts = platform_tag.split("_")
    return f"{parts[1]}.{parts[2]}"


def macho_arch(data: bytes) -> str | None:
    """The architecture of a thin 64-bit Mach-O file, ``"fat"`` for a universal one, None for anything else."""
    if data[:4] in (b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf"):
        return "fat"
    if len(data) < 8 or struct.unpack_from("<I", data)[0] != _MACHO_64:
        return None
    (cpu,) = struct.unpack_from("<i", data, 4)
    return _CPU.get(cpu, f"cputype {cpu:#x}")


def dependency_problems(files: Mapping[str, bytes], lib_names: Sequence[str], arch: str) -> list[str]:
    """Each way a macOS wheel's libraries are wrong: not a thin ``arch`` Mach-O file, a dependency
    neither in the wheel (``@rpath``/``@loader_path``) nor in macOS, an LC_RPATH other than
    ``@loader_path``, or a copied dylib (``.dylibs/``) beside them."""
    from llama_cpp._native.binfmt import macho_dependencies  # the runtime's reader: one parser for both sides

    problems: list[str] = []
    ours = {n: files[f"{PACKAGE}/lib/{n}"] for n in lib_names if f"{PACKAGE}/lib/{n}" in files}
    for name in sorted(files):
        if "/.dylibs/" in f"/{name}":
            problems.append(f"{name}: delocate copied a library into the wheel; link it from macOS or build it in")
    for name, data in sorted(ours.items()):
        got = macho_arch(data)
        if got is None:
            problems.append(f"{PACKAGE}/lib/{name}: not a Mach-O library")
            continue
        if got != arch:
            problems.append(f"{PACKAGE}/lib/{name}: a {got} file in an {arch} wheel (CMAKE_OSX_ARCHITECTURES)")
            continue
        try:
            deps = macho_dependencies(data)
        except ValueError as exc:
            problems.append(f"{PACKAGE}/lib/{name}: unreadable load commands ({exc})")
            continue
        for rpath in deps.rpaths:
            if rpath != "@loader_path":
                problems.append(f"{PACKAGE}/lib/{name}: LC_RPATH {rpath!r}; expected only @loader_path "
                                "(a build path leaked in)")
        for dep in deps.needed + deps.weak:
            if dep.startswith(SYSTEM_PREFIXES):
                continue
            local = dep.split("/", 1)[0] in ("@rpath", "@loader_path") and dep.rsplit("/", 1)[-1] in ours
            if not local:
                problems.append(f"{PACKAGE}/lib/{name} loads {dep}, which is neither in the wheel nor part "
                                "of macOS: link it statically or build it in")
    return problems


def delocate_args(platform_tag: str, out: Path, wheel_name: str) -> list[str]:
    """``delocate-wheel``'s command line for one wheel.

    ``--no-sanitize-rpaths``: delocate's sanitizer keeps only rpaths starting ``@loader_path/`` (so it
    would delete ours, ``@loader_path``) and re-signs every library that loads another one of the wheel
    even when it deletes nothing; either changes the bytes the native manifest records. The libraries'
    LC_RPATH is checked here instead (:func:`dependency_problems`).
    """
    return ["--require-archs", tag_arch(platform_tag), "--no-sanitize-rpaths", "-w", str(out), wheel_name]


def _delocate(args: Sequence[str], cwd: Path, macos_version: str) -> str:
    # MACOSX_DEPLOYMENT_TARGET: delocate refuses a library that needs a newer macOS than the tag says.
    if importlib.util.find_spec("delocate") is None:
        raise RepairError("delocate is not installed: pip install -r requirements/release.txt on macOS "
                          "(or pass --no-repair to keep the wheels as built)")
    cmd = [sys.executable, "-m", "delocate.cmd.delocate_wheel", *args]
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": macos_version}
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise RepairError("delocate-wheel ran for more than 600 s") from None
    out = done.stdout + done.stderr
    if done.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise RepairError(f"delocate-wheel failed with exit code {done.returncode}:\n{tail}")
    return out


def _check_repaired(before: Path, after: Path, manifest: NativeManifest, platform_tag: str) -> None:
    """Only WHEEL and RECORD may differ; the tag and every library are as built."""
    old = {e.name: e.data for e in read_entries(before)}
    new = {e.name: e.data for e in read_entries(after)}
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(n for n in set(old) & set(new) if old[n] != new[n] and not n.endswith(("/WHEEL", "/RECORD")))
    if added or removed or changed:
        raise RepairError(f"delocate changed {before.name} beyond its records: added {added}, removed {removed}, "
                          f"changed {changed}; the libraries must need only macOS and each other")
    got = parse_wheel_name(after.name).platform
    if got != platform_tag:
        raise RepairError(f"delocate tagged {before.name} {got}, expected {platform_tag} (the libraries' "
                          "minimum macOS version is not the deployment target?)")
    for lib in manifest.libraries:
        data = new.get(f"{PACKAGE}/lib/{lib.name}")
        if data is None or hashlib.sha256(data).hexdigest() != lib.sha256:
            raise RepairError(f"{after.name}: {PACKAGE}/lib/{lib.name} no longer matches the native manifest")
    problems = dependency_problems(new, [lib.name for lib in manifest.libraries], tag_arch(platform_tag))
    if problems:
        raise RepairError(f"{after.name}: " + "; ".join(problems))


def repair(wheels: Sequence[BuiltWheel], manifest: NativeManifest, *, jobs: int | None = None) -> MacosRepair:
    """Run delocate over every macOS wheel (in place) and prove it changed nothing; others are returned unchanged."""
    todo = [w for w in wheels if is_macos_tag(w.platform_tag)]
    if not todo:
        return MacosRepair(list(wheels))

    def one(w: BuiltWheel) -> BuiltWheel:
        with tempfile.TemporaryDirectory(prefix="delocate-") as tmp:
            out = Path(tmp)
            _delocate(delocate_args(w.platform_tag, out, w.path.name), w.path.parent, tag_version(w.platform_tag))
            produced = list(out.glob("*.whl"))
            if len(produced) != 1:
                raise RepairError(f"delocate-wheel {w.path.name} produced {[p.name for p in produced]}")
            _check_repaired(w.path, produced[0], manifest, w.platform_tag)
            rewrite(produced[0], w.path, epoch=w.epoch)  # deterministic zip, RECORD rewritten
        return w.refreshed(w.path, repaired=True)

    with ThreadPoolExecutor(max_workers=jobs or min(len(todo), 4)) as pool:
        done = list(pool.map(one, todo))
    log.info("delocate: %d macOS wheels need nothing beyond macOS", len(done))
    repaired = {w.path: r for w, r in zip(todo, done)}
    return MacosRepair([repaired.get(w.path, w) for w in wheels])

"""validate's plugin half: a plugin wheel must fit the core wheel of its version exactly.

Checks, by name:

    archive         a readable wheel with one .dist-info, its plugin.json and entry point
    version         the plugin's version is not the core wheel's, or it does not pin
                    ``llama-cpp-python==<that version>``
    base-libraries  a base library the module was built against (``libggml-base``, ``libggml``,
                    ``libllama``) differs by sha256 from the core wheel's, or the core lacks it
    module          a backend module differs from plugin.json's record, or the wheel holds any other file
    driver-library  the wheel carries a GPU driver, runtime or loader
    size            the wheel is over PyPI's per-file limit
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import json
import re
import struct
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ...common.file_report import PYPI_FILE_LIMIT_MB, FileReport
from . import fatbin
from .build import ENTRY_POINT_GROUP, PLUGIN_RECORD, REQUIRED_BASE

CORE = "llama-cpp-python"


class PluginReport(FileReport):
    """What :func:`check` found in one plugin wheel."""


def _core_libraries(core: Path) -> tuple[str, dict[str, str]]:
    """The core wheel's version and its libraries' sha256 by file name."""
    with zipfile.ZipFile(core) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        version = email.parser.Parser().parsestr(zf.read(meta_name).decode())["Version"]
        libs = {n.rsplit("/", 1)[1]: hashlib.sha256(zf.read(n)).hexdigest()
                for n in zf.namelist() if n.startswith("llama_cpp/lib/") and not n.endswith("/")}
    return version, libs


def device_code(plugin: Path) -> str:
    """What each GPU target adds to a CUDA plugin's modules ("sm_90 28.1 MB, ..."; "" for any other plugin)."""
    found: list[fatbin.DeviceImage] = []
    try:
        with zipfile.ZipFile(plugin) as zf:
            for n in zf.namelist():
                if "/lib/" in n and "cuda" in n.rsplit("/", 1)[-1]:
                    with contextlib.suppress(ValueError, struct.error):
                        found += fatbin.images(fatbin.elf_section(zf.read(n), fatbin.SECTION))
    except (OSError, zipfile.BadZipFile):
        return ""
    return fatbin.describe(fatbin.by_target(found))


def check(plugin: Path, core: Path) -> PluginReport:
    """Check ``plugin`` against ``core``, the core wheel of the same release for its platform."""
    from ..validate import _DRIVER  # one list of what no wheel may carry

    rep = PluginReport(plugin.name, plugin.stat().st_size)
    if rep.size > PYPI_FILE_LIMIT_MB * 1e6:
        code = device_code(plugin)
        rep.fail("size", f"{rep.size / 1e6:.1f} MB is over PyPI's {PYPI_FILE_LIMIT_MB} MB per-file limit"
                 f"{f' (device code per target, as stored: {code})' if code else ''}: split the plugin (e.g. by GPU "
                 "generation) or request a larger limit for the project")
    core_version, core_libs = _core_libraries(core)
    core_version = core_version.split("+", 1)[0]
    try:
        zf = zipfile.ZipFile(plugin)
    except (OSError, zipfile.BadZipFile) as exc:
        rep.fail("archive", f"not a readable wheel ({exc})")
        return rep
    with zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        infos = [n for n in names if n.endswith(".dist-info/METADATA")]
        records = [n for n in names if n.endswith("/" + PLUGIN_RECORD) and n.count("/") == 1]
        if len(infos) != 1 or len(records) != 1:
            rep.fail("archive", f"expected one .dist-info and one <package>/{PLUGIN_RECORD}")
            return rep
        dist_info, pkg = infos[0].split("/", 1)[0], records[0].split("/", 1)[0]
        meta = email.parser.Parser().parsestr(zf.read(infos[0]).decode())
        version = meta["Version"]
        if version != core_version:
            rep.fail("version", f"{meta['Name']} {version} is not the core wheel's version {core_version}")
        pins = []
        for r in meta.get_all("Requires-Dist") or []:
            try:
                req = Requirement(r)
            except InvalidRequirement:
                rep.fail("version", f"Requires-Dist {r!r} is invalid")
                continue
            if canonicalize_name(req.name) == CORE:
                pins.append(str(req.specifier))
        if pins != [f"=={core_version}"]:
            rep.fail("version", f"must require {CORE}=={core_version} exactly, requires {pins or 'nothing'}")
        eps = zf.read(f"{dist_info}/entry_points.txt").decode() if f"{dist_info}/entry_points.txt" in names else ""
        if f"[{ENTRY_POINT_GROUP}]" not in eps or not re.search(rf"=\s*{re.escape(pkg)}\s*$", eps, re.M):
            rep.fail("archive", f"entry_points.txt does not name {pkg} in [{ENTRY_POINT_GROUP}]")
        try:
            record = json.loads(zf.read(records[0]))
            base, modules = dict(record["base_libraries"]), dict(record["modules"])
        except (ValueError, KeyError, TypeError) as exc:
            rep.fail("archive", f"{records[0]} is unreadable ({exc})")
            return rep
        if record.get("version") != version:
            rep.fail("version", f"{PLUGIN_RECORD} says version {record.get('version')!r}, METADATA {version!r}")
        for want in REQUIRED_BASE:
            if not any(re.match(rf"^(lib)?{want}[.]", n) for n in base):
                rep.fail("base-libraries", f"{PLUGIN_RECORD} records no {want} library")
        for name, digest in sorted(base.items()):
            theirs = core_libs.get(name)
            if theirs is None:
                rep.fail("base-libraries", f"the core wheel {core.name} has no {name}, which the module was built "
                         "against")
            elif theirs != digest:
                rep.fail("base-libraries", f"{name}: the module was built against sha256 {digest[:16]}, the core "
                         f"wheel {core.name} ships {theirs[:16]}; the module would meet base libraries it was "
                         "not built with: build the plugin and the core from the same base libraries")
        allowed = {f"{pkg}/__init__.py", records[0], *(f"{pkg}/lib/{m}" for m in modules)}
        for n in names:
            if n.startswith(dist_info + "/"):
                continue
            base_name = n.rsplit("/", 1)[-1]
            if _DRIVER.match(base_name):
                rep.fail("driver-library", f"{n}: a GPU driver, runtime or loader; it comes from the system or "
                         "NVIDIA's wheels")
            elif n not in allowed:
                rep.fail("module", f"{n}: not the backend module or the plugin's own files")
        for m, digest in sorted(modules.items()):
            n = f"{pkg}/lib/{m}"
            if n not in names:
                rep.fail("module", f"{n} is missing")
            elif hashlib.sha256(zf.read(n)).hexdigest() != digest:
                rep.fail("module", f"{n} differs from {PLUGIN_RECORD}'s sha256")
    return rep

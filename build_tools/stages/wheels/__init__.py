"""Stage 3, wheels: a finished native build → one wheel per CPython tag (or one py3 wheel).

Input: a :class:`~build_tools.stages.native.build.NativeBuild` and :class:`WheelOptions`. Output:
:class:`WheelsResult`, whose :class:`BuiltWheel` list is recorded in ``dist/<config>/wheels.json``
(the wheels *record*). ``build`` assembles the archives (through ``inwheel``, deterministically),
``sbom`` writes their CycloneDX SBOM, ``repair`` retags them with auditwheel, ``repair_windows``
grafts a Windows wheel's runtime with delvewheel, ``repair_macos`` has delocate prove a macOS wheel
needs nothing beyond macOS.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from ...inputs.configs import BuildConfig
from ..native.build import NativeBuild
from . import build, repair, repair_macos, repair_windows
from .build import PYTHON_TAGS, BuiltWheel, WheelOptions, load_record

__all__ = ["PYTHON_TAGS", "BuiltWheel", "WheelOptions", "WheelsResult", "load_record", "run"]


@dataclass
class WheelsResult:
    wheels: list[BuiltWheel]
    reused: bool
    platform_tag: str | None
    seconds: float


def run(nb: NativeBuild, config: BuildConfig, options: WheelOptions, *, repair_tags: bool = True,
        force: bool = False) -> WheelsResult:
    """The stage: reuse the recorded wheels when their content key matches, else build (and repair) them."""
    started = time.monotonic()
    if config.cross is not None or config.platform is not None:  # only here: the other wheel keys stay as they were
        options = dataclasses.replace(options, platform_tag=build.target_platform_tag(config, options.platform_tag))
    key = build.content_key(nb.manifest, nb.manifest_path.read_bytes(), options, config, repair_tags)
    if not force:
        cached = build.reusable(options.out_dir, key)
        if cached is not None:
            build.clean_stale(options.out_dir, cached)
            return WheelsResult(cached, True, cached[0].platform_tag if cached[0].repaired else None,
                                time.monotonic() - started)
    built = build.build_wheels(nb, config, options)
    plat = None
    if repair_tags:
        result = repair.repair(built, nb.manifest, jobs=options.jobs)
        built, plat = result.wheels, result.platform_tag
        if any(repair_windows.is_windows_tag(w.platform_tag) for w in built):
            built = repair_windows.repair(built, nb.manifest, config, jobs=options.jobs).wheels
            plat = built[0].platform_tag
        if any(repair_macos.is_macos_tag(w.platform_tag) for w in built):
            built = repair_macos.repair(built, nb.manifest, jobs=options.jobs).wheels
            plat = built[0].platform_tag
    build.clean_stale(options.out_dir, built)
    build.save_record(options.out_dir, key, built)
    return WheelsResult(built, False, plat, time.monotonic() - started)

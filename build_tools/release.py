"""The release chain: vendor → native → wheels → validate → smoke → publish, reusing what is cached.

Per configuration, everything lands in ``dist/<config>/``: the wheels, ``wheels.json`` (their
content key), ``validation.json``, ``smoke.json`` and, when both gates passed,
``release-manifest.json`` (the only thing publish accepts). The native build comes from the
content-keyed cache; wheels are reused when their content key is unchanged; smoke cells are
reused per (wheel sha256, interpreter); so a second run with nothing changed compiles and
rebuilds nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common.paths import REPO_ROOT
from .errors import BuildToolsError, ReleaseError
from .inputs.configs import BuildConfig
from .inputs.lock import load_lock
from .stages.native import build as native
from .stages.wheels.build import BuiltWheel, WheelOptions

log = logging.getLogger(__name__)

DIST = REPO_ROOT / "dist"



def dist_dir(config: BuildConfig, base: Path = DIST) -> Path:
    return base / config.name


def native_build(config: BuildConfig, *, build: bool, jobs: int | None = None) -> native.NativeBuild:
    """The configuration's native build: reused from the cache, built if ``build``, else an error."""
    from .stages.vendor import current_tree

    lock = load_lock()
    p = native.plan(config, lock, current_tree(lock))
    nb = native.find_finished(p)
    if nb is not None:
        return nb
    if not build:
        raise BuildToolsError(f"no finished native build of {config.name} (key {p.key[:16]}): run "
                              f"`nox -s native -- {config.name}` first")
    return native.build(p, jobs=jobs)


def native_from_root(config: BuildConfig, root: Path) -> native.NativeBuild:
    """A finished native build at ``root`` (a CI artifact), verified against its manifest."""
    from .stages.native.manifest import load_manifest

    manifest = load_manifest(root)
    if manifest.config_name != config.name:
        raise BuildToolsError(f"{root} holds a native build of {manifest.config_name!r}, not {config.name!r}")
    problems = native.verify(root)
    if problems:
        raise BuildToolsError(f"{root} does not match its native manifest: {problems}")
    return native.NativeBuild(config, manifest.key, root, manifest, reused=True)


@dataclass
class WheelsResult:
    wheels: list[BuiltWheel]
    reused: bool
    platform_tag: str | None
    seconds: float


def make_wheels(nb: native.NativeBuild, config: BuildConfig, options: WheelOptions, *, repair: bool = True,
                force: bool = False) -> WheelsResult:
    """Wheels for ``nb``: reused when the content key matches the recorded one, else built (+ repaired)."""
    from .stages.wheels import build as wheels
    from .stages.wheels import repair as repair_mod

    started = time.monotonic()
    key = wheels.content_key(nb.manifest, nb.manifest_path.read_bytes(), options, config, repair)
    if not force:
        cached = wheels.reusable(options.out_dir, key)
        if cached is not None:
            wheels.clean_stale(options.out_dir, cached)
            return WheelsResult(cached, True, cached[0].platform_tag if cached[0].repaired else None,
                                time.monotonic() - started)
    built = wheels.build_wheels(nb, config, options)
    plat = None
    if repair:
        result = repair_mod.repair(built, nb.manifest, jobs=options.jobs)
        built, plat = result.wheels, result.platform_tag
    wheels.clean_stale(options.out_dir, built)
    wheels.save_record(options.out_dir, key, built)
    for stale in ("validation.json", "smoke.json", "release-manifest.json"):
        (options.out_dir / stale).unlink(missing_ok=True)  # they describe the previous files
    return WheelsResult(built, False, plat, time.monotonic() - started)


def expected_version(config: BuildConfig, repo: Path = REPO_ROOT) -> str:
    from .stages.wheels.build import read_project, wheel_version

    return wheel_version(read_project(repo), config)


def run_validate(wheels_: Sequence[BuiltWheel], nb_manifest: Any, config: BuildConfig, out_dir: Path, *,
                 twine: bool = True, repo: Path = REPO_ROOT) -> Any:
    from .stages import validate

    tags = sorted({w.python_tag for w in wheels_})
    report = validate.validate(wheels_, nb_manifest, config, version=expected_version(config, repo),
                               python_tags=tags, twine=twine)
    validate.save_report(report, out_dir)
    return report


@dataclass
class StepTime:
    name: str
    seconds: float
    state: str  # built / reused / passed / failed / skipped


@dataclass
class ConfigSummary:
    config: str
    steps: list[StepTime] = field(default_factory=list)
    wheels: list[BuiltWheel] = field(default_factory=list)
    platform_tag: str | None = None
    smoke_table: str = ""
    ok: bool = False
    error: str | None = None


@dataclass
class ReleaseSummary:
    configs: list[ConfigSummary]
    index: Any = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.configs) and self.index is not None

    def render(self) -> str:
        lines = ["", "release summary"]
        for c in self.configs:
            lines.append(f"  {c.config}: {'OK' if c.ok else 'FAILED'}" + (f" ({c.error})" if c.error else ""))
            lines += [f"    {s.name:<9} {s.state:<8} {s.seconds:7.1f} s" for s in c.steps]
            if c.platform_tag:
                lines.append(f"    manylinux tag (auditwheel show): {c.platform_tag}")
            lines += [f"    {w.filename}  {w.size / 1e6:.1f} MB" for w in c.wheels]
        if self.index is not None:
            for v in self.index.variants():
                lines.append(f"  index: {self.index.root / v}/  (pip install --index-url "
                             f"{self.index.variant_url(v)} llama-cpp-python)")
        lines.append(f"  total {self.seconds:.1f} s")
        return "\n".join(lines)


def release(configs: Sequence[BuildConfig], *, out: Path | None = None, dist_base: Path = DIST,
            single: bool = False, strict: bool = False, python_versions: Sequence[str] | None = None,
            smoke_cache: bool = True, jobs: int | None = None, twine: bool = True,
            force_wheels: bool = False, repo: Path = REPO_ROOT) -> ReleaseSummary:
    """Run the whole chain for ``configs``; publish only if every configuration passed both gates."""
    from .common import interpreters
    from .inputs.lock import load_lock
    from .stages import publish, smoke
    from .stages.vendor import vendor

    started = time.monotonic()
    summary = ReleaseSummary([])
    t = time.monotonic()
    vendor(load_lock())
    vendor_s = time.monotonic() - t
    models: smoke.SmokeModels | None = None
    interps = interpreters.find_all(python_versions or interpreters.VERSIONS, strict=strict)
    for config in configs:
        cs = ConfigSummary(config.name)
        summary.configs.append(cs)
        cs.steps.append(StepTime("vendor", vendor_s, "checked"))
        try:
            t = time.monotonic()
            nb = native_build(config, build=True, jobs=jobs)
            cs.steps.append(StepTime("native", time.monotonic() - t, "reused" if nb.reused else "built"))
            out_dir = dist_dir(config, dist_base)
            wr = make_wheels(nb, config, WheelOptions(out_dir=out_dir, single=single, jobs=jobs, repo=repo),
                             force=force_wheels)
            cs.wheels, cs.platform_tag = wr.wheels, wr.platform_tag
            cs.steps.append(StepTime("wheels", wr.seconds, "reused" if wr.reused else "built"))
            t = time.monotonic()
            vrep = run_validate(wr.wheels, nb.manifest, config, out_dir, twine=twine, repo=repo)
            cs.steps.append(StepTime("validate", time.monotonic() - t, "passed" if vrep.ok else "failed"))
            if not vrep.ok:
                raise ReleaseError("validation refused the wheels:\n" + vrep.render())
            t = time.monotonic()
            if models is None:
                models = smoke.fixture_models()
            srep = smoke.run(wr.wheels, interps, models, jobs=jobs, strict=strict, use_cache=smoke_cache)
            smoke.save_report(srep, out_dir)
            cs.smoke_table = srep.render()
            n_cached = sum(r.cached for r in srep.results)
            cs.steps.append(StepTime("smoke", time.monotonic() - t, ("passed" if srep.ok else "failed")
                                     + (f" ({n_cached} cached)" if n_cached else "")))
            if not srep.ok:
                raise ReleaseError("smoke tests failed (see the smoke table)")
            publish.record_release(out_dir, config=config, wheels=wr.wheels, validation=vrep, smoke=srep,
                                   native=nb.manifest, strict=strict)
            cs.ok = True
        except BuildToolsError as exc:
            cs.error = str(exc).splitlines()[0]
            log.error("[%s] %s", config.name, exc)
    if summary.configs and all(c.ok for c in summary.configs):
        t = time.monotonic()
        summary.index = publish.publish([dist_dir(c, dist_base) for c in configs], out or publish.DEFAULT_OUT)
        summary.configs[-1].steps.append(StepTime("publish", time.monotonic() - t, "written"))
    summary.seconds = time.monotonic() - started
    return summary

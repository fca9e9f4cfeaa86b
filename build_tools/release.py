"""The release chain: vendor (→ sdist) → native → wheels → validate → smoke → gate → publish, reusing what is cached.

Only composition: each step is a stage's ``run`` (:mod:`build_tools.stages`) and the gate is
:func:`build_tools.dist.clear`. Per configuration everything lands in ``dist/<config>/``
(:class:`~build_tools.dist.DistDir`). The native build comes from the content-keyed cache;
wheels are reused when their content key is unchanged; smoke cells are reused per (wheel
sha256, interpreter); so a second run with nothing changed compiles and rebuilds nothing. The sdist
(``dist/sdist/``) is built and validated once per run, beside the configurations: a release whose
sdist validate refuses publishes nothing. It is the local loop: a re-run after an edit replaces that
version's files in its local index (``publish.run(replace_same_version=True)``, the old entries still
verified); ``nox -s publish`` and the release workflow never rewrite a published file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import dist
from .common import interpreters
from .common.paths import REPO_ROOT
from .errors import BuildToolsError, ReleaseError
from .inputs.configs import BuildConfig
from .inputs.lock import load_lock
from .stages import publish, sdist, smoke, validate, vendor, wheels
from .stages.native import build as native_build
from .stages.wheels import BuiltWheel, WheelOptions

log = logging.getLogger(__name__)


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
    index: publish.PublishedIndex | None = None
    seconds: float = 0.0
    sdist: sdist.SdistReport | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.configs) and self.index is not None and bool(self.sdist and self.sdist.ok)

    def render(self) -> str:
        lines = ["", "release summary"]
        if self.sdist is not None:
            lines.append(f"  sdist: {self.sdist.render()}".replace("\n", "\n  "))
        for c in self.configs:
            lines.append(f"  {c.config}: {'OK' if c.ok else 'FAILED'}" + (f" ({c.error})" if c.error else ""))
            lines += [f"    {s.name:<9} {s.state:<8} {s.seconds:7.1f} s" for s in c.steps]
            if c.platform_tag:
                lines.append(f"    platform tag after repair: {c.platform_tag}")
            lines += [f"    {w.filename}  {w.size / 1e6:.1f} MB" for w in c.wheels]
        if self.index is not None:
            for v in self.index.variants():
                lines.append(f"  index: {self.index.root / v}/  (pip install --index-url "
                             f"{self.index.variant_url(v)} llama-cpp-python)")
        lines.append(f"  total {self.seconds:.1f} s")
        return "\n".join(lines)


def release(configs: Sequence[BuildConfig], *, out: Path | None = None, dist_base: Path = dist.DIST,
            single: bool = False, strict: bool = False, python_versions: Sequence[str] | None = None,
            smoke_cache: bool = True, jobs: int | None = None, twine: bool = True,
            force_wheels: bool = False, repo: Path = REPO_ROOT) -> ReleaseSummary:
    """Run the whole chain for ``configs``; publish only if every configuration passed both gates."""
    started = time.monotonic()
    summary = ReleaseSummary([])
    t = time.monotonic()
    lock = load_lock()
    tree = vendor.run(lock)
    vendor_s = time.monotonic() - t
    sd = sdist.build(lock, dist_base / "sdist", repo=repo, tree=tree.path)
    summary.sdist = sdist.check(sd.path, repo=repo, version=sd.version)
    sdist.save_report(summary.sdist, sd.path.parent)
    if not summary.sdist.ok:
        log.error("validate refused the sdist:\n%s", summary.sdist.render())
    models: smoke.SmokeModels | None = None
    interps = interpreters.find_all(python_versions or interpreters.VERSIONS, strict=strict)
    for config in configs:
        cs = ConfigSummary(config.name)
        summary.configs.append(cs)
        cs.steps.append(StepTime("vendor", vendor_s, "checked"))
        try:
            t = time.monotonic()
            nb = native_build.run(config, lock, tree, jobs=jobs)
            cs.steps.append(StepTime("native", time.monotonic() - t, "reused" if nb.reused else "built"))
            out_dir = dist.DistDir.of(config, dist_base)
            wr = wheels.run(nb, config, WheelOptions(out_dir=out_dir.path, single=single, jobs=jobs, repo=repo),
                            force=force_wheels)
            if not wr.reused:
                out_dir.forget_reports()
            cs.wheels, cs.platform_tag = wr.wheels, wr.platform_tag
            cs.steps.append(StepTime("wheels", wr.seconds, "reused" if wr.reused else "built"))
            t = time.monotonic()
            vrep = validate.run(wr.wheels, nb.manifest, config, out_dir.path, twine=twine, repo=repo)
            cs.steps.append(StepTime("validate", time.monotonic() - t, "passed" if vrep.ok else "failed"))
            if not vrep.ok:
                raise ReleaseError("validation refused the wheels:\n" + vrep.render())
            t = time.monotonic()
            if models is None:
                models = smoke.fixture_models()
            target = smoke.target_for(config)
            srep = smoke.run(wr.wheels, target.interpreters(interps), models, stages=target.stages, jobs=jobs,
                             strict=strict, use_cache=smoke_cache, require_gpu=target.require_gpu, env=target.env,
                             sandbox_for=target.sandbox_for)
            smoke.save_report(srep, out_dir.path)
            cs.smoke_table = srep.render()
            n_cached = sum(r.cached for r in srep.results)
            cs.steps.append(StepTime("smoke", time.monotonic() - t, ("passed" if srep.ok else "failed")
                                     + (f" ({n_cached} cached)" if n_cached else "")))
            if not srep.ok:
                raise ReleaseError("smoke tests failed (see the smoke table)")
            dist.clear(out_dir, config=config, wheels=wr.wheels, validation=vrep, smoke=srep,
                       native=nb.manifest, strict=strict)
            cs.ok = True
        except BuildToolsError as exc:
            cs.error = str(exc).splitlines()[0]
            log.error("[%s] %s", config.name, exc)
    if summary.configs and all(c.ok for c in summary.configs) and summary.sdist.ok:
        t = time.monotonic()
        summary.index = publish.run([dist.DistDir.of(c, dist_base) for c in configs],
                                    out or publish.DEFAULT_OUT, sdist=publish.cleared_sdist(sd.path.parent),
                                    replace_same_version=True)
        summary.configs[-1].steps.append(StepTime("publish", time.monotonic() - t, "written"))
    summary.seconds = time.monotonic() - started
    return summary

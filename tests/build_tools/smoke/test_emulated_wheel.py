"""The cross-built aarch64 wheel through the release steps here: repaired to a manylinux aarch64
tag by auditwheel, validated, and smoke-tested inside the arm64 userland under qemu-user, where
ggml must pick one of the wheel's own CPU variants.

Runs when the cross build and the userland are cached (``nox -s release -- cpu-aarch64`` makes
all: about 3 minutes of native build and 4-5 per userland, cold; ``-- cpu-aarch64-dev``, .ci/run's
aarch64 tier, the quick build); otherwise it skips, saying so.
"""

from __future__ import annotations

import pytest

from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages import smoke, validate
from build_tools.stages import wheels as stage_wheels
from build_tools.stages.native import build as native
from build_tools.stages.vendor import current_tree
from build_tools.stages.wheels import build as wheels

pytestmark = pytest.mark.aarch64


def _finished(name: str) -> native.NativeBuild | None:
    try:
        lock = load_lock()
        p = native.plan(load_matrix().get(name), lock, current_tree(lock), install=False)
    except Exception:  # noqa: BLE001 - no cross compiler or no vendored tree: not built here
        return None
    return native.find_finished(p)


@pytest.fixture(scope="module")
def cross_build() -> native.NativeBuild:
    for name in ("cpu-aarch64", "cpu-aarch64-dev"):
        nb = _finished(name)
        if nb is not None:
            return nb
    pytest.skip("no cross-built aarch64 libraries in the cache: nox -s release -- cpu-aarch64 "
                "(or python -m build_tools native cpu-aarch64-dev)")


def test_cross_wheel_is_repaired_validated_and_runs_emulated(cross_build, userlands, tmp_path):
    from build_tools.common.interpreters import Interpreter
    from build_tools.stages.smoke.target import SmokeTarget

    config = load_matrix().get(cross_build.config.name)
    out = tmp_path / config.name
    wr = stage_wheels.run(cross_build, config,
                          wheels.WheelOptions(out_dir=out, python_tags=("cp311", "cp312", "cp313")))
    assert wr.platform_tag and wr.platform_tag.startswith("manylinux_") and wr.platform_tag.endswith("_aarch64")
    assert all(w.path.name.endswith(f"-{wr.platform_tag}.whl") for w in wr.wheels)

    rep = validate.run(wr.wheels, cross_build.manifest, config, out, twine=False)
    assert rep.ok, rep.render()

    target = SmokeTarget(smoke.stages_for(config), sandboxes=userlands)
    interps = target.interpreters([Interpreter(v) for v in ("3.11", "3.12", "3.13")])
    # A cell the release smoke already passed on these same bytes (.ci/run's aarch64 tier: the wheels are
    # reproducible) is reused, as the release reuses it; with a cold smoke cache every cell runs.
    report = smoke.run(wr.wheels, interps, smoke.fixture_models(), sandbox_for=target.sandbox_for)
    assert report.ok, report.render()
    passed = [r for r in report.results if r.status == "pass"]
    assert [r.python for r in passed] == ["3.11", "3.13"]  # bookworm's and trixie's; 3.12 is a skip naming why
    skipped = next(r for r in report.results if r.status == "skip")
    assert "bookworm userland" in skipped.reason and "trixie userland" in skipped.reason
    assert [target.sandbox_for(i).suite for i in interps if i.found] == ["bookworm", "trixie"]
    variants = {lib.name for lib in cross_build.manifest.libraries if lib.name.startswith("libggml-cpu")}
    for cell in passed:
        libs = cell.stages["libraries"]["detail"]
        assert "on aarch64" in libs and "CPU backend libggml-cpu" in libs, libs
        assert any(v in libs for v in variants), (libs, variants)
        assert cell.stages["mtp"]["status"] == "pass" and cell.stages["embedding"]["status"] == "pass"


def test_the_release_build_has_every_arm64_cpu_variant_of_ggml():
    """cpu-aarch64 (cpu_variants = "all"): one CPU backend per architecture level ggml's own list
    names for Linux arm64, armv8.0 to armv9.2; validate's cpu-variants check refuses a build without one."""
    from dataclasses import replace

    from build_tools.common.paths import VENDOR_DIR
    from build_tools.stages.native.cpu_variants import GGML_CPU_LISTS, cpu_variant_problems, expected_cpu_variants

    nb = _finished("cpu-aarch64")
    if nb is None:
        pytest.skip("the cpu-aarch64 cross build is not in the cache: nox -s release -- cpu-aarch64")
    want = expected_cpu_variants((VENDOR_DIR / GGML_CPU_LISTS).read_text(), system="Linux", machine="aarch64",
                                 msvc=False)
    have = sorted(lib.name for lib in nb.manifest.libraries if lib.name.startswith("libggml-cpu-"))
    assert have == sorted(f"libggml-cpu-{v}.so" for v in want) and want[0] == "armv8.0_1" and want[-1] == "armv9.2_2"
    assert cpu_variant_problems(nb.manifest, VENDOR_DIR) == []
    lacking = replace(nb.manifest, libraries=tuple(lib for lib in nb.manifest.libraries
                                                   if lib.name != "libggml-cpu-armv8.6_2.so"))
    assert [p.split(":")[0] for p in cpu_variant_problems(lacking, VENDOR_DIR)] == ["CPU variant armv8.6_2 is missing"]

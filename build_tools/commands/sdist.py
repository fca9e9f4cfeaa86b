"""Build the sdist into dist/sdist/ and validate it; --install builds it with pip in a fresh venv and smoke-tests it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..inputs.lock import load_lock
from ..options import add_dist, add_jobs, path_arg
from ..stages import sdist, vendor

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dist(p)
    p.add_argument("--check", type=path_arg, metavar="SDIST", help="only validate this sdist")
    p.add_argument("--install", action="store_true",
                   help="then pip install it in a fresh venv (a cold source build) and run the smoke workload")
    p.add_argument("--cmake-args", default="", help="CMAKE_ARGS for --install (e.g. -DGGML_VULKAN=on)")
    p.add_argument("--python", type=path_arg, default=Path(sys.executable), help="interpreter for --install")
    add_jobs(p)


def run(args: argparse.Namespace) -> int:
    version = sdist.build_module.read_project().version
    if args.check:
        report = sdist.check(args.check, version=version)
        print(report.render())
        return 0 if report.ok else 1
    lock = load_lock()
    vendor.run(lock)
    out = args.dist / "sdist"
    sd = sdist.build(lock, out)
    report = sdist.check(sd.path, version=version)
    print(report.render())
    sdist.save_report(report, out)
    if not report.ok:
        return 1
    if args.install:
        from ..stages import smoke
        from ..stages.sdist.install import install_and_smoke, vulkan_requested

        stages, target = smoke.STAGES, None
        if vulkan_requested(args.cmake_args):  # the Vulkan wheels' smoke: GPU stages on lavapipe
            from ..inputs.configs import load_matrix

            target = smoke.target_for(load_matrix().get("vulkan"))
            stages = target.stages
        result = install_and_smoke(sd.path, args.python, smoke.fixture_models().for_stages(stages),
                                   cmake_args=args.cmake_args, jobs=args.jobs, log_path=out / "source-build.log",
                                   version=version, stages=stages, workload_env=target.env if target else None,
                                   require_gpu=bool(target and target.require_gpu))
        print(f"source build: {result.build_seconds:.0f} s (CMAKE_ARGS={result.cmake_args!r}, log {result.log})")
        for name, st in result.stages.items():
            print(f"  {name:<10} {st.get('status')}  {st.get('detail', '')}")
        return 0 if result.ok else 1
    return 0

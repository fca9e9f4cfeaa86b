"""Run llama-cpp-python 0.3.36's own tests, unchanged, against the installed llama_cpp (stand-in models)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..common.paths import cache_root
from ..inputs.lock import load_lock
from ..options import path_arg

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build-dir", type=path_arg, default=None,
                   help="where the tests, the hub cache and the report go (default: <cache>/compat)")
    p.add_argument("--archive", type=path_arg, help="use this local llama-cpp-python sdist instead of downloading")
    p.add_argument("--python", default=sys.executable, help="the interpreter whose llama_cpp is tested")
    p.add_argument("--checkout", action="store_true",
                   help="test this source tree (PYTHONPATH and the cached cpu-host native build) instead of "
                        "the installed wheel")
    p.add_argument("--real-hub", type=path_arg,
                   help="an HF_HOME holding the real models: run every test, none deselected")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for the whole pytest run")
    p.add_argument("--select", action="append", default=None, metavar="PATH",
                   help="an upstream test file or node id to run (repeatable; default: all of tests/)")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")


def _checkout_lib_dir() -> Path:
    from ..inputs.configs import load_matrix
    from ..stages.native import build as native
    from ..stages.vendor import current_tree

    lock = load_lock()
    plan = native.plan(load_matrix().get("cpu-host"), lock, current_tree(lock))
    return native.build(plan).lib_dir


def run(args: argparse.Namespace) -> int:
    from ..compat import suite

    env = None
    if args.checkout:
        import os

        lib = Path(os.environ["LLAMA_CPP_LIB_PATH"]) if os.environ.get("LLAMA_CPP_LIB_PATH") else _checkout_lib_dir()
        env = suite.checkout_env(lib)
    report = suite.run(load_lock(), args.build_dir or cache_root() / "compat", python=args.python,
                       archive=args.archive, real_hub=args.real_hub, env=env, paths=args.select or ("tests",),
                       pytest_args=args.pytest_args,
                       timeout=args.timeout)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for test, outcome in sorted(report.outcomes.items()):
            note = report.messages.get(test, "")
            print(f"{outcome:8} {test}" + (f"  -- {note}" if note and outcome != "passed" else ""))
        for test, why in report.deselected.items():
            print(f"{'deselect':8} {test}  -- {why}")
        print(report.summary())
        print(f"report: {report.build_dir / 'report.json'}")
    return 0 if report.count("failed") == 0 and report.count("error") == 0 else 1

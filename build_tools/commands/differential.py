"""Run the same calls under upstream llama-cpp-python 0.3.36 (built from the locked sdist) and this package; compare."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..common import proc
from ..common.hashing import sha256_json
from ..common.paths import cache_root
from ..options import path_arg

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", default=sys.executable, help="the interpreter whose llama_cpp is compared")
    p.add_argument("--build-dir", type=path_arg, default=None,
                   help="upstream's venv, the models list, both results and the report (default: <cache>/differential)")
    p.add_argument("--archive", type=path_arg, help="a local copy of the locked llama-cpp-python sdist")
    p.add_argument("--no-gemma", action="store_true", help="only the generated tiny models, not Gemma 3 270M")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for each package's run")


def _run_calls(python: str | Path, script: Path, models: Path, out: Path, env: dict[str, str], timeout: float,
               what: str) -> float:
    t0 = time.monotonic()
    proc.run([python, script, models, out], what=f"the differential calls under {what}", env=env, timeout=timeout,
             cwd=script.parent)
    return time.monotonic() - t0


def _results_key(wheel_key: str, script: Path, models: Path) -> str:
    files = {name: [p, Path(p).stat().st_size] for name, p in json.loads(models.read_text()).items() if p}
    return sha256_json({"wheel": wheel_key, "calls": script.read_text(), "models": files})[:16]


def run(args: argparse.Namespace) -> int:
    from ..differential import compare, upstream
    from ..differential.models import write_models

    build = args.build_dir or cache_root() / "differential"
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    wheel = upstream.ensure_wheel(args.archive)
    print(f"upstream wheel: {wheel.wheel} ({'built' if wheel.built else 'cached'}, {time.monotonic() - t0:.0f} s)")
    up_python = upstream.venv(wheel.wheel, build / "upstream-venv")
    models = write_models(build / "models.json", args.no_gemma)
    script = build / "calls.py"
    shutil.copyfile(Path(__file__).resolve().parent.parent / "differential" / "calls.py", script)
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "PYTHONPATH")}
    # upstream's results depend only on its wheel, the calls and the models: kept by their content
    up_json = build / f"upstream-{_results_key(wheel.key, script, models)}.json"
    if up_json.is_file():
        up_s = 0.0
        print(f"upstream results: {up_json} (cached)")
    else:
        up_s = _run_calls(up_python, script, models, build / "upstream.json", env, args.timeout, "upstream 0.3.36")
        os.replace(build / "upstream.json", up_json)
    here_s = _run_calls(args.python, script, models, build / "here.json", env, args.timeout, "this package")
    report = compare.compare(json.loads(up_json.read_text()), json.loads((build / "here.json").read_text()))
    print("\n".join(report.lines()))
    for pattern in report.unused_known:
        print(f"note: known difference {pattern!r} matched no differing case")
    (build / "report.json").write_text(json.dumps(
        {"equal": report.equal, "known": report.known, "different": report.different, "missing": report.missing,
         "seconds": {"upstream": round(up_s, 1), "here": round(here_s, 1)}}, indent=1))
    print(f"{report.summary()} (upstream {up_s:.0f} s, here {here_s:.0f} s); report: {build / 'report.json'}")
    return 0 if report.ok else 1

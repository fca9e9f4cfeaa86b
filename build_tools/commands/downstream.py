"""Install the libraries built on llama-cpp-python on top of this wheel (and of upstream 0.3.36), run their documented usage, compare."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..common import pip, proc
from ..common.paths import REPO_ROOT, cache_root
from ..options import path_arg

HELP = __doc__
LIBS = REPO_ROOT / "requirements" / "downstream-libs.txt"
TESTS = REPO_ROOT / "tests" / "downstream"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", default=sys.executable, help="the interpreter whose installed llama-cpp-python is tested")
    p.add_argument("--build-dir", type=path_arg, default=None, help="default: <cache>/downstream")
    p.add_argument("--no-upstream", action="store_true", help="skip the run under upstream 0.3.36 and the comparison")
    p.add_argument("--no-gemma", action="store_true", help="only the generated tiny models, not Gemma 3 270M")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for each side's pytest run")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")


def library_lines(path: Path = LIBS) -> list[list[str]]:
    """One list of requirements per line of requirements/downstream-libs.txt (a library and its pins)."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line.split())
    return out


def installed_version(python: str | Path) -> str:
    done = proc.run([python, "-c", "from importlib.metadata import version; print(version('llama-cpp-python'))"],
                    what="reading the installed llama-cpp-python version")
    return done.stdout.strip()


def install_libraries(python: str | Path, lines: list[list[str]]) -> dict[str, str]:
    """Install each line as a user would (``pip install LIB``), refusing any build of llama-cpp-python from
    source: a library whose pins this wheel does not meet fails to install instead of replacing it.
    Returns ``{line: why}`` for the lines that could not be installed."""
    before = installed_version(python)
    proc.run(pip.pip("install", "-q", "pytest>=8", python=python), what="installing pytest")
    failed: dict[str, str] = {}
    for reqs in lines:
        done = proc.run(pip.pip("install", "-q", "--only-binary", "llama-cpp-python", *reqs, python=python), check=False,
                        what=f"pip install {' '.join(reqs)}", timeout=1800)
        if done.returncode != 0:
            failed[" ".join(reqs)] = proc.tail(done, 600)
        after = installed_version(python)
        if after != before:
            raise SystemExit(f"pip install {' '.join(reqs)} replaced llama-cpp-python {before} with {after}")
    return failed


def run_side(name: str, python: str | Path, build: Path, models: Path, args: argparse.Namespace) -> tuple[int, Path, float]:
    side = build / name
    if side.exists():
        shutil.rmtree(side)
    shutil.copytree(TESTS, side / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    record = side / "record.json"
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "PYTHONPATH")}
    env |= {"LLAMA_CPP_DOWNSTREAM_MODELS": str(models), "LLAMA_CPP_DOWNSTREAM_RECORD": str(record)}
    t0 = time.monotonic()
    done = proc.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests", *args.pytest_args],
                    check=False, capture=False, env=env, cwd=side, timeout=args.timeout)
    return done.returncode, record, time.monotonic() - t0


def run(args: argparse.Namespace) -> int:
    from ..differential import compare, upstream
    from ..differential.models import write_models

    build = args.build_dir or cache_root() / "downstream"
    build.mkdir(parents=True, exist_ok=True)
    models = write_models(build / "models.json", args.no_gemma)
    lines = library_lines()
    t0 = time.monotonic()
    failed = install_libraries(args.python, lines)
    print(f"libraries installed on llama-cpp-python {installed_version(args.python)} in {time.monotonic() - t0:.0f} s")
    for line, why in failed.items():
        print(f"NOT INSTALLED {line} (its tests skip):\n{why}")
    rc, here_record, here_s = run_side("here", args.python, build, models, args)
    print(f"this package: pytest exit {rc} in {here_s:.0f} s")
    if args.no_upstream:
        return rc
    wheel = upstream.ensure_wheel()
    up_python = upstream.venv(wheel.wheel, build / "upstream-venv")
    up_failed = install_libraries(up_python, lines)
    for line, why in up_failed.items():
        print(f"NOT INSTALLED under upstream {line}:\n{why}")
    up_rc, up_record, up_s = run_side("upstream", up_python, build, models, args)
    print(f"upstream 0.3.36: pytest exit {up_rc} in {up_s:.0f} s")
    if not up_record.is_file() or not here_record.is_file():
        print("no outputs to compare: a side's pytest run did not finish")
        return rc or up_rc or 1
    report = compare.compare(json.loads(up_record.read_text()), json.loads(here_record.read_text()),
                             known=compare.DOWNSTREAM_KNOWN)
    print("\n".join(report.lines()))
    print(f"outputs vs upstream: {report.summary()}")
    return rc or (0 if not report.different else 1)

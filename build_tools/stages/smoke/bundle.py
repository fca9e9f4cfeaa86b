"""GPU smoke of a CUDA wheel: :func:`prepare_bundle` a self-contained folder here, :func:`run_bundle` it on a GPU machine.

A GPU machine may have no network, no repository and none of the release tool's
dependencies, so everything travels as one folder::

    bundle.json     what is inside, with the sha256 of every file
    run.sh          python3 -S -m build_tools.stages.smoke "$(dirname "$0")", with tooling/ on the path
    tooling/        a copy of build_tools (this stage is standard library only at import)
    wheels/         the CUDA wheel and every dependency wheel (numpy, jinja2, NVIDIA's runtime)
                    for each target Python
    models/         the smoke models (:data:`.models.FIXTURES`), one file per role

:func:`run_bundle` verifies the hashes and runs the release smoke's own cell
(:func:`.runner.install_and_run`: a fresh venv, ``--no-index`` from ``wheels/``, the workload
from an empty folder) with the workload's GPU stages: the CUDA backend lists a GPU, every layer
is offloaded, and logits, greedy tokens, embeddings and MTP output agree with the CPU. It prints
a timing per stage; installing the wheels dominates, well under 5 minutes on a fresh machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...common.hashing import sha256_file
from ...common.interpreters import probe
from ...common.pip import pip
from ...errors import SmokeError, SmokeInputError
from . import workload
from .models import SmokeModels, fixture_models
from .runner import failed_stages, install_and_run, requires_dist, run_checked

log = logging.getLogger(__name__)

BUNDLE_SCHEMA = 2
MODEL_FILES = {"generation": "llama.gguf", "embedding": "embed.gguf", "mtp": "mtp-echo.gguf"}
TOOLING = Path(__file__).resolve().parents[2]  # the build_tools package
RUN_SH = """#!/bin/sh
d="$(cd "$(dirname "$0")" && pwd)"
# -S: no site-packages, so the tool provably needs nothing the machine may lack.
PYTHONPATH="$d/tooling" PYTHONDONTWRITEBYTECODE=1 exec python3 -S -m build_tools.stages.smoke "$d" "$@"
"""
_NVIDIA_REQ = re.compile(r"^nvidia-", re.IGNORECASE)
_DOWNLOAD_TIMEOUT = 1800.0


# ============================================================================ bundle files

def bundle_files(root: Path) -> dict[str, str]:
    """sha256 of every file of the bundle but ``bundle.json`` and what running it leaves behind."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != "bundle.json" and "__pycache__" not in p.parts:
            out[rel] = sha256_file(p)
    return out


def verify_bundle(root: Path) -> dict[str, Any]:
    """Load ``bundle.json`` and check every listed file's hash; raise naming the problems."""
    meta_path = root / "bundle.json"
    if not meta_path.is_file():
        raise SmokeInputError(f"{root} is not a GPU smoke bundle (no bundle.json): run `gpu-smoke prepare` first")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("schema") != BUNDLE_SCHEMA:
        raise SmokeInputError(f"{meta_path}: schema {meta.get('schema')} is not {BUNDLE_SCHEMA}: prepare it again")
    problems = []
    for rel, digest in meta["files"].items():
        p = root / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_file(p) != digest:
            problems.append(f"{rel}: sha256 differs from bundle.json")
    if problems:
        raise SmokeInputError(f"bundle {root} is damaged: " + "; ".join(problems) + "; prepare it again")
    return meta


# ============================================================================ prepare (here)

def _platform_tags(wheel: Path) -> list[str]:
    tags = wheel.name[:-4].split("-")[-1].split(".")
    # Dependency wheels (numpy, NVIDIA's) use older manylinux tags than ours may.
    extra = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]
    return list(dict.fromkeys(t for t in tags + extra if t != "any"))


def _pip_download(reqs: Sequence[str], dest: Path, python: str, platforms: Sequence[str]) -> None:
    """Binary wheels of ``reqs`` (and their dependencies) for CPython ``python`` on ``platforms``."""
    abi = "cp" + python.replace(".", "")
    cmd = pip("download", "--quiet", "--only-binary=:all:", "--dest", str(dest), "--python-version", python,
              "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none")
    run_checked(cmd + [a for p in platforms for a in ("--platform", p)] + list(reqs),
                f"pip download for Python {python}", _DOWNLOAD_TIMEOUT)


def _python_of(wheel: Path) -> set[str]:
    """Python versions a wheel's tags accept (cp310 -> 3.10; py3 -> every one, ``*``)."""
    out = set()
    for t in wheel.name[:-4].split("-")[-3].split("."):
        m = re.match(r"^cp3(\d+)$", t)
        if m:
            out.add(f"3.{m.group(1)}")
        elif t in ("py3", "py2.py3"):
            out.add("*")
    return out


def _wheel_version(filename: str) -> str:
    return filename.split("-")[1]


def _copy_models(models_dir: Path, models_from: Path | None) -> dict[str, str]:
    """Fill ``models_dir`` (from an earlier bundle's, or generated) and return the file of each role."""
    if models_from is not None:
        shutil.copytree(models_from, models_dir)
        return {role: name for role, name in MODEL_FILES.items() if (models_dir / name).is_file()}
    models = fixture_models()
    if models.reason:
        raise SmokeError(f"cannot generate the smoke models: {models.reason}")
    models_dir.mkdir(parents=True)
    for role, path in models.paths().items():
        shutil.copyfile(path, models_dir / MODEL_FILES[role])
    return {role: MODEL_FILES[role] for role in models.paths()}


def prepare_bundle(out: Path, wheels: Sequence[Path], *, config: str, pythons: Sequence[str],
                   nvidia_wheels: bool = True, models_from: Path | None = None) -> dict[str, Any]:
    """Assemble the bundle at ``out`` (replaced if present) and return its ``bundle.json`` content."""
    if not wheels:
        raise SmokeInputError("no CUDA wheel given: pass --wheel (build it with `nox -s wheels -- CONFIG`)")
    for w in wheels:
        if not w.is_file() or w.suffix != ".whl":
            raise SmokeInputError(f"{w} is not a wheel file")
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    started = time.monotonic()
    chosen: dict[str, str] = {}
    for python in pythons:
        wheel = next((w for w in wheels if {python, "*"} & _python_of(w)), None)
        if wheel is None:
            raise SmokeInputError(f"none of {[w.name for w in wheels]} installs on Python {python}")
        chosen[python] = wheel.name
        if not (out / "wheels" / wheel.name).exists():
            shutil.copy2(wheel, out / "wheels" / wheel.name)
        reqs = [r for r in requires_dist(wheel) if nvidia_wheels or not _NVIDIA_REQ.match(r)]
        if reqs:
            _pip_download(reqs, out / "wheels", python, _platform_tags(wheel))
    models = _copy_models(out / "models", models_from)
    shutil.copytree(TOOLING, out / "tooling" / TOOLING.name, ignore=shutil.ignore_patterns("__pycache__"))
    run_sh = out / "run.sh"
    run_sh.write_text(RUN_SH)
    run_sh.chmod(0o755)
    meta = {"schema": BUNDLE_SCHEMA, "config": config, "wheels": chosen, "nvidia_wheels": nvidia_wheels,
            "models": models, "files": bundle_files(out)}
    (out / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    size = sum((out / rel).stat().st_size for rel in meta["files"])
    log.info("GPU smoke bundle %s: %d files, %.1f MB, prepared in %.0f s", out, len(meta["files"]),
             size / 1e6, time.monotonic() - started)
    return meta


# ============================================================================ run (GPU machine)

def format_report(report: dict[str, Any], wheel: str = "") -> str:
    lines = [f"GPU smoke of {wheel}" if wheel else "GPU smoke"]
    for name, st in report.get("stages", {}).items():
        lines.append(f"  {name:11s} {st['status'].upper():4s} {st.get('seconds', 0):7.2f} s  {st.get('detail', '')}")
    for k, v in report.get("timings", {}).items():
        lines.append(f"  time {k:9s} {v:7.2f} s")
    return "\n".join(lines)


def run_bundle(bundle: Path, *, python: str | None = None, out: Path | None = None, allow_cpu: bool = False,
               timeout: float = 270.0) -> int:
    """Install the bundle's wheel in a fresh venv and run the GPU stages in it; print the report.

    0 when every stage passed, 1 otherwise; a bundle that cannot run raises :class:`SmokeError`.
    """
    t0 = time.monotonic()
    bundle = bundle.resolve()
    meta = verify_bundle(bundle)
    python = python or sys.executable
    info = probe(Path(python))
    if info is None:
        raise SmokeInputError(f"{python} does not run")
    ver = ".".join(info["version"].split(".")[:2])
    wheel = meta["wheels"].get(ver)
    if wheel is None:
        raise SmokeInputError(f"the bundle has wheels for Python {sorted(meta['wheels'])}, not {ver} "
                              f"({python}): prepare it with --python {ver} or pass --python")
    verified = time.monotonic() - t0
    models = SmokeModels(**{role: bundle / "models" / name for role, name in meta["models"].items()})
    report = install_and_run(Path(python), bundle / "wheels" / wheel, models, stages=workload.FIXTURE_GPU_STAGES,
                             find_links=lambda _py: [bundle / "wheels"], version=_wheel_version(wheel),
                             flags=["--allow-cpu"] if allow_cpu else [],
                             system_site_packages=not meta["nvidia_wheels"],  # NVIDIA's runtime is the machine's
                             timeout=timeout)
    report["timings"] = {"verify": round(verified, 2), **report["timings"],
                         "total": round(time.monotonic() - t0, 2)}
    print(format_report(report, wheel))
    if out is not None:
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 1 if failed_stages(report) or not report.get("stages") else 0


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of running a bundle (``gpu-smoke run`` and the bundle's own ``run.sh``)."""
    p.add_argument("bundle", type=Path, help="the folder `gpu-smoke prepare` wrote")
    p.add_argument("--python", default=None, help="interpreter for the venv (default: this one)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--allow-cpu", action="store_true",
                   help="do not require a GPU (runs the GPU side on the CPU: checks the bundle itself)")

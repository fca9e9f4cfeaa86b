"""GPU smoke of a CUDA wheel: `prepare CONFIG --out DIR --wheel W` here, then `run DIR` on a GPU machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import BuildToolsError
from ..inputs.configs import load_matrix
from ..options import path_arg
from ..stages import smoke
from ..stages.smoke.bundle import add_run_arguments

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="mode", required=True)
    prep = sub.add_parser("prepare", help="write a self-contained bundle: wheels, dependency wheels, models")
    prep.add_argument("config", help="the CUDA configuration the wheel was built from (e.g. cuda-13.0)")
    prep.add_argument("--out", type=path_arg, required=True, help="bundle folder (replaced)")
    prep.add_argument("--wheel", type=path_arg, action="append", default=[], help="a CUDA wheel (repeatable)")
    prep.add_argument("--wheels-dir", type=path_arg, default=None,
                      help="take every wheel of the configuration's local version from this folder")
    prep.add_argument("--python", action="append", default=[],
                      help="target Python X.Y on the GPU machine (repeatable; default: this interpreter's)")
    prep.add_argument("--no-nvidia-wheels", action="store_true",
                      help="leave NVIDIA's runtime wheels out (the GPU machine's site-packages has them)")
    prep.add_argument("--models-from", type=path_arg, default=None,
                      help="copy the models from an earlier bundle's models/ instead of generating them")
    add_run_arguments(sub.add_parser("run", help="install the bundled wheel in a fresh venv and run the GPU checks"))


def _wheels(args: argparse.Namespace, local: str | None) -> list[Path]:
    wheels = list(args.wheel)
    if args.wheels_dir is not None:
        if not args.wheels_dir.is_dir():
            raise BuildToolsError(f"--wheels-dir {args.wheels_dir} is not a directory")
        tag = f"+{local}-" if local else "-"
        wheels += sorted(w for w in args.wheels_dir.glob("*.whl") if tag in w.name)
    return wheels


def run(args: argparse.Namespace) -> int:
    if args.mode == "prepare":
        config = load_matrix().get(args.config)
        if config.backend != "cuda":
            raise BuildToolsError(f"{config.name} is not a CUDA configuration")
        pythons = args.python or [f"{sys.version_info.major}.{sys.version_info.minor}"]
        meta = smoke.prepare_bundle(args.out, _wheels(args, config.local_version), config=config.name,
                                    pythons=pythons, nvidia_wheels=not args.no_nvidia_wheels,
                                    models_from=args.models_from)
        size = sum((args.out / rel).stat().st_size for rel in meta["files"])
        print(f"GPU smoke bundle: {args.out} ({len(meta['files'])} files, {size / 1e6:.1f} MB)")
        print(f"  on the GPU machine: sh {args.out / 'run.sh'}")
        return 0
    return smoke.run_bundle(args.bundle, python=args.python, out=args.out, allow_cpu=args.allow_cpu)

"""Report what changed in llama.h/mtmd.h (and the bound ggml API) against the bindings, as a checklist."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bindgen.compare import compare
from ..bindgen.headers import VENDOR, parse_api
from ..options import path_arg

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--against", type=path_arg, metavar="DIR",
                   help="root of the llama.cpp tree to compare with (default: vendor/llama.cpp)")


def run(args: argparse.Namespace) -> int:
    root = Path(args.against).resolve() if args.against else VENDOR
    rep = compare(parse_api(root))
    sys.stdout.write(rep.render())
    return 0 if rep.clean else 1

"""Print the CI matrices (release configurations × Python versions) from manifests/configs.toml."""

from __future__ import annotations

import argparse
import json

from ..inputs.matrix import ci_matrices

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object (the default)")
    form.add_argument("--github-output", action="store_true",
                      help="NAME=JSON lines, one per matrix, for $GITHUB_OUTPUT")


def run(args: argparse.Namespace) -> int:
    matrices = ci_matrices()
    if args.github_output:
        for name, value in matrices.items():
            print(f"{name}={value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))}")
    else:
        print(json.dumps(matrices, indent=2))
    return 0

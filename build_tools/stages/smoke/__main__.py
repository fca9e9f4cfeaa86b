"""``python -m build_tools.stages.smoke BUNDLE``: run a GPU smoke bundle (what its ``run.sh`` does)."""

from __future__ import annotations

import argparse
import logging
import sys

from ...errors import SmokeError
from .bundle import add_run_arguments, run_bundle


def main() -> int:
    p = argparse.ArgumentParser(prog="run.sh", description="install the bundled wheel in a fresh venv and "
                                                           "compare its GPU results with the CPU")
    add_run_arguments(p)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return run_bundle(args.bundle, python=args.python, out=args.out, allow_cpu=args.allow_cpu)
    except SmokeError as exc:
        print(f"gpu-smoke: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())

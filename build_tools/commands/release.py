"""vendor → native → wheels → validate → smoke → publish for configurations, reusing cached steps."""

from __future__ import annotations

import argparse

from .. import release
from ..stages import publish
from ._common import path_arg, resolve_configs

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="*", help="configuration names (default: the matrix default)")
    p.add_argument("--dist", type=path_arg, default=release.DIST, help="wheels base (dist/<config>/)")
    p.add_argument("--out", type=path_arg, default=publish.DEFAULT_OUT, help="index folder")
    p.add_argument("--single", action="store_true", help="one py3-none wheel per configuration")
    p.add_argument("--strict", action="store_true", help="every interpreter 3.10-3.14 must be present")
    p.add_argument("--python", action="append", default=None, metavar="X.Y", help="interpreters for smoke")
    p.add_argument("--no-smoke-cache", action="store_true", help="re-run smoke cells that passed before")
    p.add_argument("--force-wheels", action="store_true", help="rebuild wheels even if unchanged")
    p.add_argument("-j", "--jobs", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    summary = release.release(
        resolve_configs(args.configs), out=args.out, dist_base=args.dist, single=args.single,
        strict=args.strict, python_versions=args.python, smoke_cache=not args.no_smoke_cache,
        jobs=args.jobs, force_wheels=args.force_wheels,
    )
    for c in summary.configs:
        if c.smoke_table:
            print(f"\n[{c.config}] smoke\n{c.smoke_table}")
    print(summary.render())
    return 0 if summary.ok else 1

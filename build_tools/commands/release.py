"""vendor → native → wheels → validate → smoke → publish for configurations, reusing cached steps."""

from __future__ import annotations

import argparse

from .. import release
from ..options import Options, add_configs, add_dist, add_index_out, add_jobs, add_pythons, add_strict

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    add_dist(p)
    add_index_out(p)
    p.add_argument("--single", action="store_true", help="one py3-none wheel per configuration")
    add_strict(p)
    add_pythons(p)
    p.add_argument("--no-smoke-cache", action="store_true", help="re-run smoke cells that passed before")
    p.add_argument("--force-wheels", action="store_true", help="rebuild wheels even if unchanged")
    add_jobs(p)


def run(args: argparse.Namespace) -> int:
    options = Options.from_args(args)
    summary = release.release(
        options.configs, out=options.out, dist_base=options.dist, single=args.single, strict=options.strict,
        python_versions=options.pythons, smoke_cache=not args.no_smoke_cache, jobs=options.jobs,
        force_wheels=args.force_wheels,
    )
    for c in summary.configs:
        if c.smoke_table:
            print(f"\n[{c.config}] smoke\n{c.smoke_table}")
    print(summary.render())
    return 0 if summary.ok else 1

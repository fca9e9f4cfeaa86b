"""Check the wheels in dist/<config>/ against the native manifest; refuse the release on any mismatch."""

from __future__ import annotations

import argparse

from ..inputs.lock import load_lock
from ..options import Options, add_configs, add_dist, path_arg
from ..stages import validate
from ..stages.native import build as native
from ..stages.native.manifest import load_manifest
from ..stages.vendor import current_tree

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    add_dist(p)
    p.add_argument("--manifest", type=path_arg, default=None,
                   help="native manifest to check against (default: the cached native build's)")
    p.add_argument("--no-twine", action="store_true", help="skip `twine check` (metadata)")


def run(args: argparse.Namespace) -> int:
    failed = 0
    for config, dist in Options.from_args(args).dist_dirs():
        if args.manifest:
            manifest = load_manifest(args.manifest)
        else:
            lock = load_lock()
            manifest = native.run(config, lock, current_tree(lock), allow_build=False).manifest
        report = validate.run(dist.wheels(), manifest, config, dist.path, twine=not args.no_twine)
        print(report.render())
        failed += not report.ok
    return 1 if failed else 0

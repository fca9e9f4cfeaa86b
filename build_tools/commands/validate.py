"""Check the wheels in dist/<config>/ against the native manifest; refuse the release on any mismatch."""

from __future__ import annotations

import argparse

from .. import release
from ..stages.native.manifest import load_manifest
from ..stages.wheels.build import load_record
from ._common import path_arg, resolve_configs

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="*", help="configuration names (default: the matrix default)")
    p.add_argument("--dist", type=path_arg, default=release.DIST, help="wheels base (dist/<config>/)")
    p.add_argument("--manifest", type=path_arg, default=None,
                   help="native manifest to check against (default: the cached native build's)")
    p.add_argument("--no-twine", action="store_true", help="skip `twine check` (metadata)")


def run(args: argparse.Namespace) -> int:
    failed = 0
    for config in resolve_configs(args.configs):
        out_dir = release.dist_dir(config, args.dist)
        _key, wheels = load_record(out_dir)
        manifest = load_manifest(args.manifest) if args.manifest else \
            release.native_build(config, build=False).manifest
        report = release.run_validate(wheels, manifest, config, out_dir, twine=not args.no_twine)
        print(report.render())
        failed += not report.ok
    return 1 if failed else 0

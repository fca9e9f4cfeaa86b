"""Write the PEP 503 index of the validated, smoke-tested wheels (dist/index by default); uploads opt-in."""

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
    p.add_argument("--twine", action="store_true",
                   help="also upload with twine to $TWINE_REPOSITORY_URL (credentials from the environment)")
    p.add_argument("--github-release", metavar="TAG", help="also attach the wheels to GitHub release TAG (gh)")
    p.add_argument("--release-only", action="store_true", help="refuse development configurations")


def run(args: argparse.Namespace) -> int:
    dirs = [release.dist_dir(c, args.dist) for c in resolve_configs(args.configs)]
    index = publish.publish(dirs, args.out, allow_dev=not args.release_only)
    for v in index.variants():
        print(f"{v}: {index.root / v}/  (pip install --index-url {index.variant_url(v)} llama-cpp-python)")
    for f in index.new:
        print(f"  {f.filename}  {f.sha256[:16]}")
    new_files = [d / f.filename for d in dirs for f in index.new if (d / f.filename).is_file()]
    if args.twine:
        publish.upload_twine(new_files)
    if args.github_release:
        publish.upload_github(new_files, args.github_release)
    return 0

"""Write the PEP 503 index of the validated, smoke-tested wheels (dist/index by default); uploads opt-in."""

from __future__ import annotations

import argparse

from ..options import Options, add_configs, add_dist, add_index_out
from ..stages import hosted, publish

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    add_dist(p)
    add_index_out(p)
    p.add_argument("--twine", action="store_true",
                   help="also upload with twine to $TWINE_REPOSITORY_URL (credentials from the environment)")
    p.add_argument("--github-release", metavar="TAG", help="also attach the wheels to GitHub release TAG (gh)")
    p.add_argument("--release-only", action="store_true", help="refuse development configurations")
    p.add_argument("--merge-from", metavar="URL",
                   help="first fetch the hosted index at URL (the folder holding whl/) into --out, verified")
    p.add_argument("--no-sdist", action="store_true", help="leave dist/sdist/'s validated sdist out")


def run(args: argparse.Namespace) -> int:
    options = Options.from_args(args)
    dirs = [d for _c, d in options.dist_dirs()]
    if args.merge_from:
        hosted.fetch(args.merge_from, options.out)
    sd = None if args.no_sdist else publish.cleared_sdist(options.dist / "sdist")
    index = publish.run(dirs, options.out, allow_dev=not args.release_only, sdist=sd)
    for v in index.variants():
        print(f"{v}: {index.root / v}/  (pip install --index-url {index.variant_url(v)} llama-cpp-python)")
    for f in index.new:
        print(f"  {f.filename}  {f.sha256[:16]}")
    new_files = sorted({f.filename: f.path for f in index.new}.values())
    if args.twine:
        publish.upload_twine(new_files)
    if args.github_release:
        publish.upload_github(new_files, args.github_release)
    return 0

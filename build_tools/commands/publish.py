"""Write the PEP 503 index of the validated, smoke-tested wheels (dist/index by default); uploads opt-in."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..options import Options, add_configs, add_dist, add_index_out, path_arg
from ..stages import hosted, publish

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    add_dist(p)
    add_index_out(p)
    p.add_argument("--twine", action="store_true",
                   help="also upload with twine to $TWINE_REPOSITORY_URL (credentials from the environment)")
    p.add_argument("--link-base", metavar="URL",
                   help="link the new files at URL<filename> (e.g. https://github.com/OWNER/REPO/releases/download/"
                        "TAG/) instead of putting them beside the pages: the index then holds HTML and lists only")
    p.add_argument("--assets", metavar="DIR", type=path_arg,
                   help="lay out this release's files and its SHA256SUMS-<variant> lists in DIR (an empty folder)")
    p.add_argument("--github-release", metavar="TAG",
                   help="also attach this release's files to GitHub release TAG (gh) and check each is an asset "
                        "under its own name (at --link-base, when given)")
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
    index = publish.run(dirs, options.out, allow_dev=not args.release_only, sdist=sd, link_base=args.link_base)
    for v in index.variants():
        print(f"{v}: {index.root / v}/  (pip install --index-url {index.variant_url(v)} llama-cpp-python)")
    for f in index.new:
        print(f"  {f.filename}  {f.sha256[:16]}" + (f"  -> {f.url}" if f.url else ""))
    if args.twine:
        publish.upload_twine(sorted({f.filename: f.path for f in index.new if f.path}.values()))
    if args.assets or args.github_release:
        folder = args.assets or Path(tempfile.mkdtemp(prefix="release-assets-"))
        assets = publish.release_assets(index, folder)
        print(f"release assets: {folder}/ ({len(assets)} files)")
        if args.github_release:
            publish.upload_github(assets, args.github_release, args.link_base)
    return 0

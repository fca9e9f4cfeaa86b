"""Fetch, verify and unpack the pinned llama.cpp into vendor/llama.cpp."""

from __future__ import annotations

import argparse

from ..inputs.lock import load_lock
from ..options import path_arg
from ..stages import vendor

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", help="a source name from the lock (default: the lock's default)")
    p.add_argument("--from-path", type=path_arg, help="vendor from a llama.cpp checkout on disk")
    p.add_argument("--archive", type=path_arg, help="use this local sdist instead of downloading")
    p.add_argument("--force", action="store_true", help="unpack again even if up to date")


def run(args: argparse.Namespace) -> int:
    tree = vendor.run(load_lock(), args.source, from_path=args.from_path, archive=args.archive, force=args.force)
    print(f"vendor/llama.cpp: {tree.source}\n  tree sha256 {tree.tree_sha256}")
    return 0

"""Build (or reuse from the cache) the native libraries of build configurations."""

from __future__ import annotations

import argparse
import time

from ..inputs.lock import load_lock
from ..options import Options, add_configs, add_jobs
from ..stages.native import build as native
from ..stages.vendor import current_tree

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    p.add_argument("--verify", action="store_true", help="rehash a finished build against its manifest")
    p.add_argument("--tools", action="store_true", help="also build llama.cpp's reference programs")
    p.add_argument("--force", action="store_true", help="rebuild even on a cache hit")
    p.add_argument("--print-key", action="store_true",
                   help="print each configuration's content key and result directory, build nothing "
                        "(CI cache keys); provisions a CUDA toolkit if the key needs its versions")
    add_jobs(p)


def _verify(configs, lock, tree) -> int:
    failed = 0
    for config in configs:
        p = native.plan(config, lock, tree)
        nb = native.find_finished(p)
        if nb is None:
            print(f"{config.name}: no finished build for key {p.key[:16]}; run `nox -s native -- {config.name}`")
            failed += 1
            continue
        problems = native.verify(nb.root)
        print(f"{config.name}: {'OK' if not problems else 'FAILED'} "
              f"({len(nb.manifest.libraries)} libraries, {nb.root})")
        for problem in problems:
            print(f"  {problem}")
        failed += bool(problems)
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    lock = load_lock()
    configs = Options.from_args(args).configs
    tree = current_tree(lock)
    if args.verify:
        return _verify(configs, lock, tree)
    if args.print_key:
        for config in configs:
            p = native.plan(config, lock, tree)
            print(f"{config.name} {p.key} {native.result_dir(p)}")
        return 0
    for config in configs:
        started = time.monotonic()
        p = native.plan(config, lock, tree)
        nb = native.build(p, jobs=args.jobs, force=args.force)
        if args.tools:
            native.build_reference_tools(nb, p, jobs=args.jobs)
        state = "reused (cache hit)" if nb.reused else "built"
        print(f"{config.name}: {state} in {time.monotonic() - started:.1f} s, key {nb.key[:16]}")
        print(f"  {nb.root}")
        for lib in nb.manifest.libraries:
            print(f"  {lib.path:40s} {lib.size:>10d}  {lib.sha256[:16]}")
    return 0

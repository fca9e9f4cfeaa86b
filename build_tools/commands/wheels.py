"""Repack a finished native build into CPython 3.10-3.14 wheels (or one py3 wheel), then repair them (auditwheel on Linux, delvewheel on Windows)."""

from __future__ import annotations

import argparse

from ..inputs.lock import load_lock
from ..options import Options, add_configs, add_dist, add_jobs, path_arg
from ..stages import wheels
from ..stages.native import build as native
from ..stages.vendor import current_tree
from ..stages.wheels.build import default_platform_tag

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    p.add_argument("--python-tags", default=",".join(wheels.PYTHON_TAGS), help="comma-separated cpXY tags")
    p.add_argument("--single", action="store_true", help="one py3-none-<platform> wheel instead")
    add_dist(p)
    p.add_argument("--platform-tag", default=None, help="tag before repair (default: this machine's)")
    p.add_argument("--epoch", type=int, default=None, help="SOURCE_DATE_EPOCH for the archive entries")
    p.add_argument("--no-repair", action="store_true", help="skip the repair (keeps linux_* tags; Windows wheels ungrafted)")
    p.add_argument("--build-native", action="store_true", help="build the native libraries if not cached")
    p.add_argument("--native-root", type=path_arg, default=None,
                   help="use this finished native build folder (e.g. a CI artifact) instead of the cache")
    p.add_argument("--force", action="store_true", help="rebuild even if the recorded wheels match")
    add_jobs(p)


def run(args: argparse.Namespace) -> int:
    options = Options.from_args(args)
    for config, dist in options.dist_dirs():
        if args.native_root:
            nb = native.from_root(config, args.native_root)
        else:
            lock = load_lock()
            nb = native.run(config, lock, current_tree(lock), allow_build=args.build_native, jobs=options.jobs)
        wheel_options = wheels.WheelOptions(
            out_dir=dist.path,
            python_tags=tuple(t.strip() for t in args.python_tags.split(",") if t.strip()),
            single=args.single, platform_tag=args.platform_tag or default_platform_tag(),
            epoch=args.epoch, jobs=options.jobs,
        )
        res = wheels.run(nb, config, wheel_options, repair_tags=not args.no_repair, force=args.force)
        if not res.reused:
            dist.forget_reports()
        state = "reused (content key unchanged)" if res.reused else "built"
        print(f"{config.name}: {len(res.wheels)} wheels {state} in {res.seconds:.1f} s -> {dist.path}")
        if res.platform_tag:
            print(f"  repaired: {res.platform_tag}")
        for w in res.wheels:
            print(f"  {w.filename}  {w.size / 1e6:6.1f} MB  {w.sha256[:16]}")
    return 0

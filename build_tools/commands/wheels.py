"""Repack a finished native build into CPython 3.10-3.14 wheels (or one py3 wheel), then auditwheel-retag."""

from __future__ import annotations

import argparse

from .. import release
from ..stages.wheels.build import PYTHON_TAGS, WheelOptions, default_platform_tag
from ._common import path_arg, resolve_configs

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="*", help="configuration names (default: the matrix default)")
    p.add_argument("--python-tags", default=",".join(PYTHON_TAGS), help="comma-separated cpXY tags")
    p.add_argument("--single", action="store_true", help="one py3-none-<platform> wheel instead")
    p.add_argument("--dist", type=path_arg, default=release.DIST, help="output base (dist/<config>/)")
    p.add_argument("--platform-tag", default=None, help="tag before repair (default: this machine's)")
    p.add_argument("--epoch", type=int, default=None, help="SOURCE_DATE_EPOCH for the archive entries")
    p.add_argument("--no-repair", action="store_true", help="skip auditwheel (keeps linux_* tags)")
    p.add_argument("--build-native", action="store_true", help="build the native libraries if not cached")
    p.add_argument("--native-root", type=path_arg, default=None,
                   help="use this finished native build folder (e.g. a CI artifact) instead of the cache")
    p.add_argument("--force", action="store_true", help="rebuild even if the recorded wheels match")
    p.add_argument("-j", "--jobs", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    for config in resolve_configs(args.configs):
        nb = release.native_from_root(config, args.native_root) if args.native_root else \
            release.native_build(config, build=args.build_native, jobs=args.jobs)
        options = WheelOptions(
            out_dir=release.dist_dir(config, args.dist),
            python_tags=tuple(t.strip() for t in args.python_tags.split(",") if t.strip()),
            single=args.single, platform_tag=args.platform_tag or default_platform_tag(),
            epoch=args.epoch, jobs=args.jobs,
        )
        res = release.make_wheels(nb, config, options, repair=not args.no_repair, force=args.force)
        state = "reused (content key unchanged)" if res.reused else "built"
        print(f"{config.name}: {len(res.wheels)} wheels {state} in {res.seconds:.1f} s -> {options.out_dir}")
        if res.platform_tag:
            print(f"  auditwheel: {res.platform_tag}")
        for w in res.wheels:
            print(f"  {w.filename}  {w.size / 1e6:6.1f} MB  {w.sha256[:16]}")
    return 0

"""Backend plugin wheels: build each GPU configuration's (dist/<config>/plugins/) and/or check it against the core wheel."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..dist import DistDir
from ..errors import MissingInputError
from ..inputs.configs import load_matrix
from ..inputs.lock import load_lock
from ..options import Options, add_configs, add_dist, path_arg
from ..stages import plugins
from ..stages.native import build as native
from ..stages.vendor import current_tree
from ..stages.wheels.build import default_platform_tag

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    add_dist(p)
    p.add_argument("--native-root", type=path_arg, default=None,
                   help="use this finished native build folder (e.g. a CI artifact) instead of the cache")
    p.add_argument("--core", type=path_arg, default=None,
                   help="the core wheel to check against (default: the matrix default's wheel for the platform tag)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--no-check", action="store_true", help="only build (the core wheel is checked later)")
    mode.add_argument("--check-only", action="store_true", help="only check dist/<config>/plugins/*.whl")
    p.add_argument("--withhold-oversize", action="store_true",
                   help="a plugin refused only for PyPI's per-file limit moves to dist/<config>/withheld/ and does "
                        "not fail the run (the release goes on without it on PyPI; every other check still fails)")


def _core_wheel(dist: Path, platform_tag: str) -> Path:
    core = DistDir.of(load_matrix().get(load_matrix().default), dist)
    found = sorted(w.path for w in core.wheels() if w.platform_tag == platform_tag)
    if not found:
        raise MissingInputError(f"no core wheel for {platform_tag} in {core.path}: run the wheels stage for "
                                f"{core.path.name} first, or name one with --core")
    return found[0]


def run(args: argparse.Namespace) -> int:
    failed = 0
    for config, dist in Options.from_args(args).dist_dirs():
        if plugins.plugin_key(config) is None:
            print(f"{config.name}: no GPU backend, no plugin wheel")
            continue
        if args.check_only:
            built = sorted((dist.path / "plugins").glob("*.whl"))
            if not built:
                raise MissingInputError(f"no plugin wheel in {dist.path / 'plugins'}")
        else:
            if args.native_root:
                nb = native.from_root(config, args.native_root)
            else:
                lock = load_lock()
                nb = native.run(config, lock, current_tree(lock), allow_build=False)
            try:
                tag = dist.wheels()[0].platform_tag  # the core wheels' tag after repair
            except Exception:  # noqa: BLE001 - no wheels stage here yet: the host's tag
                tag = default_platform_tag()
            built = [plugins.build(config, nb.manifest, nb.root, dist.path / "plugins", platform_tag=tag).path]
        for path in built:
            code = plugins.device_code(path)
            if args.no_check:
                print(f"{path}  {path.stat().st_size / 1e6:.1f} MB (not checked)")
            else:
                tag = path.name.rsplit("-", 1)[1].removesuffix(".whl")
                report = plugins.check(path, args.core or _core_wheel(args.dist, tag))
                print(report.render())
                if args.withhold_oversize and report.failures and {c for c, _m in report.failures} == {"size"}:
                    held = dist.path / "withheld"
                    held.mkdir(exist_ok=True)
                    path.replace(held / path.name)
                    print(f"  WITHHELD from PyPI: moved to {held / path.name} (until the project's per-file limit "
                          f"allows it, pip reports this extra's plugin as not found)")
                    continue
                failed += not report.ok
            if code:
                print(f"  device code per target, as stored: {code}")
    return 1 if failed else 0

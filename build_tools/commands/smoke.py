"""Install each wheel into a fresh venv per interpreter and run imports, embeddings and MTP decoding."""

from __future__ import annotations

import argparse

from .. import release
from ..common import interpreters
from ..stages import publish, smoke
from ..stages.validate import load_report
from ..stages.wheels.build import load_record
from ._common import path_arg, resolve_configs

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="*", help="configuration names (default: the matrix default)")
    p.add_argument("--dist", type=path_arg, default=release.DIST, help="wheels base (dist/<config>/)")
    p.add_argument("--python", action="append", default=None, metavar="X.Y",
                   help="interpreter versions to use (repeatable; default 3.10-3.14)")
    p.add_argument("--strict", action="store_true", help="a missing interpreter is an error, not a skip")
    p.add_argument("--stages", default=",".join(smoke.STAGES), help="workload stages to run")
    p.add_argument("--no-cache", action="store_true", help="re-run cells that passed before")
    p.add_argument("--require-gpu", action="store_true", help="assert a GPU backend loaded (GPU machines)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per step of a cell")
    p.add_argument("--merge-reports", nargs="+", type=path_arg, default=None, metavar="SMOKE_JSON",
                   help="run nothing: combine smoke.json files of per-interpreter CI jobs, then clear the "
                        "wheels for publishing if together they pass")
    p.add_argument("-j", "--jobs", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    stages = [s for s in args.stages.split(",") if s]
    if args.merge_reports:
        interps: list = []
        models = smoke.SmokeModels()
    else:
        interps = interpreters.find_all(args.python or interpreters.VERSIONS, strict=args.strict)
        models = smoke.fixture_models() if {"embedding", "mtp"} & set(stages) else smoke.SmokeModels()
    failed = 0
    for config in resolve_configs(args.configs):
        out_dir = release.dist_dir(config, args.dist)
        _key, wheels = load_record(out_dir)
        if args.merge_reports:
            report = smoke.merge_reports(args.merge_reports, wheels, strict=args.strict)
        else:
            report = smoke.run(wheels, interps, models, stages=stages, jobs=args.jobs, timeout=args.timeout,
                                 strict=args.strict, use_cache=not args.no_cache, require_gpu=args.require_gpu)
        smoke.save_report(report, out_dir)
        print(report.render())
        if not report.ok:
            failed += 1
            continue
        validation = load_report(out_dir)
        if tuple(stages) != smoke.STAGES:
            print(f"{config.name}: partial workload ({','.join(stages)}): no release manifest written")
        elif validation is None or not validation.get("ok"):
            print(f"{config.name}: no passing validation.json: run `nox -s validate -- {config.name}` before "
                  "smoke to clear the wheels for publishing")
        else:
            manifest = _embedded_manifest(wheels[0].path)
            path = publish.record_release(out_dir, config=config, wheels=wheels,
                                          validation=_Validated(validation), smoke=report,
                                          native=manifest, strict=args.strict)
            print(f"{config.name}: cleared for publishing: {path}")
    return 1 if failed else 0


def _embedded_manifest(wheel):
    """The native manifest a validated wheel embeds (validate proved it is the build's)."""
    import json
    import zipfile

    from ..stages.native.manifest import NativeManifest

    with zipfile.ZipFile(wheel) as zf:
        return NativeManifest.from_json(json.loads(zf.read("llama_cpp/native-manifest.json")), str(wheel))


class _Validated:
    """A saved validation.json seen through the ValidationReport interface record_release uses."""

    def __init__(self, data: dict) -> None:
        self.ok = bool(data.get("ok"))
        self.wheels = [_W(w) for w in data.get("wheels", [])]


class _W:
    def __init__(self, d: dict) -> None:
        self.sha256, self.ok = d.get("sha256"), bool(d.get("ok"))

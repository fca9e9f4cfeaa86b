"""Install each wheel into a fresh venv per interpreter and run imports, embeddings and MTP decoding."""

from __future__ import annotations

import argparse

from .. import dist as dist_mod
from ..common import interpreters
from ..options import Options, add_configs, add_dist, add_jobs, add_pythons, add_strict, path_arg
from ..stages import smoke

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_configs(p)
    add_dist(p)
    add_pythons(p)
    add_strict(p)
    p.add_argument("--stages", default=None,
                   help="workload stages to run (default: the configuration's, e.g. "
                        f"{','.join(smoke.STAGES)} for cpu; the GPU stages on lavapipe for vulkan)")
    p.add_argument("--no-cache", action="store_true", help="re-run cells that passed before")
    p.add_argument("--require-gpu", action="store_true", help="assert a GPU backend loaded (GPU machines)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per step of a cell")
    p.add_argument("--merge-reports", nargs="+", type=path_arg, default=None, metavar="SMOKE_JSON",
                   help="run nothing: combine smoke.json files of per-interpreter CI jobs, then clear the "
                        "wheels for publishing if together they pass")
    add_jobs(p)


def run(args: argparse.Namespace) -> int:
    options = Options.from_args(args)
    if args.merge_reports:
        interps: list[interpreters.Interpreter] = []
        models = smoke.SmokeModels()
    else:
        interps = interpreters.find_all(options.pythons or interpreters.VERSIONS, strict=options.strict)
        models = None
    failed = 0
    for config, dist in options.dist_dirs():
        wheels = dist.wheels()
        cleared_by = smoke.stages_for(config)
        stages = [s for s in args.stages.split(",") if s] if args.stages else list(cleared_by)
        if args.merge_reports:
            report = smoke.merge_reports(args.merge_reports, wheels, strict=options.strict)
        else:
            target = smoke.target_for(config)
            if models is None:
                models = smoke.fixture_models() if {"embedding", "mtp", "generation"} & set(stages) \
                    else smoke.SmokeModels()
            report = smoke.run(wheels, target.interpreters(interps), models, stages=stages, jobs=options.jobs,
                               timeout=args.timeout, strict=options.strict, use_cache=not args.no_cache,
                               require_gpu=args.require_gpu or target.require_gpu, env=target.env,
                               sandbox_for=target.sandbox_for)
        smoke.save_report(report, dist.path)
        print(report.render())
        if not report.ok:
            failed += 1
            continue
        validation = dist.validation()
        if tuple(stages) != cleared_by:
            print(f"{config.name}: partial workload ({','.join(stages)}): not cleared for publishing")
        elif validation is None or not validation.ok:
            print(f"{config.name}: no passing validation.json: run `nox -s validate -- {config.name}` before "
                  "smoke to clear the wheels for publishing")
        else:
            path = dist_mod.clear(dist, config=config, wheels=wheels, validation=validation, smoke=report,
                                  native=dist_mod.embedded_manifest(wheels[0].path), strict=options.strict)
            print(f"{config.name}: cleared for publishing: {path}")
    return 1 if failed else 0

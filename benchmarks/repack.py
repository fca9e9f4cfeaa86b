"""Repacking cost vs native build cost: how long 5 wheels take from an existing native build.

    python benchmarks/repack.py [CONFIG] [--runs N] [--no-repair]

The native build's time is ``NativeBuild.seconds`` when it was built in this process, else
the wall time of the ninja run that produced the libraries, read from the CMake tree's
``.ninja_log`` (start/end milliseconds per step; each ninja invocation restarts the clock).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.vendor import current_tree
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import repair


def ninja_library_seconds(build_dir: Path) -> tuple[float, float] | None:
    """(wall, summed CPU-step) seconds of the ninja run that linked libllama, from ``.ninja_log``."""
    log = build_dir / ".ninja_log"
    if not log.is_file():
        return None
    runs: list[list[tuple[int, int, str]]] = [[]]
    last_end = -1
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        start, end, out = int(parts[0]), int(parts[1]), parts[3]
        if end < last_end and runs[-1]:
            runs.append([])  # entries come in completion order: an earlier end means a new invocation
        last_end = end
        runs[-1].append((start, end, out))
    for run in runs:
        if any("libllama.so" in out for _s, _e, out in run):
            wall = (max(e for _s, e, _o in run) - min(s for s, _e, _o in run)) / 1000
            cpu = sum(e - s for s, e, _o in run) / 1000
            return wall, cpu
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="cpu-host")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-repair", action="store_true", help="time assembly only (no auditwheel)")
    args = p.parse_args()
    config = load_matrix().get(args.config)
    lock = load_lock()
    tree = current_tree(lock)
    nb = native.run(config, lock, tree, allow_build=False)
    build_dir = native.plan(config, lock, tree, install=False).build_dir
    if nb.seconds:
        native_s, native_cpu = nb.seconds, None
    else:
        found = ninja_library_seconds(build_dir)
        if found is None:
            print(f"no timing for the native build of {config.name} (no {build_dir / '.ninja_log'})")
            return 1
        native_s, native_cpu = found
    times = []
    sizes: list[int] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            built = wheels.build_wheels(nb, config, wheels.WheelOptions(out_dir=Path(tmp)))
            if not args.no_repair:
                built = repair.repair(built, nb.manifest).wheels
            times.append(time.perf_counter() - started)
            sizes = [w.size for w in built]
    repack = statistics.median(times)
    what = "assemble" if args.no_repair else "assemble + auditwheel"
    print(f"config {config.name}: {len(sizes)} wheels, {min(sizes) / 1e6:.2f}-{max(sizes) / 1e6:.2f} MB each")
    print(f"repack ({what}), median of {args.runs}: {repack:.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})")
    cpu = f", {native_cpu:.0f} s of compile steps" if native_cpu else ""
    print(f"native build (libraries): {native_s:.0f} s wall{cpu}")
    print(f"ratio repack / native: {repack / native_s:.4f}  ({native_s / repack:.0f}x faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

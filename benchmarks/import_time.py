"""Time ``import llama_cpp`` and the first native load, each in fresh subprocesses (prints numbers).

    python benchmarks/import_time.py [-n RUNS] [--lib-dir DIR]

Without ``--lib-dir`` the ``LLAMA_CPP_LIB_PATH`` environment (or the package's ``lib/``) is used.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STEPS = {
    "import llama_cpp": "import llama_cpp",
    "import llama_cpp.llama_cpp (bindings, no load)": "import llama_cpp.llama_cpp",
    "first load (libraries + backends + llama_backend_init)": (
        "import llama_cpp._native.loader as L\nL.load()"
    ),
    "first call llama_max_devices()": "import llama_cpp.llama_cpp as C\nC.llama_max_devices()",
}
TIMER = (
    "import time\nt0 = time.perf_counter()\n{body}\nt1 = time.perf_counter()\nprint(t1 - t0)\n"
)


def measure(body: str, runs: int, env: dict[str, str]) -> list[float]:
    out = []
    setup = "import llama_cpp\n" if "llama_cpp._native.loader" in body or "C.llama" in body else ""
    code = setup + TIMER.format(body=body)
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
        if r.returncode != 0:
            raise SystemExit(f"the timed step failed (pass --lib-dir <native build>/lib when the package has "
                             f"no lib/):\n{r.stderr.strip()[-1500:]}")
        out.append(float(r.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--runs", type=int, default=10)
    p.add_argument("--lib-dir", type=Path)
    args = p.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if args.lib_dir:
        env["LLAMA_CPP_LIB_PATH"] = str(args.lib_dir)
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, lib dir "
          f"{env.get('LLAMA_CPP_LIB_PATH', '(package lib/)')}")
    for name, body in STEPS.items():
        t = measure(body, args.runs, env)
        print(f"{name:58s} median {statistics.median(t) * 1e3:7.1f} ms  min {min(t) * 1e3:7.1f} ms"
              f"  max {max(t) * 1e3:7.1f} ms")
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import llama_cpp"], capture_output=True,
                       text=True, env=env, check=False)
    total = [line for line in r.stderr.splitlines() if line.rstrip().endswith("| llama_cpp")]
    if total:
        print("python -X importtime:", total[-1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build the sdist as a user would (``pip install <sdist>`` in a fresh venv) and run the smoke workload.

The build fetches scikit-build-core (and CMake/ninja when the machine has none) from the user's
package index, as pip does for any sdist; ``CMAKE_ARGS`` picks the backends. The pip log (CMake's
and ninja's progress included) is kept beside the result, and the build's wall time is reported:
it is the cold source-build time the README quotes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common.pip import pip
from ...errors import SmokeError
from ..smoke import runner, workload
from ..smoke.models import SmokeModels

log = logging.getLogger(__name__)


@dataclass
class SourceBuild:
    sdist: str
    cmake_args: str
    build_seconds: float
    log: Path
    stages: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.stages) and all(s.get("status") == "pass" for s in self.stages.values())


# CMAKE_ARGS that turn the Vulkan backend on (CMake's true constants)
_VULKAN_ON = re.compile(r"(^|\s)-DGGML_VULKAN(:BOOL)?=(on|1|true|yes|y)(\s|$)", re.I)


def vulkan_requested(cmake_args: str) -> bool:
    """Whether ``cmake_args`` builds the Vulkan backend: then the source build is smoke-tested as the
    Vulkan wheels are, with the GPU stages on lavapipe (:func:`..smoke.target_for`)."""
    return bool(_VULKAN_ON.search(cmake_args))


def install_and_smoke(sdist: Path, python: Path, models: SmokeModels, *, cmake_args: str = "",
                      jobs: int | None = None, stages: Sequence[str] = workload.RELEASE_STAGES,
                      log_path: Path, version: str, timeout: float = 7200.0,
                      workload_env: Mapping[str, str] | None = None, require_gpu: bool = False) -> SourceBuild:
    """``pip install -v <sdist>`` into a fresh venv of ``python`` (a cold build: no pip cache), then the
    workload (``workload_env``: a software Vulkan device, say; ``require_gpu``: a GPU backend must serve)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_CPP_") or k == "LLAMA_CPP_PYTHON_CACHE"}
    env["CMAKE_ARGS"] = cmake_args
    if jobs:
        env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs)
    with tempfile.TemporaryDirectory(prefix="sdist-build-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=300)
        py = venv / "bin" / "python"
        t = time.monotonic()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as logf:
            done = subprocess.run(pip("install", "-v", "--no-cache-dir", str(sdist), python=py), stdout=logf,
                                  stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
        seconds = time.monotonic() - t
        if done.returncode != 0:
            tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
            raise SmokeError(f"pip install {sdist.name} (CMAKE_ARGS={cmake_args!r}) failed after {seconds:.0f} s "
                             f"(log: {log_path}):\n" + "\n".join(tail))
        log.info("built %s from source in %.0f s (CMAKE_ARGS=%r)", sdist.name, seconds, cmake_args)
        work, out = Path(tmp) / "empty", Path(tmp) / "result.json"
        work.mkdir()
        done = subprocess.run([str(py), "-I", str(runner.WORKLOAD), "--out", str(out), "--stages", ",".join(stages),
                               "--version", version, "--source-build", *(["--require-gpu"] if require_gpu else []),
                               *models.workload_args(str)], cwd=work, env={**env, **(workload_env or {})},
                              capture_output=True, text=True, timeout=1800 * runner.load_factor(), check=False)
        if not out.is_file():
            raise SmokeError(f"the smoke workload on the source build wrote no result:\n{done.stderr[-3000:]}")
        result = json.loads(out.read_text(encoding="utf-8"))
    return SourceBuild(sdist.name, cmake_args, seconds, log_path, result.get("stages", {}))

"""Step 5, smoke: install each wheel in a fresh venv per interpreter and run the workload in it.

- :mod:`.workload` runs inside the venv (standard library and the installed ``llama_cpp`` only):
  one registry of stages, the CPU release's and a GPU machine's.
- :mod:`.runner` runs one wheel x interpreter cell, and every cell of a release in parallel.
- :mod:`.bundle` packs a CUDA wheel, its dependencies, the models and this package for a GPU
  machine, and runs it there with the runner's cell.
- :mod:`.report` is the ``smoke.json`` of a ``dist/<config>/``; :mod:`.models` the tiny models.
"""

from .bundle import prepare_bundle, run_bundle
from .models import SmokeModels, fixture_models
from .report import REPORT_FILE, SmokeReport, SmokeResult, load_report, merge_reports, save_report
from .runner import STAGES, compatible, run
from .target import SmokeTarget, stages_for, target_for

__all__ = [
    "REPORT_FILE",
    "STAGES",
    "SmokeModels",
    "SmokeReport",
    "SmokeResult",
    "SmokeTarget",
    "compatible",
    "fixture_models",
    "load_report",
    "merge_reports",
    "prepare_bundle",
    "run",
    "run_bundle",
    "save_report",
    "stages_for",
    "target_for",
]

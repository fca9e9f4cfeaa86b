"""Run llama-cpp-python 0.3.36's own test suite, unchanged, against this package.

``python -m build_tools compat`` takes the sdist the lock pins (fetched and sha256-checked by
:mod:`build_tools.stages.vendor`), extracts its ``tests/``, builds a local Hugging Face hub cache
holding generated stand-ins for the models those tests download (:mod:`.hub`, :mod:`.standins`),
and runs pytest on them with ``HF_HUB_OFFLINE=1`` (:mod:`.suite`). The tests that need a real
model's knowledge are listed, with reasons, in :data:`.suite.NEEDS_REAL_MODEL`.
"""

from .hub import HubFile, build_hub
from .standins import STAND_INS, stand_in_path, tiny_mamba
from .suite import NEEDS_REAL_MODEL, SuiteReport, run

__all__ = ["NEEDS_REAL_MODEL", "STAND_INS", "HubFile", "SuiteReport", "build_hub", "run", "stand_in_path",
           "tiny_mamba"]

"""The source distribution: ``llama_cpp_python-<version>.tar.gz`` with the pinned llama.cpp inside.

:func:`build` writes it, :func:`check` (validate's sdist half) refuses any file it cannot explain.
What goes in is one table each way (:data:`PROJECT_FILES`, :data:`LLAMA_CPP_FILES`): the project's
tracked files the build needs, and the part of the locked llama.cpp tree that ``CMakeLists.txt``
compiles (ggml with every backend, so ``CMAKE_ARGS="-DGGML_CUDA=on"`` works from it; src, include,
common, vendor, tools/mtmd; not models, docs, tests, examples or the other tools).
"""

from __future__ import annotations

from . import build as build_module
from .build import LLAMA_CPP_FILES, PROJECT_FILES, SOURCES_LISTING, Sdist, build, sdist_name
from .check import REPORT_FILE, SdistReport, check, save_report

__all__ = ["build_module", "LLAMA_CPP_FILES", "PROJECT_FILES", "SOURCES_LISTING", "Sdist", "SdistReport", "build", "check",
           "sdist_name", "save_report", "REPORT_FILE"]

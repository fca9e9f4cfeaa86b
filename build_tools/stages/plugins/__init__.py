"""Backend plugin wheels: a GPU backend's module as its own wheel (``llama-cpp-python-vulkan``,
``-cuda12``, ``-cuda13``), installed by the core wheel's extras and found by the loader through the
``llama_cpp.backends`` entry points (:mod:`llama_cpp._native.plugins`).

:func:`build` makes one from a GPU configuration's native build; :func:`check` (validate's plugin
half) refuses one whose base libraries are not the core wheel's, byte for byte, or whose version
is not the core's.
"""

from __future__ import annotations

from .build import (
    ENTRY_POINT_GROUP,
    PLUGIN_RECORD,
    BuiltPlugin,
    backend_family,
    build,
    plugin_key,
    plugin_name,
    plugin_package,
)
from .check import PYPI_FILE_LIMIT_MB, PluginReport, check, device_code

__all__ = ["ENTRY_POINT_GROUP", "PLUGIN_RECORD", "PYPI_FILE_LIMIT_MB", "BuiltPlugin", "PluginReport",
           "backend_family", "build", "check", "device_code", "plugin_key", "plugin_name", "plugin_package"]

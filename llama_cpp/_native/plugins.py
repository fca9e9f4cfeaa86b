"""Backend plugin wheels: which are installed, and where their backend modules are.

The discovery rule: a plugin wheel (``llama-cpp-python-vulkan``, ``-cuda12``, ``-cuda13``, installed
by the extras ``llama-cpp-python[vulkan]`` ...) declares an entry point in the group
``llama_cpp.backends``; its name is the backend family (``vulkan``, ``cuda``) and its value the
plugin's top-level package, whose ``lib/`` folder holds the backend module (``libggml-vulkan.so``).
Finding one imports nothing. The loader probes plugin modules after the core wheel's own backends
(the CPU variants), so the base libraries they link (``libggml-base``, ``libggml``) are the core
wheel's, already loaded. A plugin of another version than this package is reported, not loaded:
its module was built against other base libraries. ``LLAMA_CPP_BACKEND_PLUGINS=0`` turns discovery off.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

ENTRY_POINT_GROUP = "llama_cpp.backends"
ENV_PLUGINS = "LLAMA_CPP_BACKEND_PLUGINS"


@dataclass(frozen=True)
class Plugin:
    """One installed plugin: its distribution, the family it provides, and its ``lib/`` folder
    (None with a ``problem`` when it cannot be used)."""

    name: str
    version: str
    family: str
    lib_dir: Path | None
    problem: str | None = None


def discover(core_version: str) -> list[Plugin]:
    """The installed plugins, sorted by name (empty when ``LLAMA_CPP_BACKEND_PLUGINS=0``)."""
    if os.environ.get(ENV_PLUGINS, "").strip().lower() in ("0", "false", "no", "off"):
        return []
    from importlib.metadata import entry_points

    found: dict[str, Plugin] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        name = dist.metadata["Name"] if dist is not None else ep.value
        if name in found:
            continue  # the same distribution seen through two sys.path entries: the first wins, as for imports
        version = dist.version if dist is not None else "unknown"
        lib_dir, problem = None, None
        if version != core_version:
            problem = (f"{name} {version} was built for llama-cpp-python {version}, but {core_version} is installed: "
                       f"pip install {name}=={core_version}")
        else:
            spec = importlib.util.find_spec(ep.value) if ep.value.isidentifier() else None
            roots = list(spec.submodule_search_locations or []) if spec is not None else []
            if not roots or not (Path(roots[0]) / "lib").is_dir():
                problem = f"{name}: its package {ep.value!r} has no lib/ folder; reinstall {name}"
            else:
                lib_dir = Path(roots[0]) / "lib"
        found[name] = Plugin(name, version, ep.name, lib_dir, problem)
    return sorted(found.values(), key=lambda p: p.name)

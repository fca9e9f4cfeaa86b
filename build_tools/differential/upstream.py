"""Upstream llama-cpp-python 0.3.36, built from the sdist the lock pins, cached by content.

The key is the sdist's sha256, the interpreter tag, the machine and the CMake definitions: the
``cpu-host`` configuration's ISA (so both packages run the same CPU kernels and their floats
agree), OpenMP off as here, libraries only. A build takes about 6 minutes on 2 cores, under
``nice``; later runs reuse the wheel. ``venv()`` makes an environment holding it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import venv as _venv
from dataclasses import dataclass
from pathlib import Path

from ..common import pip, proc
from ..common.hashing import sha256_json
from ..common.locks import exclusive
from ..common.paths import cache_root
from ..errors import BuildToolsError
from ..inputs.configs import load_matrix
from ..inputs.lock import PypiSdistSource, load_lock
from ..stages.vendor import fetch_archive

log = logging.getLogger(__name__)

#: what upstream's wheel needs at run time (its own requirements, installed from the index)
RUNTIME_REQUIREMENTS = ("typing-extensions>=4.5.0", "numpy>=1.20.0", "diskcache>=5.6.1", "jinja2>=2.11.3")
LIBRARY_ONLY = {"LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_EXAMPLES": "OFF", "LLAMA_BUILD_TOOLS": "OFF",
                "LLAMA_BUILD_SERVER": "OFF"}


@dataclass(frozen=True)
class UpstreamWheel:
    wheel: Path
    key: str
    built: bool  # False: reused from the cache


def cmake_definitions(config: str = "cpu-host") -> dict[str, str]:
    """``-D`` definitions: the configuration's pinned ISA, native detection off, libraries only."""
    defs = {"GGML_NATIVE": "OFF", **dict(load_matrix().get(config).cmake), **LIBRARY_ONLY}
    return dict(sorted(defs.items()))


def _interpreter_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def cache_key(src: PypiSdistSource, defs: dict[str, str]) -> str:
    digest = sha256_json({"sdist": src.sha256, "python": _interpreter_tag(), "machine": platform.machine(),
                          "cmake": defs})
    return f"{src.version}-{src.sha256[:12]}-{_interpreter_tag()}-{digest[:12]}"


def upstream_dir() -> Path:
    return cache_root() / "upstream"


def ensure_wheel(archive: Path | None = None, *, nice: int = 10) -> UpstreamWheel:
    """The cached upstream wheel, built on first use."""
    lock = load_lock()
    src = lock.sources.get("pypi-sdist")
    if not isinstance(src, PypiSdistSource):
        raise BuildToolsError("manifests/llama.cpp.lock.json has no pypi-sdist source: nothing to build upstream from")
    defs = cmake_definitions()
    key = cache_key(src, defs)
    out = upstream_dir() / key
    with exclusive(upstream_dir() / f"{key}.lock"):
        found = sorted(out.glob("*.whl"))
        if found:
            return UpstreamWheel(found[0], key, built=False)
        sdist = fetch_archive(src, archive)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{key}.") as tmp:
            env = {**os.environ, "CMAKE_ARGS": " ".join(f"-D{k}={v}" for k, v in defs.items()),
                   "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
            cmd = pip.pip("wheel", "--no-deps", "-q", "-w", tmp, str(sdist), python=sys.executable)
            if os.name == "posix" and nice:
                cmd = ["nice", "-n", str(nice), *cmd]
            log.info("building upstream llama-cpp-python %s from %s (about 6 minutes on 2 cores)", src.version,
                     sdist.name)
            proc.run(cmd, what=f"building upstream llama-cpp-python {src.version}", env=env, timeout=7200)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if len(wheels) != 1:
                raise BuildToolsError(f"pip wheel left {len(wheels)} wheels in {tmp}, expected one")
            (Path(tmp) / "build.json").write_text(json.dumps({"sdist": src.sha256, "cmake": defs}, indent=2))
            shutil.move(str(Path(tmp)), str(out))
        return UpstreamWheel(out / wheels[0].name, key, built=True)


def venv(wheel: Path, where: Path) -> Path:
    """A virtual environment at ``where`` holding upstream's wheel (reused while it holds the same
    wheel); returns its interpreter."""
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    stamp = where / "upstream-wheel.txt"
    if python.exists() and stamp.is_file() and stamp.read_text() == wheel.name:
        return python
    if where.exists():
        shutil.rmtree(where)
    _venv.EnvBuilder(with_pip=True).create(where)
    proc.run(pip.pip("install", "-q", *RUNTIME_REQUIREMENTS, python=python), what="installing upstream's requirements")
    proc.run(pip.pip("install", "-q", "--no-deps", str(wheel), python=python), what="installing upstream's wheel")
    stamp.write_text(wheel.name)
    return python

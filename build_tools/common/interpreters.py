"""Find the CPython interpreters the smoke tests run under (3.10-3.14).

Search order per version, first working one wins: ``$LLAMA_CPP_PYTHONS`` (explicit paths,
``os.pathsep``-separated), ``pythonX.Y`` on ``PATH``, pyenv (``$PYENV_ROOT`` or
``~/.pyenv/versions/X.Y.*``, newest patch first), uv-managed installs, ``/usr/bin`` and
``/usr/local/bin``, the Windows ``py -X.Y`` launcher. A candidate counts only when it runs,
is CPython of that version, is not a free-threaded build, and has ``venv`` with ``ensurepip``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InterpreterError, ToolNotFoundError, ToolTimeoutError
from . import proc

VERSIONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
ENV = "LLAMA_CPP_PYTHONS"
_PROBE = (
    "import json, sys, sysconfig, importlib.util as u; print(json.dumps({"
    "'impl': sys.implementation.name, 'version': '%d.%d.%d' % sys.version_info[:3],"
    "'executable': sys.executable, 'gil_disabled': bool(sysconfig.get_config_var('Py_GIL_DISABLED')),"
    "'venv': u.find_spec('venv') is not None and u.find_spec('ensurepip') is not None}))"
)



@dataclass(frozen=True)
class Interpreter:
    """One wanted CPython version: where it is, or why it is not usable."""

    version: str  # "3.12"
    path: Path | None = None
    full_version: str | None = None
    reason: str | None = None  # why it was not found

    @property
    def found(self) -> bool:
        return self.path is not None

    @property
    def tag(self) -> str:
        return "cp" + self.version.replace(".", "")


def probe(path: Path, timeout: float = 20.0) -> dict | None:
    try:
        done = proc.run([path, "-I", "-c", _PROBE], check=False, timeout=timeout)
    except (OSError, ToolNotFoundError, ToolTimeoutError):
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parts[-3] if "versions" in path else path
    nums = []
    for part in name.replace("-", ".").split("."):
        nums.append(int(part) if part.isdigit() else -1)
    return tuple(nums)


def candidates(version: str) -> Iterable[Path]:
    """Possible executables for ``version`` in search order (not yet checked)."""
    for p in os.environ.get(ENV, "").split(os.pathsep):
        if p.strip():
            yield Path(p.strip())
    exe = shutil.which(f"python{version}")
    if exe:
        yield Path(exe)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = glob.glob(str(pyenv / f"{version}.*" / "bin" / "python3"))
    found = [f for f in found if Path(f).parts[-3].replace(".", "").isdigit()]  # skip 3.13t, 3.12-dev …
    yield from (Path(f) for f in sorted(found, key=_version_key, reverse=True))
    uv = Path(os.environ.get("UV_PYTHON_INSTALL_DIR", Path.home() / ".local" / "share" / "uv" / "python"))
    yield from (Path(f) for f in sorted(glob.glob(str(uv / f"cpython-{version}.*" / "bin" / "python3")),
                                          reverse=True))
    for d in ("/usr/local/bin", "/usr/bin"):
        yield Path(d) / f"python{version}"
    if sys.platform == "win32" and shutil.which("py"):
        try:
            out = proc.run(["py", f"-{version}", "-c", "import sys; print(sys.executable)"], check=False, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                yield Path(out.stdout.strip())
        except (OSError, ToolNotFoundError, ToolTimeoutError):
            pass


def find(version: str) -> Interpreter:
    """The first working CPython ``version`` (``Interpreter.reason`` says why none was)."""
    rejected: list[str] = []
    seen: set[Path] = set()
    for cand in candidates(version):
        if cand in seen or not cand.exists():
            continue
        seen.add(cand)
        info = probe(cand)
        if info is None:
            rejected.append(f"{cand}: does not run")
        elif info["impl"] != "cpython" or not info["version"].startswith(version + "."):
            continue  # another version (explicit paths are tried for every version)
        elif info["gil_disabled"]:
            rejected.append(f"{cand}: free-threaded build (its tag is {version}t)")
        elif not info["venv"]:
            rejected.append(f"{cand}: lacks venv/ensurepip (Debian: apt install python{version}-venv)")
        else:
            return Interpreter(version, cand, info["version"])
    reason = "not installed" + (f" ({'; '.join(rejected)})" if rejected else "")
    return Interpreter(version, None, None, reason)


def find_all(versions: Sequence[str] = VERSIONS, *, strict: bool = False) -> list[Interpreter]:
    """Every wanted version, found or not; ``strict`` turns a missing one into an error."""
    found = [find(v) for v in versions]
    missing = [i for i in found if not i.found]
    if strict and missing:
        raise InterpreterError(
            "missing interpreters (--strict): " + "; ".join(f"Python {i.version}: {i.reason}" for i in missing)
            + f". Install them (pyenv install {' '.join(i.version for i in missing)}) or list their paths in "
            f"${ENV}."
        )
    return found

"""Install a wheel into a fresh venv per interpreter and run the smoke workload in it.

Per (wheel, interpreter) cell: ``python -m venv``, ``pip install --no-index --find-links
<wheelhouse>`` of exactly that wheel file (its dependencies come from a per-interpreter
wheelhouse in the cache, downloaded once with ``pip download --only-binary :all:``, so later
runs are offline), then ``python -I workload.py`` from an empty directory with every
``LLAMA_CPP_*`` variable removed (the loader must find the wheel's own libraries). Cells run
in parallel; a passing cell's result is cached by (wheel sha256, interpreter, workload, stages,
models) so an unchanged re-run costs nothing. :func:`install_and_run` is the part a GPU bundle
runs too (see :mod:`.bundle`).

A cell may run inside a :class:`Sandbox`, another machine's userland on this one (an arm64
Debian under qemu-user, :mod:`.emulated`): the same steps, with the wheel, its dependency wheels,
the workload and the models staged into a folder the sandbox sees, and every command run there.

Standard library only at import (``BuiltWheel`` is a type here): a GPU bundle carries this
package to a machine without the release tool's dependencies.
"""

from __future__ import annotations

import email.parser
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...common import proc
from ...common.fsutil import write_json_atomic
from ...common.hashing import sha256_file, sha256_json
from ...common.interpreters import Interpreter
from ...common.paths import cache_root
from ...common.pip import pip
from ...errors import SmokeError, SmokeInputError, ToolNotFoundError, ToolTimeoutError
from . import workload
from .models import SmokeModels
from .report import SmokeReport, SmokeResult

if TYPE_CHECKING:
    from ..wheels import BuiltWheel

log = logging.getLogger(__name__)

WORKLOAD = Path(workload.__file__)
STAGES = workload.RELEASE_STAGES
# The venv's python -> folders holding the wheel's dependency wheels.
FindLinks = Callable[[Path], Sequence[Path]]
_wheelhouse_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class Sandbox(Protocol):
    """Another machine's userland that cells run in; its interpreters' paths are paths inside it."""

    name: str  # enters the cell cache key
    machine: str  # what platform.machine() says inside ("aarch64")
    timeout_factor: float  # emulated programs are slower

    def workspace(self) -> AbstractContextManager[Path]:
        """A fresh host folder that the sandbox sees (removed afterwards)."""

    def guest(self, host_path: Path) -> str:
        """``host_path`` (inside a workspace) as the sandbox sees it."""

    def command(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str]) -> list[str]:
        """The host command that runs ``argv`` inside, from ``cwd``, with exactly ``env``."""

    def pip_platform(self, interp: Interpreter) -> list[str]:
        """``pip download`` options that select wheels for ``interp`` inside (run on the host)."""

    def interpreters(self, versions: Sequence[str]) -> list[Interpreter]:
        """The wanted CPython versions inside (paths inside), or why each is missing."""


def compatible(wheel: BuiltWheel, interp: Interpreter) -> bool:
    return wheel.python_tag in ("py3", interp.tag)


def requires_dist(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` requirements, extras excluded."""
    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise SmokeInputError(f"{wheel}: no .dist-info/METADATA")
        meta = email.parser.Parser().parsestr(zf.read(name).decode("utf-8", "replace"))
    return [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLAMA_CPP_", "PYTHON", "VIRTUAL_ENV", "CONDA"))}
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(extra or {})
    return env


# Inside a sandbox the environment is built, not inherited: the host's paths mean nothing there.
_GUEST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


# The timeouts guard against a hung cell, not a slow one: a step's limit grows with the machine's
# load (every runnable process shares the cores: on 2 cores at load 20 a cell runs about 10 times
# slower than alone), up to this factor, so a busy machine does not fail cells that would pass.
MAX_LOAD_FACTOR = 8.0


def load_factor(load: float | None = None, cpus: int | None = None) -> float:
    """How much longer than on an idle machine a step may take now: the 1-minute load average per
    CPU, at least 1, at most :data:`MAX_LOAD_FACTOR` (1 where the platform has no load average)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows
            return 1.0
    return min(MAX_LOAD_FACTOR, max(1.0, load / (cpus or os.cpu_count() or 1)))


def _run(cmd: Sequence[str], what: str, timeout: float, cwd: Path | None = None,
         check: bool = False, env: Mapping[str, str] | None = None,
         sandbox: Sandbox | None = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` in the clean environment; a missing tool or a timeout is a failed cell (SmokeError).
    ``timeout`` is an idle machine's: it is scaled by :func:`load_factor` (and a sandbox's slowdown)."""
    load = load_factor()
    limit, why = timeout * load, f"{timeout:g} s x {load:.1f} for the load average"
    if sandbox is not None:
        guest_env = {**_GUEST_ENV, **{k: v for k, v in _env(env).items() if k.startswith(("PIP_", "PYTHONDONT"))},
                     **(env or {})}
        cmd = sandbox.command(cmd, cwd=sandbox.guest(cwd) if cwd else "/", env=guest_env)
        cwd, limit = None, limit * sandbox.timeout_factor
        why += f" x {sandbox.timeout_factor:g} for emulation"
    try:
        return proc.run(cmd, what=what, error=SmokeError, check=check, timeout=limit, env=_env(env), cwd=cwd)
    except ToolNotFoundError as exc:
        raise SmokeError(str(exc)) from None
    except ToolTimeoutError as exc:
        raise SmokeError(f"{exc} ({why})") from None


def run_checked(cmd: Sequence[str], what: str, timeout: float, sandbox: Sandbox | None = None) -> None:
    """Run ``cmd`` (clean environment); a non-zero exit raises :class:`SmokeError` with the output's tail."""
    _run(cmd, what, timeout, check=True, sandbox=sandbox)


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def dependency_wheelhouse(python: Path, interp: Interpreter, reqs: Sequence[str], timeout: float,
                          sandbox: Sandbox | None = None) -> Path:
    """A cached folder of binary wheels satisfying ``reqs`` for ``interp`` (downloaded once, then offline).

    For a sandbox's interpreter the host's pip downloads them, for the sandbox's platform."""
    where = f"-{sandbox.machine}" if sandbox else ""
    house = cache_root() / "smoke" / "wheelhouse" / f"{interp.tag}-{interp.full_version}{where}"
    platform = sandbox.pip_platform(interp) if sandbox else []
    python = Path(sys.executable) if sandbox else python
    stamp = house / f".complete-{sha256_json(sorted(reqs))[:16]}"
    with _locks_guard:
        lock = _wheelhouse_locks.setdefault(str(house), threading.Lock())
    with lock:
        if not stamp.exists():
            house.mkdir(parents=True, exist_ok=True)
            log.info("[smoke] downloading %s for Python %s into %s", ", ".join(reqs), interp.version, house)
            run_checked(pip("download", "-q", "--only-binary", ":all:", *platform, "--dest", str(house), *reqs,
                            python=python), f"pip download for Python {interp.version} (needs the package index once)", timeout)
            stamp.write_text(json.dumps(sorted(reqs)))
    return house


@contextmanager
def _host_workspace() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="smoke-") as tmp:
        yield Path(tmp)


def _stage(src: Path, into: Path) -> Path:
    """``src`` placed in ``into`` (a hard link where the filesystem allows, else a copy)."""
    into.mkdir(parents=True, exist_ok=True)
    dest = into / src.name
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
    return dest


def install_and_run(python: Path, wheel: Path, models: SmokeModels, *, stages: Sequence[str],
                    find_links: FindLinks, version: str, flags: Sequence[str] = (),
                    system_site_packages: bool = False, timeout: float = 600.0,
                    env: Mapping[str, str] | None = None, sandbox: Sandbox | None = None) -> dict[str, Any]:
    """Install ``wheel`` into a fresh venv of ``python`` and run the workload there, from an empty folder.

    Returns the workload's report (its ``stages``, plus ``timings``); raises :class:`SmokeError`
    when a step before the workload's verdict fails. With ``sandbox``, ``python`` is a path inside
    it and everything the cell reads is staged into its workspace first.
    """
    timings: dict[str, float] = {}
    with (sandbox.workspace() if sandbox else _host_workspace()) as tmp:
        def inside(p: Path) -> str:
            return sandbox.guest(p) if sandbox else str(p)

        venv, workdir = tmp / "venv", tmp / "empty"
        workdir.mkdir()
        if sandbox:
            wheel = _stage(wheel, tmp / "wheel")
            models = SmokeModels(**{role: _stage(p, tmp / "models" / role) for role, p in models.paths().items()},
                                 reason=models.reason)
        t = time.monotonic()
        run_checked([str(python), "-m", "venv", *(["--system-site-packages"] if system_site_packages else []),
                     inside(venv)], "python -m venv", timeout, sandbox)
        py = _venv_python(venv)
        links = []
        for n, d in enumerate(find_links(py)):
            if sandbox:
                for f in sorted(d.glob("*.whl")):
                    _stage(f, tmp / f"links{n}")
                d = tmp / f"links{n}"
            links += ["--find-links", inside(d)]
        run_checked(pip("install", "-q", "--no-index", *links, inside(wheel), python=inside(py)),
                    f"pip install --no-index {wheel.name}", timeout, sandbox)
        timings["install"] = time.monotonic() - t
        script, out = tmp / "workload.py", tmp / "result.json"
        shutil.copyfile(WORKLOAD, script)
        t = time.monotonic()
        done = _run([inside(py), "-I", inside(script), "--out", inside(out), "--stages", ",".join(stages),
                     "--version", version, *models.workload_args(inside), *flags], "the workload", timeout, cwd=workdir,
                    env=env, sandbox=sandbox)
        timings["workload"] = time.monotonic() - t
        if not out.is_file():
            raise SmokeError(f"the workload crashed (exit {done.returncode}): {proc.tail(done)}")
        report = json.loads(out.read_text(encoding="utf-8"))
    report["timings"] = {k: round(v, 2) for k, v in timings.items()}
    return report


def failed_stages(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.get("stages", {}).items() if v.get("status") != "pass"}


def run_cell(wheel: BuiltWheel, interp: Interpreter, models: SmokeModels, *, stages: Sequence[str],
             timeout: float = 600.0, require_gpu: bool = False, env: Mapping[str, str] | None = None,
             sandbox: Sandbox | None = None) -> SmokeResult:
    """One wheel on one interpreter, in a fresh venv; failures are results, not exceptions."""
    started = time.monotonic()
    res = SmokeResult(wheel.filename, wheel.sha256, interp.version, "fail")
    assert interp.path is not None
    try:
        if sha256_file(wheel.path) != wheel.sha256:
            raise SmokeError(f"{wheel.path} changed since it was built (sha256 differs); rebuild the wheels")
        reqs = requires_dist(wheel.path)

        def find_links(py: Path) -> list[Path]:
            return [dependency_wheelhouse(py, interp, reqs, timeout, sandbox)] if reqs else []

        report = install_and_run(interp.path, wheel.path, models, stages=stages, find_links=find_links,
                                 version=wheel.version, flags=["--require-gpu"] if require_gpu else [],
                                 timeout=timeout, env=env, sandbox=sandbox)
        res.stages = report["stages"]
        failed = failed_stages(report)
        if failed:
            res.reason = "; ".join(f"{k}: {v.get('detail')}" for k, v in failed.items())
            if models.reason and set(failed) & set(workload.MODEL_ROLES):
                res.reason += f" (models: {models.reason})"
        else:
            res.status = "pass"
    except SmokeError as exc:
        res.reason = str(exc)
    res.seconds = round(time.monotonic() - started, 1)
    return res


def _cell_key(wheel: BuiltWheel, interp: Interpreter, stages: Sequence[str], models_digest: str,
              require_gpu: bool, env: Mapping[str, str] | None = None, sandbox: Sandbox | None = None) -> str:
    return sha256_json({"wheel": wheel.sha256, "python": [str(interp.path), interp.full_version],
                        "workload": sha256_file(WORKLOAD), "stages": list(stages), "models": models_digest,
                        "gpu": require_gpu, **({"env": dict(sorted(env.items()))} if env else {}),
                        **({"sandbox": sandbox.name} if sandbox else {})})


def _no_interpreter(w: BuiltWheel) -> SmokeResult:
    version = f"{w.python_tag[2]}.{w.python_tag[3:]}" if w.python_tag.startswith("cp") else "any"
    return SmokeResult(w.filename, w.sha256, version, "skip", f"no interpreter for {w.python_tag} was requested")


def _cached(key_file: Path) -> SmokeResult | None:
    try:
        cached = SmokeResult(**json.loads(key_file.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    cached.cached = True
    return cached


def run(wheels: Sequence[BuiltWheel], interpreters: Sequence[Interpreter], models: SmokeModels, *,
        stages: Sequence[str] = STAGES, jobs: int | None = None, timeout: float = 600.0,
        strict: bool = False, use_cache: bool = True, require_gpu: bool = False,
        env: Mapping[str, str] | None = None,
        sandbox_for: Callable[[Interpreter], Sandbox | None] | None = None) -> SmokeReport:
    """Every compatible (wheel, interpreter) cell, in parallel; missing interpreters are skips.

    ``env`` is added to each workload's environment (a software Vulkan device, say);
    ``sandbox_for`` names the sandbox an interpreter lives in (its path is a path inside it)."""
    unknown = [s for s in stages if s not in workload.REGISTRY]
    if unknown:
        raise SmokeInputError(f"unknown smoke stage {unknown[0]!r}; choose from {list(workload.REGISTRY)}")
    models = models.for_stages(stages)
    results: list[SmokeResult] = []
    todo: list[tuple[BuiltWheel, Interpreter, Path, Sandbox | None]] = []
    digest = models.digest()
    cache = cache_root() / "smoke" / "results"
    for w in wheels:
        if not any(compatible(w, i) for i in interpreters):
            results.append(_no_interpreter(w))
            continue
        for i in (i for i in interpreters if compatible(w, i)):
            if not i.found:
                results.append(SmokeResult(w.filename, w.sha256, i.version, "skip",
                                           f"Python {i.version} {i.reason or 'not found'}"))
                continue
            sandbox = sandbox_for(i) if sandbox_for else None
            key_file = cache / f"{_cell_key(w, i, stages, digest, require_gpu, env, sandbox)}.json"
            hit = _cached(key_file) if use_cache and key_file.is_file() else None
            if hit is not None:
                results.append(hit)
            else:
                todo.append((w, i, key_file, sandbox))

    def one(item: tuple[BuiltWheel, Interpreter, Path, Sandbox | None]) -> SmokeResult:
        w, i, key_file, sandbox = item
        r = run_cell(w, i, models, stages=stages, timeout=timeout, require_gpu=require_gpu, env=env, sandbox=sandbox)
        log.info("[smoke] %s on %s: %s %s (%.0f s)", w.filename, i.version, r.status, r.reason, r.seconds)
        if r.status == "pass":  # a later run may reuse it (use_cache only controls reading)
            write_json_atomic(key_file, asdict(r))
        return r

    if todo:
        with ThreadPoolExecutor(max_workers=jobs or min(len(todo), max(2, (os.cpu_count() or 2)))) as pool:
            results += list(pool.map(one, todo))
    order = {w.filename: n for n, w in enumerate(wheels)}
    vorder = {i.version: n for n, i in enumerate(interpreters)}
    results.sort(key=lambda r: (order.get(r.wheel, 0), vorder.get(r.python, 0)))
    return SmokeReport(results, list(interpreters), strict)

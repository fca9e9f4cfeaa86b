"""Step 5: install each wheel into a fresh venv per interpreter and run the smoke workload.

Per (wheel, interpreter) cell: ``python -m venv``, ``pip install --no-index --find-links
<wheelhouse>`` of exactly that wheel file (its dependencies come from a per-interpreter
wheelhouse in the cache, downloaded once with ``pip download --only-binary :all:``, so later
runs are offline), then ``python -I smoke_workload.py`` from an empty directory with every
``LLAMA_CPP_*`` variable removed (the loader must find the wheel's own libraries). The
fixture models are generated here, in the parent, and passed by path: nothing inside the
venv imports from the repository. Cells run in parallel; a passing cell's result is cached
by (wheel sha256, interpreter, workload, models) so an unchanged re-run costs nothing.
"""

from __future__ import annotations

import email.parser
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import BuildToolsError
from .fsutil import write_json_atomic
from .hashing import sha256_file, sha256_json
from .interpreters import Interpreter
from .paths import REPO_ROOT, cache_root
from .wheels import BuiltWheel

log = logging.getLogger(__name__)

WORKLOAD = Path(__file__).with_name("smoke_workload.py")
STAGES = ("import", "libraries", "embedding", "mtp")
REPORT_FILE = "smoke.json"
_wheelhouse_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class SmokeError(BuildToolsError):
    """The smoke step could not run (not: a wheel failed it; that is in the report)."""


@dataclass(frozen=True)
class SmokeModels:
    """Tiny generated GGUF models, by path (``reason`` says why one is missing)."""

    embedding: Path | None = None
    mtp: Path | None = None
    reason: str | None = None

    def digest(self) -> str:
        parts = {k: sha256_file(p) if p is not None and p.is_file() else None
                 for k, p in (("embedding", self.embedding), ("mtp", self.mtp))}
        return sha256_json(parts)


def fixture_models() -> SmokeModels:
    """Generate (or reuse from the fixture cache) the smoke models with the test suite's generators."""
    import sys

    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from tests.fixtures import fixture_path  # type: ignore[attr-defined]
    except ImportError as exc:
        return SmokeModels(reason=f"tests.fixtures.fixture_path is not available ({exc}); "
                                  "pip install -r requirements/release.txt (needs gguf, numpy)")
    try:
        emb = Path(fixture_path("embedding_model", pooling="mean"))
    except Exception as exc:  # noqa: BLE001 - a generator bug is reported, not raised
        return SmokeModels(reason=f"generating embedding_model failed: {type(exc).__name__}: {exc}")
    try:
        mtp = Path(fixture_path("qwen35_mtp", form="echo"))
    except Exception as exc:  # noqa: BLE001
        return SmokeModels(embedding=emb, reason=f"generating qwen35_mtp failed: {type(exc).__name__}: {exc}")
    return SmokeModels(embedding=emb, mtp=mtp)


@dataclass
class SmokeResult:
    wheel: str
    wheel_sha256: str
    python: str  # "3.12"
    status: str  # pass | skip | fail
    reason: str = ""
    stages: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False


@dataclass
class SmokeReport:
    results: list[SmokeResult]
    interpreters: list[Interpreter]
    strict: bool = False

    @property
    def ok(self) -> bool:
        if any(r.status == "fail" for r in self.results):
            return False
        if self.strict and any(r.status == "skip" for r in self.results):
            return False
        return any(r.status == "pass" for r in self.results)

    def verdict(self, wheel: str) -> str:
        """pass / skip / fail for one wheel over all interpreters."""
        statuses = {r.status for r in self.results if r.wheel == wheel}
        if "fail" in statuses or not statuses:
            return "fail"
        return "pass" if "pass" in statuses else "skip"

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, "ok": self.ok, "strict": self.strict,
                "interpreters": [{"version": i.version, "path": str(i.path) if i.path else None,
                                  "full_version": i.full_version, "reason": i.reason} for i in self.interpreters],
                "results": [asdict(r) for r in self.results]}

    def render(self) -> str:
        versions = sorted({i.version for i in self.interpreters} | {r.python for r in self.results},
                          key=lambda v: tuple(int(x) if x.isdigit() else 99 for x in v.split(".")))
        wheels = list(dict.fromkeys(r.wheel for r in self.results))
        width = max([len(w) for w in wheels] + [5])
        lines = [f"{'wheel':<{width}}  " + "  ".join(f"{v:<6}" for v in versions)]
        cell = {(r.wheel, r.python): r for r in self.results}
        notes = []
        for w in wheels:
            row = []
            for v in versions:
                r = cell.get((w, v))
                row.append(f"{(r.status + ('*' if r.cached else '')) if r else '-':<6}")
                if r and r.status != "pass":
                    notes.append(f"  {w} / {v}: {r.status}: {r.reason}")
            lines.append(f"{w:<{width}}  " + "  ".join(row))
        lines.append(f"smoke: {'OK' if self.ok else 'FAILED'} ('-': tag not for that interpreter, *: cached pass)")
        return "\n".join(lines + notes)


def compatible(wheel: BuiltWheel, interp: Interpreter) -> bool:
    return wheel.python_tag in ("py3", interp.tag)


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode("utf-8"))
    return list(meta.get_all("Requires-Dist") or [])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLAMA_CPP_", "PYTHON", "VIRTUAL_ENV", "CONDA"))}
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    return env


def _run(cmd: list[str], what: str, timeout: float, cwd: Path | None = None) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise SmokeError(f"{what} timed out after {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SmokeError(f"{what} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-1500:]}")


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def dependency_wheelhouse(python: Path, interp: Interpreter, reqs: Sequence[str], timeout: float) -> Path:
    """A cached folder of binary wheels satisfying ``reqs`` for ``interp`` (downloaded once, then offline)."""
    house = cache_root() / "smoke" / "wheelhouse" / f"{interp.tag}-{interp.full_version}"
    stamp = house / f".complete-{sha256_json(sorted(reqs))[:16]}"
    with _locks_guard:
        lock = _wheelhouse_locks.setdefault(str(house), threading.Lock())
    with lock:
        if not stamp.exists():
            house.mkdir(parents=True, exist_ok=True)
            log.info("[smoke] downloading %s for Python %s into %s", ", ".join(reqs), interp.version, house)
            _run([str(python), "-m", "pip", "download", "-q", "--only-binary", ":all:", "--dest", str(house),
                  *reqs], f"pip download for Python {interp.version} (needs the package index once)", timeout)
            stamp.write_text(json.dumps(sorted(reqs)))
    return house


def _cell_key(wheel: BuiltWheel, interp: Interpreter, stages: Sequence[str], models_digest: str,
              require_gpu: bool) -> str:
    return sha256_json({"wheel": wheel.sha256, "python": [str(interp.path), interp.full_version],
                        "workload": sha256_file(WORKLOAD), "stages": list(stages), "models": models_digest,
                        "gpu": require_gpu})


def run_cell(wheel: BuiltWheel, interp: Interpreter, models: SmokeModels, *, stages: Sequence[str],
             timeout: float = 600.0, require_gpu: bool = False) -> SmokeResult:
    """One wheel on one interpreter, in a fresh venv; failures are results, not exceptions."""
    started = time.monotonic()
    res = SmokeResult(wheel.filename, wheel.sha256, interp.version, "fail")
    assert interp.path is not None
    with tempfile.TemporaryDirectory(prefix=f"smoke-{interp.tag}-") as tmp_s:
        tmp = Path(tmp_s)
        venv, workdir = tmp / "venv", tmp / "empty"
        workdir.mkdir()
        try:
            if sha256_file(wheel.path) != wheel.sha256:
                raise SmokeError(f"{wheel.path} changed since it was built (sha256 differs); rebuild the wheels")
            _run([str(interp.path), "-m", "venv", str(venv)], "python -m venv", timeout)
            py = _venv_python(venv)
            reqs = _requires(wheel.path)
            find_links = []
            if reqs:
                find_links = ["--find-links", str(dependency_wheelhouse(py, interp, reqs, timeout))]
            _run([str(py), "-m", "pip", "install", "-q", "--no-index", *find_links, str(wheel.path)],
                 f"pip install --no-index {wheel.filename}", timeout)
            script = tmp / "smoke_workload.py"
            shutil.copyfile(WORKLOAD, script)
            out = tmp / "result.json"
            cmd = [str(py), "-I", str(script), "--out", str(out), "--stages", ",".join(stages),
                   "--version", wheel.version]
            if models.embedding:
                cmd += ["--embedding-model", str(models.embedding)]
            if models.mtp:
                cmd += ["--mtp-model", str(models.mtp)]
            if require_gpu:
                cmd.append("--require-gpu")
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=workdir,
                                      check=False)
            except subprocess.TimeoutExpired:
                raise SmokeError(f"the workload timed out after {timeout:.0f} s") from None
            if not out.is_file():
                raise SmokeError(f"the workload crashed (exit {proc.returncode}): "
                                 f"{(proc.stdout + proc.stderr).strip()[-1500:]}")
            report = json.loads(out.read_text(encoding="utf-8"))
            res.stages = report["stages"]
            failed = {k: v for k, v in res.stages.items() if v.get("status") != "pass"}
            if failed:
                reason = "; ".join(f"{k}: {v.get('detail')}" for k, v in failed.items())
                if models.reason and any(k in ("embedding", "mtp") for k in failed):
                    reason += f" (models: {models.reason})"
                res.reason = reason
            else:
                res.status = "pass"
        except SmokeError as exc:
            res.reason = str(exc)
    res.seconds = round(time.monotonic() - started, 1)
    return res


def smoke(wheels: Sequence[BuiltWheel], interpreters: Sequence[Interpreter], models: SmokeModels, *,
          stages: Sequence[str] = STAGES, jobs: int | None = None, timeout: float = 600.0,
          strict: bool = False, use_cache: bool = True, require_gpu: bool = False) -> SmokeReport:
    """Every compatible (wheel, interpreter) cell, in parallel; missing interpreters are skips."""
    for s in stages:
        if s not in STAGES:
            raise SmokeError(f"unknown smoke stage {s!r}; choose from {list(STAGES)}")
    results: list[SmokeResult] = []
    todo: list[tuple[BuiltWheel, Interpreter, Path]] = []
    digest = models.digest()
    cache = cache_root() / "smoke" / "results"
    for w in wheels:
        if not any(compatible(w, i) for i in interpreters):
            version = f"{w.python_tag[2]}.{w.python_tag[3:]}" if w.python_tag.startswith("cp") else "any"
            results.append(SmokeResult(w.filename, w.sha256, version, "skip",
                                       f"no interpreter for {w.python_tag} was requested"))
            continue
        for i in interpreters:
            if not compatible(w, i):
                continue
            if not i.found:
                results.append(SmokeResult(w.filename, w.sha256, i.version, "skip",
                                           f"Python {i.version} {i.reason or 'not found'}"))
                continue
            key_file = cache / f"{_cell_key(w, i, stages, digest, require_gpu)}.json"
            if use_cache and key_file.is_file():
                try:
                    cached = SmokeResult(**json.loads(key_file.read_text(encoding="utf-8")))
                    cached.cached = True
                    results.append(cached)
                    continue
                except (ValueError, TypeError):
                    pass
            todo.append((w, i, key_file))

    def one(item: tuple[BuiltWheel, Interpreter, Path]) -> SmokeResult:
        w, i, key_file = item
        r = run_cell(w, i, models, stages=stages, timeout=timeout, require_gpu=require_gpu)
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


def save_report(report: SmokeReport, out_dir: Path) -> Path:
    path = out_dir / REPORT_FILE
    write_json_atomic(path, report.to_json())
    return path



def merge_reports(paths: Sequence[Path], wheels: Sequence[BuiltWheel], *, strict: bool) -> SmokeReport:
    """Combine the smoke.json of several runs (one CI job per interpreter) for these exact wheels.

    A wheel's cell counts only if it names the wheel's current sha256; a wheel no report covers
    is a skip (so ``strict`` refuses it).
    """
    by_sha = {w.sha256: w for w in wheels}
    results: dict[tuple[str, str], SmokeResult] = {}
    interps: dict[str, Interpreter] = {}
    for p in paths:
        try:
            data = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SmokeError(f"cannot read smoke report {p}: {exc}") from None
        for i in data.get("interpreters", []):
            if i.get("path") or i["version"] not in interps:
                interps[i["version"]] = Interpreter(i["version"], Path(i["path"]) if i.get("path") else None,
                                                    i.get("full_version"), i.get("reason"))
        for r in data.get("results", []):
            if r.get("wheel_sha256") not in by_sha:
                continue
            res = SmokeResult(**r)
            prev = results.get((res.wheel, res.python))
            if prev is None or prev.status == "skip":
                results[(res.wheel, res.python)] = res
    for w in wheels:
        if not any(k[0] == w.filename for k in results):
            results[(w.filename, w.python_tag)] = SmokeResult(w.filename, w.sha256, w.python_tag, "skip",
                                                              "no smoke report covers this wheel")
    ordered = sorted(results.values(), key=lambda r: (r.wheel, r.python))
    return SmokeReport(ordered, sorted(interps.values(), key=lambda i: i.version), strict)

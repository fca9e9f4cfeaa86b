"""Fetch upstream's ``tests/``, serve its models from a local hub cache, run pytest, read the verdict.

The tests run unchanged: the sdist's ``tests/`` folder and the vocab files its tests open by
relative path (``./vendor/llama.cpp/models/ggml-vocab-*.gguf``) are extracted into the build
folder, which is pytest's working directory; ``llama_cpp`` is whatever the interpreter imports
(the installed wheel, or this checkout with ``checkout=True``).
"""

from __future__ import annotations

import ast
import logging
import os
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..common import proc
from ..common.fsutil import write_json_atomic
from ..common.paths import REPO_ROOT
from ..errors import InputError, VendorError
from ..inputs.lock import PypiSdistSource, SourceLock
from ..stages import vendor
from .hub import HubFile, build_hub
from .standins import stand_in_path

log = logging.getLogger(__name__)

UPSTREAM_PACKAGE = "llama-cpp-python"

# Tests that assert what a trained model knows; deselected only when stand-ins serve the models.
NEEDS_REAL_MODEL: dict[str, str] = {
    "tests/test_llama.py::test_real_model":
        "asserts Qwen3.5's own token ids for 'Hello, world!' ([9419, 11, 1814, 0])",
    "tests/test_llama.py::test_real_llama":
        "asserts a trained model's words: ' jumps over the lazy dog.', 'true' for the capital of France, "
        "'rot' completing 'par'",
    "tests/test_llama.py::test_real_llama_repeated_prompt_cache":
        "asserts the trained continuation ' jumps over the lazy dog.'",
}


@dataclass
class SuiteReport:
    """The outcome of one run: each test id with its outcome and, for failures, the message."""

    build_dir: Path
    upstream_version: str
    llama_cpp: str
    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    deselected: dict[str, str] = field(default_factory=dict)
    returncode: int = 0

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)

    def summary(self) -> str:
        parts = [f"{self.count(o)} {o}" for o in ("passed", "failed", "error", "skipped") if self.count(o)]
        return (f"upstream {UPSTREAM_PACKAGE} {self.upstream_version} tests against {self.llama_cpp}: "
                f"{', '.join(parts) or 'nothing ran'}; {len(self.deselected)} deselected (need a real model)")

    def to_json(self) -> dict[str, object]:
        return {"upstream_version": self.upstream_version, "llama_cpp": self.llama_cpp,
                "returncode": self.returncode, "counts": {o: self.count(o) for o in
                                                           ("passed", "failed", "error", "skipped")},
                "outcomes": self.outcomes, "messages": self.messages, "deselected": self.deselected}


def upstream_source(lock: SourceLock) -> PypiSdistSource:
    """The lock's llama-cpp-python sdist (the release whose API this package matches)."""
    for src in lock.sources.values():
        if isinstance(src, PypiSdistSource) and src.package == UPSTREAM_PACKAGE:
            return src
    raise InputError(f"{lock.path}: no pypi-sdist source for {UPSTREAM_PACKAGE}; the compat suite runs its tests")


def _wanted(member: str, top: str) -> bool:
    parts = PurePosixPath(member).parts
    if not parts or parts[0] != top or ".." in parts:
        return False
    rel = parts[1:]
    return (len(rel) >= 2 and rel[0] == "tests") or (
        len(rel) == 4 and rel[:3] == ("vendor", "llama.cpp", "models") and rel[3].startswith("ggml-vocab-")
        and rel[3].endswith(".gguf"))


def extract_tests(tarball: Path, into: Path) -> Path:
    """Extract ``tests/`` and the vocab models from the sdist; return the folder holding them."""
    with tarfile.open(tarball) as tf:
        members = tf.getmembers()
        top = PurePosixPath(members[0].name).parts[0] if members else ""
        chosen = [m for m in members if m.isfile() and _wanted(m.name, top)]
        if not any(PurePosixPath(m.name).parts[1] == "tests" for m in chosen):
            raise VendorError(f"{tarball}: no tests/ folder in the sdist")
        for m in chosen:
            rel = Path(*PurePosixPath(m.name).parts[1:])
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            f = tf.extractfile(m)
            assert f is not None
            dest.write_bytes(f.read())
    return into


def hub_downloads(tests_dir: Path) -> list[tuple[str, str]]:
    """Every ``hf_hub_download(repo_id, filename)`` in the test files whose arguments are string
    constants (directly or through a local name)."""
    found: list[tuple[str, str]] = []
    for path in sorted(tests_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                continue
            consts = {t.id: n.value.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                      and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                      for t in n.targets if isinstance(t, ast.Name)}
            for call in ast.walk(fn):
                if not (isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", ""))
                        == "hf_hub_download"):
                    continue
                args = list(call.args) + [k.value for k in call.keywords if k.arg in ("repo_id", "filename")]
                vals = [a.value if isinstance(a, ast.Constant) else consts.get(getattr(a, "id", ""))
                        for a in args[:2]]
                if len(vals) == 2 and all(isinstance(v, str) for v in vals):
                    pair = (vals[0], vals[1])
                    if pair not in found:
                        found.append(pair)
    return found


def read_junit(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(test id → passed/failed/error/skipped, test id → first line of the failure message)."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                messages[name] = (child.get("message") or "").strip().splitlines()[0][:300] if child.get(
                    "message") else ""
                break
        outcomes[name] = outcome
    return outcomes, messages


def run(lock: SourceLock, build_dir: Path, *, python: str = sys.executable, archive: Path | None = None,
        real_hub: Path | None = None, env: Mapping[str, str] | None = None, paths: Sequence[str] = ("tests",),
        pytest_args: Sequence[str] = (), timeout: float = 3600) -> SuiteReport:
    """Run upstream's tests; with ``real_hub`` (an ``HF_HOME`` holding the real models) nothing is
    deselected, else generated stand-ins serve every model and :data:`NEEDS_REAL_MODEL` is deselected."""
    src = upstream_source(lock)
    tarball = vendor.fetch_archive(src, archive)
    build_dir.mkdir(parents=True, exist_ok=True)
    root = extract_tests(tarball, build_dir / "upstream")
    run_env = dict(os.environ if env is None else env)
    if real_hub is None:
        files = [HubFile(repo, name, stand_in_path(repo, name)) for repo, name in hub_downloads(root / "tests")]
        hf_home = build_hub(build_dir / "hf-home", files)
        deselected = dict(NEEDS_REAL_MODEL)
    else:
        hf_home, deselected = real_hub, {}
    run_env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    run_env.pop("HF_HUB_CACHE", None)
    which = proc.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__, llama_cpp.__file__)"],
                     env=run_env, cwd=root, check=False)
    if which.returncode != 0:
        raise InputError(f"{python} cannot import llama_cpp from {root}: install the wheel into that interpreter "
                         f"(or pass --checkout to test this source tree)\n{proc.tail(which)}")
    junit = build_dir / "junit.xml"
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}",
           f"--rootdir={root}", *paths, *[a for t in deselected for a in ("--deselect", t)], *pytest_args]
    log.info("running %s tests in %s (HF_HOME=%s)", UPSTREAM_PACKAGE, root, hf_home)
    done = proc.run(cmd, env=run_env, cwd=root, check=False, timeout=timeout)
    (build_dir / "pytest.log").write_text((done.stdout or "") + (done.stderr or ""), encoding="utf-8")
    if not junit.exists():
        raise InputError(f"pytest did not run the upstream tests (exit {done.returncode}):\n{proc.tail(done)}")
    outcomes, messages = read_junit(junit)
    report = SuiteReport(build_dir, src.version, which.stdout.strip(), outcomes, messages, deselected,
                         done.returncode)
    write_json_atomic(build_dir / "report.json", report.to_json())
    return report


def checkout_env(lib_dir: Path | None) -> dict[str, str]:
    """The environment that makes an interpreter import this checkout's ``llama_cpp``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if lib_dir is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    return env


__all__ = ["NEEDS_REAL_MODEL", "SuiteReport", "checkout_env", "extract_tests", "hub_downloads", "read_junit",
           "run", "upstream_source"]

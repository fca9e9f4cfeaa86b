"""The smoke report: one result per (wheel, interpreter) cell, saved as ``dist/<config>/smoke.json``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...common.fsutil import write_json_atomic
from ...common.interpreters import Interpreter
from ...errors import SmokeInputError

if TYPE_CHECKING:
    from ..wheels import BuiltWheel

REPORT_FILE = "smoke.json"
SCHEMA_VERSION = 1


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
        return {"schema_version": SCHEMA_VERSION, "ok": self.ok, "strict": self.strict,
                "interpreters": [{"version": i.version, "path": str(i.path) if i.path else None,
                                  "full_version": i.full_version, "reason": i.reason} for i in self.interpreters],
                "results": [asdict(r) for r in self.results]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SmokeReport:
        interps = [Interpreter(i["version"], Path(i["path"]) if i.get("path") else None, i.get("full_version"),
                               i.get("reason")) for i in data.get("interpreters", [])]
        return cls([SmokeResult(**r) for r in data.get("results", [])], interps, bool(data.get("strict")))

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


def save_report(report: SmokeReport, out_dir: Path) -> Path:
    path = out_dir / REPORT_FILE
    write_json_atomic(path, report.to_json())
    return path


def _read(path: Path) -> SmokeReport:
    try:
        return SmokeReport.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SmokeInputError(f"cannot read smoke report {path}: {exc}") from None


def load_report(out_dir: Path) -> SmokeReport | None:
    """The saved report of ``out_dir``, or None when smoke has not run there."""
    path = out_dir / REPORT_FILE
    return _read(path) if path.is_file() else None


def merge_reports(paths: Sequence[Path], wheels: Sequence[BuiltWheel], *, strict: bool) -> SmokeReport:
    """Combine the smoke.json of several runs (one CI job per interpreter) for these exact wheels.

    A wheel's cell counts only if it names the wheel's current sha256; a wheel no report covers
    is a skip (so ``strict`` refuses it).
    """
    shas = {w.sha256 for w in wheels}
    results: dict[tuple[str, str], SmokeResult] = {}
    interps: dict[str, Interpreter] = {}
    for p in paths:
        report = _read(p)
        for i in report.interpreters:
            if i.path or i.version not in interps:
                interps[i.version] = i
        for res in report.results:
            if res.wheel_sha256 not in shas:
                continue
            prev = results.get((res.wheel, res.python))
            if prev is None or prev.status == "skip":
                results[(res.wheel, res.python)] = res
    for w in wheels:
        if not any(k[0] == w.filename for k in results):
            results[(w.filename, w.python_tag)] = SmokeResult(w.filename, w.sha256, w.python_tag, "skip",
                                                              "no smoke report covers this wheel")
    ordered = sorted(results.values(), key=lambda r: (r.wheel, r.python))
    return SmokeReport(ordered, sorted(interps.values(), key=lambda i: i.version), strict)

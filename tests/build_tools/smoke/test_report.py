"""smoke.json: the report round-trips, and CI's per-interpreter reports merge for the exact wheels."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from build_tools.common.interpreters import Interpreter
from build_tools.errors import SmokeInputError
from build_tools.stages.smoke import SmokeReport, SmokeResult, load_report, merge_reports, save_report


def _report(version: str, status: str, sha: str = "a" * 64) -> SmokeReport:
    return SmokeReport([SmokeResult("w.whl", sha, version, status, "" if status == "pass" else "boom",
                                    {"import": {"status": status}})],
                       [Interpreter(version, Path(f"/py{version}"), f"{version}.1")])


def test_report_round_trips_through_its_file(tmp_path):
    assert load_report(tmp_path) is None
    report = _report("3.12", "pass")
    path = save_report(report, tmp_path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1 and data["ok"] and data["results"][0]["wheel_sha256"] == "a" * 64
    loaded = load_report(tmp_path)
    assert loaded is not None and loaded.to_json() == report.to_json() and loaded.verdict("w.whl") == "pass"


def test_merge_keeps_only_the_current_wheels(tmp_path):
    wheel = SimpleNamespace(filename="w.whl", sha256="a" * 64, python_tag="py3")
    paths = []
    for n, rep in enumerate((_report("3.11", "pass"), _report("3.12", "fail"), _report("3.13", "pass", "b" * 64))):
        paths.append(save_report(rep, tmp_path / str(n)))
    merged = merge_reports(paths, [wheel], strict=True)
    assert [(r.python, r.status) for r in merged.results] == [("3.11", "pass"), ("3.12", "fail")]
    assert not merged.ok and [i.version for i in merged.interpreters] == ["3.11", "3.12", "3.13"]
    assert merge_reports(paths[:1], [wheel], strict=True).ok
    uncovered = merge_reports(paths[2:], [wheel], strict=True)
    assert [r.status for r in uncovered.results] == ["skip"] and not uncovered.ok
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SmokeInputError, match="cannot read smoke report"):
        merge_reports([tmp_path / "bad.json"], [wheel], strict=False)

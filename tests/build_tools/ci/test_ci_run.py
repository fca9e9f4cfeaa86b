""".ci/run: the platform tiers that fit CI, the README's test command and compat, every tier run even
after a failure, a non-zero exit on any failure, and the closing table of tiers and skipped tests;
and release.yml, which runs what does not fit on every pull request."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools.inputs.configs import load_matrix

REPO = Path(__file__).resolve().parents[3]
RUN = REPO / ".ci" / "run"
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.native.test_vulkan_backend" name="test_a"><skipped type="pytest.skip" message="no GPU">x</skipped></testcase>
<testcase classname="tests.native.test_vulkan_backend" name="test_b"><skipped type="pytest.skip" message="no GPU">x</skipped></testcase>
<testcase classname="tests.build_tools.ci.test_ci_run" name="test_c[1]"><skipped type="pytest.skip" message="Skipped: macOS only">x</skipped></testcase>
<testcase classname="tests.test_x" name="test_d"/>
</testsuite></testsuites>
"""

# A python3 that runs only .ci/summary.py for real; a tier whose command matches $FAIL fails, and the
# tests tier writes the junit report pytest would (PYTEST_ADDOPTS names where).
FAKE = """#!/bin/bash
if [ "$1" = ".ci/summary.py" ]; then exec "$REAL_PYTHON" "$@"; fi
echo "ran: $*" >> "$CALLS"
if [ -n "$FAIL" ] && [[ "$*" == *"$FAIL"* ]]; then exit 3; fi
if [[ "$*" == "-m nox -s tests" ]]; then
  echo "addopts: $PYTEST_ADDOPTS" >> "$CALLS"
  cp "$JUNIT_SAMPLE" "${PYTEST_ADDOPTS##*--junitxml=}"
fi
exit 0
"""


def _summary():
    spec = importlib.util.spec_from_file_location("ci_summary", REPO / ".ci" / "summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path: Path, fail: str = "", tiers: str | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(FAKE)
    (bin_dir / "python3").chmod(0o755)
    (tmp_path / "junit.xml").write_text(JUNIT)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REAL_PYTHON": sys.executable,
           "CALLS": str(calls), "FAIL": fail, "JUNIT_SAMPLE": str(tmp_path / "junit.xml")}
    env.pop("LLAMA_CPP_CI_TIERS", None)
    if tiers is not None:
        env["LLAMA_CPP_CI_TIERS"] = tiers
    done = subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=60, check=False)
    return done, calls.read_text().splitlines()


def test_summary_groups_skips_by_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # where .ci/run runs it: node ids are paths from the repository root
    summary = _summary()
    (tmp_path / "j.xml").write_text(JUNIT)
    skips = summary.skipped_tests(tmp_path / "j.xml")
    assert skips == {"no GPU": ["tests/native/test_vulkan_backend.py::test_a",
                                "tests/native/test_vulkan_backend.py::test_b"],
                     "macOS only": ["tests/build_tools/ci/test_ci_run.py::test_c[1]"]}
    (tmp_path / "t.tsv").write_text("windows\tran\t361\tpython3 -m nox -s windows\nvulkan release\tskipped\t-\ttoo slow\n")
    text = summary.render(summary.tiers(tmp_path / "t.tsv"), skips)
    assert re.search(r"windows +ran +361 +python3 -m nox -s windows", text)
    assert re.search(r"vulkan release +skipped +- +too slow", text)
    assert "tests skipped by nox -s tests: 3" in text and text.index("no GPU") < text.index("macOS only")
    (tmp_path / "tests" / "pkg").mkdir(parents=True)
    (tmp_path / "tests" / "pkg" / "test_m.py").write_text("")
    assert summary.test_id("tests.pkg.test_m.TestC", "test_n", tmp_path) == "tests/pkg/test_m.py::TestC::test_n"
    assert summary.test_id("tests.pkg.test_m", "test_n[a.b]", tmp_path) == "tests/pkg/test_m.py::test_n[a.b]"


def test_every_tier_runs_then_the_table(tmp_path):
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [c[len("ran: "):] for c in calls if c.startswith("ran: ")]
    assert ran[0].startswith("-m pip install") and ran[-3:] == ["-m nox -s tests", "-m nox -s compat", "-m nox -s downstream"]
    assert ran[1:-3] == ["-m nox -s windows"]
    assert any("--junitxml=" in c and "-rs" in c for c in calls)
    out = done.stdout
    table = out[out.index("CI tiers"):]
    for tier in ("windows", "tests", "compat", "downstream"):
        assert re.search(rf"\n  {tier} +ran ", table), tier
    assert re.search(r"\n  vulkan +skipped +- +.*LLAMA_CPP_CI_TIERS", table)
    assert re.search(r"\n  aarch64 +skipped +- +.*release.yml .* every pull request", table)
    for skipped in ("vulkan release", "cpu-aarch64 release", "cpu-windows", "gpu-smoke"):
        assert re.search(rf"\n  {re.escape(skipped)} +skipped +- +\S", table), skipped
    assert "tests skipped by nox -s tests: 3" in table


def test_a_failing_tier_fails_the_run_after_the_others(tmp_path):
    done, calls = _run(tmp_path, fail="nox -s windows")
    assert done.returncode == 1
    assert "ran: -m nox -s compat" in calls  # the later tiers still ran
    assert re.search(r"\n  windows +FAILED +\d+ +exit 3: python3 -m nox -s windows", done.stdout)
    done, _ = _run(tmp_path, fail="nox -s tests")  # pytest's exit 5 (no tests) is a failure like any other
    assert done.returncode == 1 and re.search(r"\n  tests +FAILED ", done.stdout)


def test_tiers_can_be_chosen_and_unknown_ones_fail(tmp_path):
    done, calls = _run(tmp_path, tiers="aarch64")
    assert done.returncode == 0
    assert "ran: -m nox -s windows" not in calls and "ran: -m nox -s release -- cpu-aarch64-dev" in calls
    assert re.search(r"\n  windows +skipped +- +not in LLAMA_CPP_CI_TIERS", done.stdout)
    assert re.search(r"\n  aarch64 +ran ", done.stdout)
    done, _ = _run(tmp_path, tiers="bogus")
    assert done.returncode == 1 and "unknown tier" in done.stdout


def test_tier_configurations_are_development_builds_the_platform_tests_accept():
    text = RUN.read_text()
    named = set(re.findall(r"nox -s release -- ([\w.-]+)", text))
    assert named == {"vulkan-dev", "cpu-aarch64-dev"}
    m = load_matrix()
    assert all(not m.get(n).release for n in named)
    from tests.build_tools import vulkan_builds, windows_fakes
    from tests.build_tools.smoke import test_emulated_wheel

    assert "vulkan-dev" in vulkan_builds.CONFIGS and windows_fakes.CONFIG == "cpu-windows-dev"
    assert "cpu-aarch64-dev" in Path(test_emulated_wheel.__file__).read_text()


def test_release_workflow_runs_on_every_pull_request_and_publishes_only_tags():
    yaml = pytest.importorskip("yaml")
    wf = REPO / ".github" / "workflows"
    release = yaml.safe_load((wf / "release.yml").read_text())
    on = release.get("on", release.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in on and on["push"]["tags"] == ["v*"]
    assert "refs/tags/v" in release["jobs"]["publish"]["if"] and release["jobs"]["pypi"]["needs"] == "publish"
    ci = yaml.safe_load((wf / "ci.yml").read_text())
    assert any(s.get("run") == ".ci/run" for s in ci["jobs"]["tests"]["steps"])

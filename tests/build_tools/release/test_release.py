"""The whole chain on cpu-host: gates stop a bad release; an unchanged second run rebuilds nothing."""

from __future__ import annotations

import pytest

from build_tools import dist, release
from build_tools.stages.smoke import runner

from ..smoke.test_smoke import _mtp_ready


def test_failed_smoke_publishes_nothing(built, config, repo, smoke_interpreter, tmp_path, monkeypatch):
    def failing(w, i, models, **kw):
        return runner.SmokeResult(w.filename, w.sha256, i.version, "fail", "import: injected failure")

    monkeypatch.setattr(runner, "run_cell", failing)
    dist_base = built.wheels[0].path.parent.parent  # the session's wheels: reused by content key
    summary = release.release([config], out=tmp_path / "index", dist_base=dist_base,
                              python_versions=[smoke_interpreter.version], smoke_cache=False, twine=False,
                              repo=repo)
    assert not summary.ok and summary.index is None
    (cs,) = summary.configs
    assert [s.name for s in cs.steps] == ["vendor", "native", "wheels", "validate", "smoke"]
    assert cs.steps[2].state == "reused" and cs.steps[4].state == "failed"
    assert "injected failure" in cs.smoke_table
    assert not (tmp_path / "index").exists()
    assert not (dist_base / config.name / dist.CLEARANCE_FILE).exists()


def test_release_twice(built, config, repo, smoke_interpreter, tmp_path):
    why = _mtp_ready()
    if why:
        pytest.skip(f"a release needs the whole smoke workload: {why}")
    kwargs = {"out": tmp_path / "index", "dist_base": tmp_path / "dist",
              "python_versions": [smoke_interpreter.version], "repo": repo}
    first = release.release([config], **kwargs)
    assert first.ok, first.render() + "\n" + first.configs[0].smoke_table
    second = release.release([config], **kwargs)
    assert second.ok, second.render()
    states = {s.name: s.state for s in second.configs[0].steps}
    assert states["native"] == "reused" and states["wheels"] == "reused" and "cached" in states["smoke"]
    vdir = tmp_path / "index" / "whl" / config.variant / "llama-cpp-python"
    assert sorted(p.name for p in vdir.glob("*.whl")) == sorted(w.filename for w in second.configs[0].wheels)

"""The wheels stage hands win_* wheels to delvewheel (repair_windows) and Linux ones to auditwheel."""

from __future__ import annotations

import importlib.util

import pytest

from build_tools.errors import RepairError
from build_tools.stages import wheels as stage
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import repair_windows

pytestmark = pytest.mark.windows


def _options(tmp_path, win_repo):
    return wheels.WheelOptions(out_dir=tmp_path / "dist", python_tags=("cp312",), repo=win_repo, epoch=315532800)


def test_windows_wheels_go_to_delvewheel(fake_native, win_config, win_repo, tmp_path, monkeypatch):
    seen = []

    def fake_repair(built, manifest, config, *, jobs=None):
        seen.append(([w.platform_tag for w in built], config.name))
        return repair_windows.WindowsRepair([w.refreshed(w.path, repaired=True) for w in built], ())

    monkeypatch.setattr(repair_windows, "repair", fake_repair)
    result = stage.run(fake_native, win_config, _options(tmp_path, win_repo))
    assert seen == [(["win_amd64"], win_config.name)]  # the cross target's tag, whatever the host's
    assert result.platform_tag == "win_amd64" and all(w.repaired for w in result.wheels)


def test_missing_delvewheel_names_the_fix(fake_native, win_config, win_repo, tmp_path):
    if importlib.util.find_spec("delvewheel") is not None:
        pytest.skip("delvewheel is installed here")
    with pytest.raises(RepairError, match="delvewheel is not installed: pip install -r requirements/release.txt"):
        stage.run(fake_native, win_config, _options(tmp_path, win_repo))
    assert not (tmp_path / "dist" / wheels.RECORD_FILE).exists()  # no record of unrepaired wheels

"""repair_windows' delvewheel command line, parsed by the installed delvewheel as it would be on Linux
(``os.pathsep`` ":") and on a Windows runner (";"): every excluded DLL and search folder arrives whole."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from build_tools.stages.wheels import repair_windows


def _parsed_by_delvewheel(args: list[str], pathsep: str, monkeypatch) -> dict[str, set[str]]:
    """What delvewheel's own ``main`` makes of ``args`` on a machine whose ``os.pathsep`` is ``pathsep``."""
    main = pytest.importorskip("delvewheel.__main__")
    seen: dict[str, set[str]] = {}

    class Capture:
        def __init__(self, wheel, extract_dir, include, exclude, *_rest):
            seen["exclude"] = set(exclude)
            seen["path"] = set(os.environ["PATH"].split(pathsep))

        def repair(self, *_args, **_kwargs):
            seen["repaired"] = {"yes"}

    monkeypatch.setattr(os, "pathsep", pathsep)
    monkeypatch.setattr(main, "WheelRepair", Capture)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(sys, "argv", ["delvewheel", *args, "-w", "out", "x-1.0-cp312-cp312-win_amd64.whl"])
    main.main()
    return seen


@pytest.mark.parametrize("pathsep", [";", ":"], ids=["windows", "linux"])
def test_delvewheel_receives_every_exclusion_and_folder(pathsep, monkeypatch, tmp_path):
    folders = [tmp_path / "mingw" / "lib", tmp_path / "sysroot"]
    args = repair_windows.delvewheel_args(folders)
    seen = _parsed_by_delvewheel(args, pathsep, monkeypatch)
    assert seen["exclude"] == {n.lower() for n in repair_windows.EXCLUDES}
    assert {os.path.abspath(str(f)) for f in folders} <= seen["path"]
    assert seen["repaired"] == {"yes"}
    assert {"--no-mangle-all", "--analyze-existing", "--ignore-existing"} <= set(args)


def test_no_option_value_holds_a_separator():
    """delvewheel refuses ':' in a DLL name and splits on ';' on Windows: one value per option."""
    args = repair_windows.delvewheel_args([Path("/usr/x86_64-w64-mingw32/lib")])
    values = [args[i + 1] for i, a in enumerate(args) if a == "--exclude"]
    assert values == list(repair_windows.EXCLUDES)
    assert not any(":" in v or ";" in v for v in values)

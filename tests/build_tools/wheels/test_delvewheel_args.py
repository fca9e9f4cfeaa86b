"""repair_windows' delvewheel command line, parsed by the installed delvewheel as it would be on Linux
(``os.pathsep`` ":") and on a Windows runner (";"): every excluded DLL and search folder arrives whole."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from build_tools.common import pe
from build_tools.stages.wheels import repair_windows

pytestmark = pytest.mark.windows


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
    assert seen["exclude"] == {n.lower() for n in repair_windows.EXCLUDES} | pe.SYSTEM_DLLS
    assert {os.path.abspath(str(f)) for f in folders} <= seen["path"]
    assert seen["repaired"] == {"yes"}
    assert {"--no-mangle-all", "--analyze-existing", "--ignore-existing"} <= set(args)


def test_no_option_value_holds_a_separator():
    """delvewheel refuses ':' in a DLL name and splits on ';' on Windows: one value per option."""
    args = repair_windows.delvewheel_args([Path("/usr/x86_64-w64-mingw32/lib")])
    values = [args[i + 1] for i, a in enumerate(args) if a == "--exclude"]
    assert values == [*repair_windows.EXCLUDES, *sorted(pe.SYSTEM_DLLS)]
    assert not any(":" in v or ";" in v for v in values)


def test_windows_dlls_delvewheel_would_graft_are_excluded():
    """delvewheel assumes Windows 7's System32: what Windows 10 added it would copy into the wheel,
    which graft_problems refuses ("part of Windows"); so every such name is excluded."""
    dll_list = pytest.importorskip("delvewheel._dll_list")
    for machine in (dll_list.MachineType.AMD64, dll_list.MachineType.ARM64):
        unknown = {n for n in pe.SYSTEM_DLLS if n not in dll_list.ignore_names[machine]}
        assert unknown <= set(repair_windows.delvewheel_args([])), machine
    assert "ucrtbase.dll" in repair_windows.delvewheel_args([])

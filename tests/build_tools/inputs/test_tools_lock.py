"""requirements/release.lock pins every release requirement with hashes, and the checker catches drift."""

from __future__ import annotations

import re
from pathlib import Path

from build_tools.inputs import tools_lock

ROOT = Path(__file__).resolve().parents[3]
REQS = tools_lock.RELEASE_REQUIREMENTS.read_text(encoding="utf-8")
LOCK = tools_lock.RELEASE_LOCK.read_text(encoding="utf-8")


def test_the_committed_lock_pins_every_release_requirement_with_hashes():
    assert tools_lock.problems(REQS, LOCK) == []
    pins = tools_lock.parse_lock(LOCK)
    assert {"auditwheel", "twine", "packaging", "numpy", "gguf"} <= {p.name for p in pins}
    assert all(p.version and p.hashes >= 1 for p in pins)


def test_release_sessions_install_the_lock_with_hashes_required():
    nox_text = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert '"--require-hashes", "-r", RELEASE_LOCK' in nox_text
    for wf in (ROOT / ".github" / "workflows").glob("*.yml"):
        for line in wf.read_text(encoding="utf-8").splitlines():
            if "requirements/release" in line:
                assert "--require-hashes -r requirements/release.lock" in line, f"{wf.name}: {line.strip()}"


def test_a_requirement_missing_from_the_lock_is_reported():
    found = tools_lock.problems(REQS + "\nbrand-new-tool>=1\n", LOCK)
    assert found == ["brand-new-tool (requirements/release.txt) is not in the lock: run `nox -s lock`"]


def test_a_pin_outside_the_requested_range_is_reported():
    auditwheel = next(p for p in tools_lock.parse_lock(LOCK) if p.name == "auditwheel")
    stricter = re.sub(r"^auditwheel>=[^;\s]*", f"auditwheel>{auditwheel.version}", REQS, flags=re.M)
    assert stricter != REQS
    assert any("outside release.txt's" in p and "auditwheel" in p for p in tools_lock.problems(stricter, LOCK))


def test_an_unhashed_or_unpinned_entry_is_reported():
    lock = LOCK + "\nextra-thing>=2\nother==1.0\n"
    found = tools_lock.problems(REQS, lock)
    assert "extra-thing is not pinned with == in the lock" in found
    assert "other==1.0 has no --hash=sha256 in the lock" in found


def test_relocking_starts_from_the_current_pins(tmp_path, monkeypatch):
    """uv keeps the pins already in its output file: the lock command hands it the current lock
    (an empty file would move every pin to the newest release)."""
    import argparse
    import shutil
    import stat

    from build_tools.commands import lock as lock_cmd
    from build_tools.inputs import tools_lock

    lock, reqs, seen = tmp_path / "release.lock", tmp_path / "release.txt", tmp_path / "seen.txt"
    shutil.copyfile(tools_lock.RELEASE_LOCK, lock)
    shutil.copyfile(tools_lock.RELEASE_REQUIREMENTS, reqs)
    uv = tmp_path / "uv"
    # a stand-in uv: records the output file it was given and leaves it as it is (all pins kept)
    uv.write_text(f'#!/bin/sh\nfor a; do last=$prev; prev=$a; done\ncp "$prev" {seen}\n')
    uv.chmod(uv.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(tools_lock, "RELEASE_LOCK", lock)
    monkeypatch.setattr(tools_lock, "RELEASE_REQUIREMENTS", reqs)
    monkeypatch.setattr(lock_cmd.shutil, "which", lambda name: str(uv) if name == "uv" else None)
    before = lock.read_text()
    assert lock_cmd.run(argparse.Namespace(check=False)) == 0
    assert seen.read_text() == before.removeprefix(tools_lock.HEADER)  # uv saw the current pins
    assert lock.read_text() == before

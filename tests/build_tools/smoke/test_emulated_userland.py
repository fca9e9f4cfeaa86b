"""The arm64 userland under qemu-user: the binfmt_misc registration, and (when the userland is
cached) its python3 running emulated as aarch64."""

from __future__ import annotations

import pytest

from build_tools.errors import ToolNotFoundError
from build_tools.stages.smoke import emulated

pytestmark = pytest.mark.aarch64

DEBIAN_LINE = (r":qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
               r":\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
               r":/usr/libexec/qemu-binfmt/aarch64-binfmt-P:OPF")


def test_registers_the_static_emulator_with_fix_binary(tmp_path, monkeypatch):
    binfmt, conf = tmp_path / "binfmt_misc", tmp_path / "qemu-aarch64.conf"
    binfmt.mkdir()
    (binfmt / "register").write_text("")
    conf.write_text(DEBIAN_LINE + "\n")
    monkeypatch.setattr(emulated, "BINFMT", binfmt)
    monkeypatch.setattr(emulated, "_QEMU_CONF", conf)
    emulated.ensure_binfmt()
    fields = (binfmt / "register").read_text().split(":")
    assert fields[1] == "qemu-aarch64" and fields[6] == "/usr/bin/qemu-aarch64-static" and fields[7] == "F"
    assert fields[4] == DEBIAN_LINE.split(":")[4]  # the ELF magic is Debian's, unchanged


def test_missing_qemu_registration_names_the_package(tmp_path, monkeypatch):
    binfmt = tmp_path / "binfmt_misc"
    binfmt.mkdir()
    (binfmt / "register").write_text("")
    monkeypatch.setattr(emulated, "BINFMT", binfmt)
    monkeypatch.setattr(emulated, "_QEMU_CONF", tmp_path / "absent.conf")
    with pytest.raises(ToolNotFoundError, match="apt-get install qemu-user-static"):
        emulated.ensure_binfmt()


def test_userland_python_runs_as_aarch64(userland):
    out = userland.run([str(userland.python()), "-c", "import platform; print(platform.machine())"], what="arm64 python3")
    assert out.stdout.strip() == "aarch64"


def test_userland_interpreters_and_pip_platforms(userland):
    found = {i.version: i for i in userland.interpreters(["3.10", "3.11", "3.12", "3.13"])}
    present = [i for i in found.values() if i.found]
    assert present, found  # bookworm ships 3.11
    for i in present:
        assert str(i.path) == f"/usr/bin/python{i.version}" and i.full_version.startswith(i.version + ".")
        args = userland.pip_platform(i)
        platforms = [args[n + 1] for n, a in enumerate(args) if a == "--platform"]
        assert "manylinux_2_17_aarch64" in platforms and "manylinux2014_aarch64" in platforms
        assert all(p.endswith("_aarch64") for p in platforms) and args[args.index("--abi") + 1] == i.tag
    for i in found.values():
        if not i.found:
            assert "is not in the arm64 Debian bookworm userland" in i.reason


def test_guest_paths_are_not_resolved_through_links(userland):
    with userland.workspace() as ws:
        assert ws.parent == userland.root / "tmp"
        link = ws / "python"
        link.symlink_to("/usr/bin/python3")  # what a venv's bin/python is
        assert userland.guest(link) == f"/tmp/{ws.name}/python"
        cmd = userland.command(["python3", "-V"], cwd="/tmp", env={"PATH": "/usr/bin"})
        assert cmd[:6] == ["chroot", str(userland.root), "/usr/bin/env", "-i", "-C", "/tmp"]
    assert not ws.exists()

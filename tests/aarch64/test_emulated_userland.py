"""The arm64 userland under qemu-user: the binfmt_misc registration, and (when the userland is
cached) its python3 running emulated as aarch64."""

from __future__ import annotations

import pytest

from build_tools.errors import ToolNotFoundError
from build_tools.stages.smoke import emulated

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


def _cached() -> emulated.Userland | None:
    root = emulated.cache_root() / "userland"
    done = sorted(root.glob(f"arm64-bookworm-*/{emulated._DONE}")) if root.is_dir() else []
    if not done or not (emulated.BINFMT / "qemu-aarch64").exists():
        return None
    return emulated.Userland(done[-1].parent, "bookworm", done[-1].read_text().strip())


def test_userland_python_runs_as_aarch64():
    u = _cached()
    if u is None:
        pytest.skip("no cached arm64 userland with qemu registered (python -c 'from build_tools.stages.smoke "
                    "import emulated; emulated.ensure()' as root makes it)")
    out = u.run([str(u.python()), "-c", "import platform; print(platform.machine())"], what="arm64 python3")
    assert out.stdout.strip() == "aarch64"

"""An arm64 Debian userland run under qemu-user, for smoke-testing aarch64 wheels on x86-64.

``debootstrap --arch=arm64 --variant=minbase`` builds it from Debian's own packages (python3,
python3-venv), with qemu-user-static's binfmt_misc handler registered so the second stage and
every later program run emulated. The tree is cached under the cache root by content (suite,
packages, debootstrap and qemu versions), never in the clone; a half-made tree is never reused.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...common import proc, syspkg
from ...common.hashing import sha256_json
from ...common.paths import cache_root
from ...errors import ToolNotFoundError

MIRROR = "http://deb.debian.org/debian"
HOST_PACKAGES = ("qemu-user-static", "debootstrap")
PACKAGES = ("python3", "python3-venv")
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# qemu-user-static's own registration (F: the interpreter is opened now, so it works in chroots).
_QEMU_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
_DONE = ".userland-complete"


@dataclass(frozen=True)
class Userland:
    root: Path
    suite: str
    key: str

    def python(self) -> Path:
        """The userland's python3 as a path inside it."""
        return Path("/usr/bin/python3")

    def run(self, argv: list[str], *, what: str, timeout: float = 1800) -> proc.subprocess.CompletedProcess:
        return proc.run(["chroot", str(self.root), *argv], what=what, error=ToolNotFoundError, timeout=timeout)


def ensure_binfmt() -> None:
    """Register qemu's aarch64 handler with binfmt_misc (root; mounting the filesystem if needed)."""
    if (BINFMT / "qemu-aarch64").exists():
        return
    if not (BINFMT / "register").exists():
        proc.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], what="mounting binfmt_misc",
                 error=ToolNotFoundError)
    if not _QEMU_CONF.is_file():
        raise ToolNotFoundError(f"{_QEMU_CONF} is missing: apt-get install qemu-user-static")
    fields = _QEMU_CONF.read_text().strip().splitlines()[0].split(":")
    # Debian's line names a wrapper that execs /usr/bin/qemu-aarch64-static, which a chroot lacks:
    # register the static emulator itself, with F (opened now, so chrooted programs need no copy).
    fields[6], fields[7] = "/usr/bin/qemu-aarch64-static", "F"
    try:
        (BINFMT / "register").write_text(":".join(fields))
    except OSError as exc:
        raise ToolNotFoundError(f"cannot register qemu-aarch64 with binfmt_misc ({exc}): run as root, "
                                "or on a host with binfmt-support and qemu-user-static installed") from None


def ensure(suite: str = "bookworm", *, install: bool = True) -> Userland:
    """The cached arm64 userland for ``suite``, made on first use."""
    mgr = syspkg.manager()
    if mgr != "apt":
        raise ToolNotFoundError("the emulated arm64 smoke needs Debian's qemu-user-static and debootstrap (apt)")
    versions = syspkg.ensure(mgr, HOST_PACKAGES, why="the emulated arm64 smoke", install=install)
    ensure_binfmt()
    key = sha256_json({"suite": suite, "packages": PACKAGES, "mirror": MIRROR, "host": versions})
    root = cache_root() / "userland" / f"arm64-{suite}-{key[:16]}"
    if (root / _DONE).is_file():
        return Userland(root, suite, key)
    if root.exists():
        shutil.rmtree(root)  # an earlier attempt died half-way
    root.parent.mkdir(parents=True, exist_ok=True)
    proc.run(["debootstrap", "--arch=arm64", "--variant=minbase", f"--include={','.join(PACKAGES)}",
              suite, str(root), MIRROR], what=f"debootstrap arm64 {suite}", error=ToolNotFoundError,
             timeout=3600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    (root / _DONE).write_text(key + "\n")
    return Userland(root, suite, key)

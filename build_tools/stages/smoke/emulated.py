"""An arm64 Debian userland run under qemu-user, for smoke-testing aarch64 wheels on x86-64.

``debootstrap --arch=arm64 --variant=minbase`` builds it from Debian's own packages (python3,
python3-venv), with qemu-user-static's binfmt_misc handler registered so the second stage and
every later program run emulated. The tree is cached under the cache root by content (suite,
packages, debootstrap and qemu versions), never in the clone; a half-made tree is never reused.

:class:`Userland` is a smoke :class:`~.runner.Sandbox`: cells run in it through ``chroot``, from
a workspace under its ``/tmp``, on the interpreters Debian ships for the suite.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...common import proc, syspkg
from ...common.hashing import sha256_json
from ...common.interpreters import Interpreter
from ...common.paths import cache_root
from ...errors import ToolNotFoundError

MIRROR = "http://deb.debian.org/debian"
# One userland per suite, for the Python each ships: bookworm 3.11, trixie 3.13.
SUITES = ("bookworm", "trixie")
HOST_PACKAGES = ("qemu-user-static", "debootstrap")
PACKAGES = ("python3", "python3-venv")
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# qemu-user-static's own registration (F: the interpreter is opened now, so it works in chroots).
_QEMU_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
_DONE = ".userland-complete"


_PROBE = ("import json, platform; print(json.dumps([platform.python_version(), platform.libc_ver()[1], "
          "platform.machine()]))")


@dataclass(frozen=True)
class Userland:
    root: Path
    suite: str
    key: str
    machine: str = "aarch64"
    timeout_factor: float = 4.0  # qemu-user runs the workload several times slower

    @property
    def name(self) -> str:
        return f"arm64-{self.suite}-{self.key[:16]}"

    def python(self) -> Path:
        """The userland's python3 as a path inside it."""
        return Path("/usr/bin/python3")

    def run(self, argv: list[str], *, what: str, timeout: float = 1800) -> proc.subprocess.CompletedProcess:
        return proc.run(["chroot", str(self.root), *argv], what=what, error=ToolNotFoundError, timeout=timeout)

    def interpreters(self, versions: Sequence[str]) -> list[Interpreter]:
        """The wanted CPython versions as the suite ships them (``/usr/bin/python3.X``), probed inside."""
        have = sorted(p.name[len("python"):] for p in (self.root / "usr/bin").glob("python3.*")
                      if p.name[len("python"):].replace(".", "").isdigit())
        found = []
        for v in versions:
            if v not in have:
                found.append(Interpreter(v, reason=f"is not in the arm64 Debian {self.suite} userland "
                                                   f"(it has {', '.join(have) or 'no Python'})"))
                continue
            full, _libc, machine = _probe(self, v)
            if machine != self.machine:
                raise ToolNotFoundError(f"python{v} in {self.root} runs as {machine}, not {self.machine}: "
                                        "is qemu-user-static registered with binfmt_misc?")
            found.append(Interpreter(v, Path(f"/usr/bin/python{v}"), full))
        return found

    # -- the smoke Sandbox protocol -------------------------------------------------------------
    @contextmanager
    def workspace(self) -> Iterator[Path]:
        (self.root / "tmp").mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="smoke-", dir=self.root / "tmp") as tmp:
            yield Path(tmp)

    def guest(self, host_path: Path) -> str:
        # Not resolved: a venv's bin/python links to /usr/bin/python3.X, a path inside the userland.
        return "/" + Path(os.path.abspath(host_path)).relative_to(os.path.abspath(self.root)).as_posix()

    def command(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str]) -> list[str]:
        return ["chroot", str(self.root), "/usr/bin/env", "-i", "-C", cwd,
                *(f"{k}={v}" for k, v in sorted(env.items())), *map(str, argv)]

    def pip_platform(self, interp: Interpreter) -> list[str]:
        # pip matches --platform exactly: name every manylinux tag the userland's glibc accepts
        # (2.17, the oldest aarch64 one, up to its own), as pip would on that machine.
        major, minor = (int(x) for x in _probe(self, interp.version)[1].split(".")[:2])
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 16, -1)] + [f"manylinux2014_{self.machine}"]
        return [*(a for t in tags for a in ("--platform", t)), "--implementation", "cp",
                "--python-version", interp.version, "--abi", interp.tag]


@functools.cache
def _probe(userland: Userland, version: str) -> tuple[str, str, str]:
    """(full version, glibc version, machine) of ``python<version>`` inside ``userland``."""
    out = userland.run([f"/usr/bin/python{version}", "-I", "-c", _PROBE], what=f"python{version} in the userland",
                       timeout=300).stdout
    full, libc, machine = json.loads(out.strip().splitlines()[-1])
    return full, libc, machine


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

"""System packages (Debian's apt, or dnf on manylinux images): which are installed, their versions,
and installing the missing ones when the step runs as root (CI images, fresh machines)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from ..errors import ToolNotFoundError
from . import proc


def manager() -> str | None:
    """``"apt"`` or ``"dnf"``, whichever this machine uses; None when neither."""
    if shutil.which("dpkg-query") and shutil.which("apt-get"):
        return "apt"
    if shutil.which("rpm") and (shutil.which("dnf") or shutil.which("yum")):
        return "dnf"
    return None


def version(mgr: str, package: str) -> str | None:
    """The installed version of ``package``, or None when it is not installed."""
    if mgr == "apt":
        done = proc.run(["dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", package], check=False)
        status, _, ver = done.stdout.strip().partition(" ")
        return ver if done.returncode == 0 and status == "installed" and ver else None
    done = proc.run(["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", package], check=False)
    return done.stdout.strip() if done.returncode == 0 else None


APT_LISTS = Path("/var/lib/apt/lists")


def available(mgr: str, package: str) -> bool | None:
    """Whether the package manager's repositories offer ``package`` (installed or not); None when
    it cannot tell (apt before its first ``apt-get update``: no package lists)."""
    if mgr == "apt":
        if not any(APT_LISTS.glob("*_Packages*")):
            return None
        done = proc.run(["apt-cache", "show", "--no-all-versions", package], check=False)
        return done.returncode == 0 and bool(done.stdout.strip())
    done = proc.run([shutil.which("dnf") or "yum", "-q", "info", package], check=False, timeout=600)
    return done.returncode == 0


def _privilege() -> list[str] | None:
    """How to run the package manager: directly as root, through passwordless sudo (CI runners), or not."""
    if not hasattr(os, "geteuid") or os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if sudo and proc.run([sudo, "-n", "true"], check=False).returncode == 0:
        return [sudo, "-n", "-E"]
    return None


def ensure(mgr: str, packages: Sequence[str], *, why: str, install: bool = True) -> dict[str, str]:
    """Install what is missing of ``packages`` (as root, when ``install``), then return every package's version."""
    missing = [p for p in packages if version(mgr, p) is None]
    if missing:
        if mgr == "apt":
            cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        else:
            cmd = [shutil.which("dnf") or "yum", "install", "-y", "-q", *missing]
        prefix = _privilege() if install else None
        if prefix is None:
            raise ToolNotFoundError(f"{why} needs the {mgr} packages {', '.join(missing)}: run "
                                    f"`sudo {' '.join(cmd)}`, then run this step again")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if mgr == "apt":
            proc.run([*prefix, "apt-get", "update", "-q"], what="apt-get update", error=ToolNotFoundError,
                     env=env, timeout=900)
        proc.run([*prefix, *cmd], what=f"installing {', '.join(missing)} ({why})", error=ToolNotFoundError,
                 env=env, timeout=1800)
    versions = {}
    for p in packages:
        v = version(mgr, p)
        if v is None:
            raise ToolNotFoundError(f"{p} is still not installed after `{mgr} install`; install it by hand ({why})")
        versions[p] = v
    return versions

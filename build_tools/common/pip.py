"""pip command lines: the one place the tooling spells how it calls pip."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

QUIET = ("--disable-pip-version-check", "-q")


def pip(*args: str, python: Path | str = sys.executable) -> list[str]:
    """``python -m pip ARGS`` with the version check off."""
    return [str(python), "-m", "pip", args[0], "--disable-pip-version-check", *args[1:]]


def download_sdist(requirement: str, into: Path) -> list[str]:
    """Download one sdist without its dependencies into ``into``."""
    return pip("download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(into), requirement)


def install_target(pins: Sequence[str], target: Path) -> list[str]:
    """Install binary wheels, without dependencies, into a plain folder (``--target``)."""
    return pip("install", "--quiet", "--no-deps", "--only-binary=:all:", "--no-compile",
               "--no-warn-script-location", "--target", str(target), *pins)


def install_prefix(requirement: str, prefix: Path) -> list[str]:
    """Install a tool (with its dependencies) under ``prefix`` (``bin/`` + ``lib/``)."""
    return pip("install", "-q", "--prefix", str(prefix), "--ignore-installed", requirement)

"""Skips that name exactly the system packages a platform test lacks.

The platform sessions install what they use (``nox -s windows``, ``nox -s release -- vulkan``,
``nox -s release -- cpu-aarch64``, through :func:`build_tools.common.syspkg.ensure`); a test run
elsewhere skips, naming the missing packages and the command that installs them, never a vaguer
"not installed".
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from build_tools.common import syspkg


def missing_apt(packages: Iterable[str]) -> list[str]:
    """The packages of ``packages`` dpkg does not have installed (all of them without apt)."""
    wanted = list(dict.fromkeys(packages))
    if syspkg.manager() != "apt":
        return wanted
    return [p for p in wanted if syspkg.version("apt", p) is None]


def skip_message(missing: Iterable[str], why: str) -> str:
    names = " ".join(missing)
    return f"{why} needs the apt packages {names}: apt-get install {names}"


def require_apt(packages: Iterable[str], why: str) -> None:
    """Skip the calling test unless every one of ``packages`` is installed."""
    missing = missing_apt(packages)
    if missing:
        pytest.skip(skip_message(missing, why))


def require_cross(*configs: str) -> None:
    """Skip unless the cross toolchains of ``configs`` (their ``[config.cross] apt`` lists) are installed."""
    from build_tools.inputs.configs import load_matrix

    matrix = load_matrix()
    packages = [p for name in configs for p in matrix.get(name).cross.apt]
    require_apt(packages, f"planning {' and '.join(configs)}")

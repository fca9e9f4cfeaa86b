"""Argument helpers shared by the command modules."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..inputs.configs import BuildConfig, load_matrix


def path_arg(text: str) -> Path:
    return Path(text).expanduser()


def resolve_configs(names: Sequence[str]) -> list[BuildConfig]:
    """The named configurations, or the matrix default when none is named."""
    matrix = load_matrix()
    return [matrix.get(n) for n in (names or [matrix.default])]

"""The command-line options the commands share, each declared once, and the :class:`Options` they build."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .dist import DIST, DistDir
from .inputs.configs import BuildConfig, load_matrix
from .stages.publish import DEFAULT_OUT


def path_arg(text: str) -> Path:
    return Path(text).expanduser()


def resolve_configs(names: Sequence[str]) -> list[BuildConfig]:
    """The named configurations, or the matrix default when none is named."""
    matrix = load_matrix()
    return [matrix.get(n) for n in (names or [matrix.default])]


def add_configs(p: argparse.ArgumentParser) -> None:
    p.add_argument("configs", nargs="*", help="configuration names (default: the matrix default)")


def add_dist(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dist", type=path_arg, default=DIST, help="wheels base (dist/<config>/)")


def add_index_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=path_arg, default=DEFAULT_OUT, help="index folder")


def add_pythons(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", action="append", default=None, metavar="X.Y",
                   help="interpreter versions for smoke (repeatable; default 3.10-3.14)")


def add_strict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true", help="a missing interpreter is an error, not a skip")


def add_jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel jobs (default: the CPU count)")


@dataclass(frozen=True)
class Options:
    """What the shared options resolved to; fields a command did not declare keep their defaults."""

    configs: tuple[BuildConfig, ...]
    dist: Path = DIST
    out: Path = DEFAULT_OUT
    pythons: tuple[str, ...] | None = None
    strict: bool = False
    jobs: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        python = getattr(args, "python", None)
        return cls(configs=tuple(resolve_configs(getattr(args, "configs", []))),
                   dist=getattr(args, "dist", DIST), out=getattr(args, "out", DEFAULT_OUT),
                   pythons=tuple(python) if python else None, strict=getattr(args, "strict", False),
                   jobs=getattr(args, "jobs", None))

    def dist_dirs(self) -> list[tuple[BuildConfig, DistDir]]:
        """Each configuration with its ``dist/<config>/`` folder."""
        return [(c, DistDir.of(c, self.dist)) for c in self.configs]

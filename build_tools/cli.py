"""``python -m build_tools STEP [ARGS]``: one subcommand per module in :mod:`build_tools.commands`.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
nox sessions call :func:`main` with the session's arguments. A :class:`~build_tools.errors.BuildToolsError`
is printed (with its traceback under ``-v``) and exits with its class's ``exit_code``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from . import commands
from .errors import BuildToolsError

log = logging.getLogger("build_tools")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def command_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m build_tools", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in command_names():
        module = importlib.import_module(f"{commands.__name__}.{name}")
        p = sub.add_parser(name.replace("_", "-"), help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except BuildToolsError as exc:
        log.error("%s", exc, exc_info=args.verbose)
        return exc.exit_code

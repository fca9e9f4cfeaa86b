"""``python -m llama_cpp COMMAND``: one subcommand per module in this package.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from .._errors import LlamaError


def command_names() -> list[str]:
    """The commands: one per module, ``_`` spelled ``-`` (``rpc_server.py`` is ``rpc-server``)."""
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _module(command: str) -> str:
    return f"{__name__}.{command.replace('-', '_')}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llama_cpp", description="llama.cpp from Python")
    parser.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's own log")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in command_names():
        module = importlib.import_module(_module(name))
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # A command whose trailing positional is a list (``TRAILING``) accepts it between options too,
    # e.g. ``embed --mmproj P MODEL --image x.png "text"``.
    trailing = getattr(importlib.import_module(_module(args.command)), "TRAILING", None)
    if extra and trailing and not any(e.startswith("-") and e != "-" for e in extra):
        getattr(args, trailing).extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args) or 0)
    except (LlamaError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

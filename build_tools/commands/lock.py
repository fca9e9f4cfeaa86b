"""Re-pin the release tools: requirements/release.lock from requirements/release.txt, with hashes (needs uv)."""

from __future__ import annotations

import argparse
import shutil
import sys

from ..common import proc
from ..errors import InputError, ToolNotFoundError
from ..inputs import tools_lock

HELP = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="only check that the lock pins every requirement with hashes (no network)")


def run(args: argparse.Namespace) -> int:
    if not args.check:
        uv = shutil.which("uv")
        if uv is None:
            raise ToolNotFoundError("uv is not installed: pip install uv (nox -s lock installs it)")
        body = tools_lock.RELEASE_LOCK.with_suffix(".lock.tmp")
        try:
            # uv keeps the pins of an existing output file: start from the current lock, so that only
            # what the requirements force moves (an empty file would re-pin everything to the newest)
            if tools_lock.RELEASE_LOCK.is_file():
                old = tools_lock.RELEASE_LOCK.read_text(encoding="utf-8")
                body.write_text(old.removeprefix(tools_lock.HEADER), encoding="utf-8")
            proc.run(tools_lock.compile_command(uv, out=body), what="uv pip compile", capture=False)
            tmp = tools_lock.RELEASE_LOCK.with_suffix(".lock.new")
            tmp.write_text(tools_lock.HEADER + body.read_text(encoding="utf-8"), encoding="utf-8")
            tmp.replace(tools_lock.RELEASE_LOCK)
        finally:
            body.unlink(missing_ok=True)
    found = tools_lock.problems(tools_lock.RELEASE_REQUIREMENTS.read_text(encoding="utf-8"),
                                tools_lock.RELEASE_LOCK.read_text(encoding="utf-8"))
    if found:
        raise InputError(f"{tools_lock.RELEASE_LOCK}:\n  " + "\n  ".join(found))
    sys.stdout.write(f"{tools_lock.RELEASE_LOCK}: every release requirement pinned with hashes\n")
    return 0

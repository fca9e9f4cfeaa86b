"""The release tools' lock: ``requirements/release.lock``, every package pinned with its hashes.

``requirements/release.txt`` says what the release steps need (ranges); the lock, compiled from it
by ``uv pip compile --universal --generate-hashes``, says exactly which files: the release
sessions install it with ``pip --require-hashes``, so a release can be rebuilt later with the very
same tools. :func:`problems` checks the two files agree without any network access.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..common.paths import REPO_ROOT

RELEASE_REQUIREMENTS = REPO_ROOT / "requirements" / "release.txt"
RELEASE_LOCK = REPO_ROOT / "requirements" / "release.lock"
MIN_PYTHON = "3.10"  # the lock resolves for every interpreter from here up (markers split versions)
HEADER = ("# The release tools, pinned with hashes (pip install --require-hashes -r requirements/release.lock).\n"
          "# Generated from requirements/release.txt by `nox -s lock`; do not edit by hand.\n")

_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Pin:
    name: str       # canonical
    version: str
    marker: str     # "" when unconditional
    hashes: int


def compile_command(uv: str, out: Path = RELEASE_LOCK, src: Path = RELEASE_REQUIREMENTS) -> list[str]:
    """The ``uv`` command that (re)writes the lock from the requirements."""
    return [uv, "pip", "compile", str(src), "--universal", "--generate-hashes", "--python-version", MIN_PYTHON,
            "--no-header", "--no-annotate", "--quiet", "-o", str(out)]


def parse_lock(text: str) -> list[Pin]:
    """The pins of a hashed requirements file (continuation lines joined)."""
    pins = []
    logical = re.sub(r"\\\n", " ", text)
    for n, line in enumerate(logical.splitlines(), 1):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, *_ = line.split(" --hash", 1)
        try:
            req = Requirement(spec.strip())
        except InvalidRequirement as exc:
            raise ValueError(f"release.lock, entry {n}: {exc}") from None
        versions = [s.version for s in req.specifier if s.operator == "=="]
        pins.append(Pin(canonicalize_name(req.name), versions[0] if len(versions) == 1 else "",
                        str(req.marker or ""), len(_HASH.findall(line))))
    return pins


def problems(requirements: str, lock: str) -> list[str]:
    """What makes ``lock`` not a hashed, complete pin of ``requirements`` (empty when it is)."""
    out = []
    try:
        pins = parse_lock(lock)
    except ValueError as exc:
        return [str(exc)]
    pinned = {p.name for p in pins}
    for p in pins:
        if not p.version:
            out.append(f"{p.name} is not pinned with == in the lock")
        if p.hashes == 0:
            out.append(f"{p.name}=={p.version} has no --hash=sha256 in the lock")
    for raw in requirements.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name not in pinned:
            out.append(f"{req.name} (requirements/release.txt) is not in the lock: run `nox -s lock`")
            continue
        for p in (p for p in pins if p.name == name and p.version):
            if req.specifier and not req.specifier.contains(p.version, prereleases=True):
                out.append(f"the lock pins {p.name}=={p.version}, outside release.txt's {req.specifier}: "
                           "run `nox -s lock`")
    return out

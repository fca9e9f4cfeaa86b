"""Names that become paths: wheel filenames and index variants, checked before any path is built from them.

Publish joins these onto ``dist/<config>/`` and the index root, so a name from a JSON file must be
one plain component that cannot climb out (``..``), name a folder, or hide as a dotfile.
"""

from __future__ import annotations

import re

from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

_VARIANT = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WHEEL_CHARS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*\.whl$")
_SDIST_CHARS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*\.tar\.gz$")


def wheel_filename_problem(name: object) -> str | None:
    """Why ``name`` is not a plain wheel filename (one path component), or None when it is."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not _WHEEL_CHARS.match(name) or ".." in name:
        return f"{name!r} is not a plain wheel filename (letters, digits, '._+!-', ending in .whl)"
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        return f"{name!r} is not a valid wheel filename ({exc})"
    return None


def dist_filename_problem(name: object) -> str | None:
    """Why ``name`` is neither a plain wheel nor a plain sdist filename (``X-<version>.tar.gz``), or None."""
    if isinstance(name, str) and name.endswith(".tar.gz"):
        if not _SDIST_CHARS.match(name) or ".." in name:
            return f"{name!r} is not a plain sdist filename (letters, digits, '._+!-', ending in .tar.gz)"
        try:
            parse_sdist_filename(name)
        except InvalidSdistFilename as exc:
            return f"{name!r} is not a valid sdist filename ({exc})"
        return None
    return wheel_filename_problem(name)


def variant_problem(variant: object) -> str | None:
    """Why ``variant`` cannot name an index folder, or None when it can."""
    if not isinstance(variant, str):
        return f"must be a string, not {type(variant).__name__}"
    if not _VARIANT.match(variant) or ".." in variant:
        return f"{variant!r} is not a variant name (lowercase letters, digits and '._-', no '..')"
    return None


def sha256_problem(digest: object) -> str | None:
    """Why ``digest`` is not a lowercase hex sha256, or None."""
    if not isinstance(digest, str) or not _SHA256.match(digest):
        return f"{digest!r} is not a sha256 (64 lowercase hex digits)"
    return None

"""Fetch a hosted index (GitHub Pages) into a folder, so publish can merge the next release into it.

Reads ``<url>/whl/index.html`` for the variants, then each variant's ``release-manifest.json`` and
``SHA256SUMS`` and every file they list, refusing a file whose sha256 is not the listed one. A 404
on the root means nothing was published yet. Publish then re-verifies the folder
(:func:`~build_tools.stages.publish.verify_variant`) before it adds anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import urllib.error
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name

from ..common.names import dist_filename_problem, variant_problem
from ..errors import PublishError
from .publish import PROJECT, RELEASE_MANIFEST

log = logging.getLogger(__name__)
_HREF = re.compile(r'href="([^"]+)"')


def _get(url: str, timeout: float = 120.0) -> bytes | None:
    """The body at ``url``; None on 404."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - an https/http URL the user gave
            return r.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise PublishError(f"fetching {url} failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise PublishError(f"fetching {url} failed: {exc}") from None


def fetch(url: str, out: Path) -> int:
    """Mirror the index at ``url`` (the folder holding ``whl/``) into ``out``; returns the files fetched."""
    base = url.rstrip("/")
    root = _get(f"{base}/whl/index.html")
    if root is None:
        log.info("%s/whl/ has no index yet: this is the first release", base)
        return 0
    if (out / "whl").exists():
        raise PublishError(f"{out / 'whl'} exists; fetch into an empty folder")
    proj = canonicalize_name(PROJECT)
    n = 0
    stage = out / "whl"
    for href in _HREF.findall(root.decode("utf-8", "replace")):
        variant = href.rstrip("/")
        if (problem := variant_problem(variant)) is not None:
            raise PublishError(f"{base}/whl/index.html links {href!r}: {problem}")
        vurl, vdir = f"{base}/whl/{variant}", stage / variant
        manifest = _get(f"{vurl}/{RELEASE_MANIFEST}")
        sums = _get(f"{vurl}/SHA256SUMS")
        if manifest is None or sums is None:
            raise PublishError(f"{vurl}/ lacks its {RELEASE_MANIFEST} or SHA256SUMS: the hosted index cannot be "
                               "verified; restore them from the last release before publishing")
        (vdir / proj).mkdir(parents=True)
        (vdir / RELEASE_MANIFEST).write_bytes(manifest)
        (vdir / "SHA256SUMS").write_bytes(sums)
        try:
            files = json.loads(manifest)["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PublishError(f"{vurl}/{RELEASE_MANIFEST} is unreadable ({exc})") from None
        for f in files:
            name = f.get("filename") if isinstance(f, dict) else None
            if (problem := dist_filename_problem(name)) is not None:
                raise PublishError(f"{vurl}/{RELEASE_MANIFEST} lists {problem}")
            data = _get(f"{vurl}/{proj}/{name}")
            if data is None:
                raise PublishError(f"{vurl}/{proj}/{name} is listed by {RELEASE_MANIFEST} but missing (404)")
            if hashlib.sha256(data).hexdigest() != f.get("sha256"):
                raise PublishError(f"{vurl}/{proj}/{name} does not have the sha256 {RELEASE_MANIFEST} lists: "
                                   "the hosted file was changed after it was published")
            (vdir / proj / name).write_bytes(data)
            n += 1
    log.info("fetched %d published file(s) from %s", n, base)
    return n

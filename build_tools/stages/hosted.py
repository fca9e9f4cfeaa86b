"""The hosted index (GitHub Pages) and the release assets its links point at.

A published variant is small: its pages, ``SHA256SUMS`` and ``release-manifest.json``. Each file
entry is served either *beside* the pages (``<variant>/llama-cpp-python/<file>``, a local index or
a small one) or *linked* to where its release put it (a GitHub release asset,
``https://github.com/<owner>/<repo>/releases/download/<tag>/<file>``): GitHub Pages serves at most
1 GB per site, less than one CUDA release. A linked entry is anchored outside the site: the release
that uploaded it also uploaded ``SHA256SUMS-<variant>`` beside it, and publish refuses an entry
whose sha256 that asset does not list (:class:`ReleaseSums`), so an edit to the site alone (a
page, the manifest and SHA256SUMS edited together) is caught without downloading any wheel.

:func:`fetch` mirrors the site into a folder for the next merge: the pages and lists, plus the
files served beside them (each checked against the manifest); linked files are not downloaded.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name

from ..common.names import dist_filename_problem, sha256_problem, variant_problem
from ..dist import PROJECT
from ..errors import PublishError

log = logging.getLogger(__name__)

RELEASE_MANIFEST = "release-manifest.json"  # per index variant: the files it serves and their releases
RELEASE_SUMS = "SHA256SUMS-{variant}"  # the release asset listing the files that release put in a variant
_HREF = re.compile(r'href="([^"]+)"')
_LINK = re.compile(r'<a\s+href="([^"]*)"[^>]*>([^<]*)</a>')


def get(url: str, timeout: float = 120.0) -> bytes | None:
    """The body at ``url`` (redirects followed: GitHub serves release assets from another host); None on 404."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - an https/http URL the user gave
            return r.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise PublishError(f"fetching {url} failed: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise PublishError(f"fetching {url} failed: {exc}") from None


def link_base_problem(base: object) -> str | None:
    """Why ``base`` cannot prefix the file links (an http(s) folder URL ending in '/'), or None."""
    if not isinstance(base, str):
        return f"must be a string, not {type(base).__name__}"
    u = urllib.parse.urlsplit(base)
    if u.scheme not in ("https", "http") or not u.netloc or u.query or u.fragment or not u.path.endswith("/"):
        return f"{base!r} is not an http(s) folder URL ending in '/' (without query or fragment)"
    return None


def file_url(base: str, filename: str) -> str:
    """The link to ``filename`` under ``base`` (``+`` of a local version percent-encoded, as PyTorch's index does)."""
    return base + urllib.parse.quote(filename)


def link_problem(url: object, filename: str) -> str | None:
    """Why ``url`` is not a link to ``filename`` (an http(s) URL whose last path segment is exactly it), or None.

    pip names the file it downloads after the link, so a link to another name (an asset GitHub
    renamed, a typo) would install, or fail to install, something else than the entry says.
    """
    if not isinstance(url, str):
        return f"must be a string, not {type(url).__name__}"
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("https", "http") or not u.netloc or u.query or u.fragment:
        return f"{url!r} is not an http(s) URL without query or fragment"
    target = urllib.parse.unquote(u.path.rsplit("/", 1)[-1])
    if target != filename:
        return f"{url!r} links to {target!r}, not to {filename!r}"
    return None


def parse_sums(text: str, where: str) -> dict[str, str]:
    """A SHA256SUMS body: sha256 by filename, every line a sha256 and a plain distribution filename."""
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition(" ")
        name = name.strip().lstrip("*")
        problem = sha256_problem(digest) or dist_filename_problem(name)
        if problem is not None:
            raise PublishError(f"{where}, line {n}: {problem}; remove that variant folder or fix the line, "
                               "then re-publish")
        sums[name] = digest
    return sums


def page_links(text: str) -> list[tuple[str, str, str | None]]:
    """A PEP 503 project page's links, in order: (link text, href without fragment, sha256 or None)."""
    links = []
    for href, label in _LINK.findall(text):
        href, _, frag = html.unescape(href).partition("#")
        links.append((html.unescape(label).strip(), href, frag[len("sha256="):] if frag.startswith("sha256=") else None))
    return links


class ReleaseSums:
    """Checks linked entries against the ``SHA256SUMS-<variant>`` asset their release uploaded beside
    them; each asset is fetched once (a few kB, never a wheel)."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, str]] = {}

    def problem(self, variant: str, filename: str, url: str, sha256: str) -> str | None:
        """Why the release behind ``url`` does not vouch for ``filename`` with ``sha256``, or None."""
        sums_url = url.rsplit("/", 1)[0] + "/" + urllib.parse.quote(RELEASE_SUMS.format(variant=variant))
        if sums_url not in self._seen:
            body = get(sums_url)
            if body is None:
                return (f"{sums_url} is missing (404): the release that {url} belongs to has no list of its "
                        "files to check the entry against; re-attach it from the release's own files")
            self._seen[sums_url] = parse_sums(body.decode("utf-8", "replace"), sums_url)
        listed = self._seen[sums_url].get(filename)
        if listed is None:
            return f"{sums_url} does not list {filename}: the entry does not belong to that release"
        if listed != sha256:
            return (f"the index lists {filename} with sha256 {sha256[:16]}, but its release ({sums_url}) "
                    f"published {listed[:16]}: the entry was edited after it was published")
        return None


def fetch(url: str, out: Path) -> int:
    """Mirror the index at ``url`` (the folder holding ``whl/``) into ``out``; returns the files downloaded.

    Each variant's ``release-manifest.json``, ``SHA256SUMS`` and project page come along; so does every
    file the manifest serves beside the pages (refused unless it hashes to the listed sha256). Linked
    files stay where they are: publish checks those entries against their releases.
    """
    base = url.rstrip("/")
    root = get(f"{base}/whl/index.html")
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
        manifest = get(f"{vurl}/{RELEASE_MANIFEST}")
        sums = get(f"{vurl}/SHA256SUMS")
        page = get(f"{vurl}/{proj}/")
        if manifest is None or sums is None or page is None:
            raise PublishError(f"{vurl}/ lacks its {RELEASE_MANIFEST}, SHA256SUMS or {proj}/ page: the hosted "
                               "index cannot be verified; restore them from the last release before publishing")
        (vdir / proj).mkdir(parents=True)
        (vdir / RELEASE_MANIFEST).write_bytes(manifest)
        (vdir / "SHA256SUMS").write_bytes(sums)
        (vdir / proj / "index.html").write_bytes(page)
        try:
            files = json.loads(manifest)["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PublishError(f"{vurl}/{RELEASE_MANIFEST} is unreadable ({exc})") from None
        for f in files:
            name = f.get("filename") if isinstance(f, dict) else None
            if (problem := dist_filename_problem(name)) is not None:
                raise PublishError(f"{vurl}/{RELEASE_MANIFEST} lists {problem}")
            if f.get("url") is not None:
                continue  # linked to its release asset: verified by publish against that release's list
            data = get(f"{vurl}/{proj}/{urllib.parse.quote(name)}")
            if data is None:
                raise PublishError(f"{vurl}/{proj}/{name} is listed by {RELEASE_MANIFEST} but missing (404)")
            if hashlib.sha256(data).hexdigest() != f.get("sha256"):
                raise PublishError(f"{vurl}/{proj}/{name} does not have the sha256 {RELEASE_MANIFEST} lists: "
                                   "the hosted file was changed after it was published")
            (vdir / proj / name).write_bytes(data)
            n += 1
    log.info("fetched %d published file(s) from %s", n, base)
    return n

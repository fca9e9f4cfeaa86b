"""Step 6: publish exactly the wheels that passed validate and smoke, as a PEP 503 index.

Input: cleared ``dist/<config>/`` folders (:class:`~build_tools.dist.DistDir`; the gate,
:func:`build_tools.dist.clear`, writes their ``clearance.json`` only when validation and smoke
both passed); :func:`run` refuses any file whose sha256 is not in a clearance. Output, a
:class:`PublishedIndex` (default ``dist/index`` in the repository)::

    <out>/whl/index.html                                  the variants
    <out>/whl/<variant>/index.html                        PEP 503 root: llama-cpp-python
    <out>/whl/<variant>/llama-cpp-python/index.html       the files, #sha256= and data-requires-python
    <out>/whl/<variant>/llama-cpp-python/*.whl            the files served beside the pages (no link_base)
    <out>/whl/<variant>/SHA256SUMS, release-manifest.json

Where a file lives is one parameter, ``link_base``: None serves it beside the pages (a local index,
a small hosted one); a URL (``https://github.com/<owner>/<repo>/releases/download/<tag>/``) links
the entry there instead and the index holds only HTML and lists (GitHub Pages serves at most 1 GB;
one CUDA release is more). Each entry keeps its own link (``url`` in the manifest), so an index can
hold both kinds. :func:`release_assets` lays out what the release must then host.

The whole ``<out>/whl`` tree is built in a temp dir beside it and renamed into place: a
publish that fails half-way leaves the previous index exactly as it was.

Publishing *merges* into the index already in ``<out>`` (for a hosted index, first fetched with
:func:`fetch`): every file it serves must be listed, with the same sha256, by both its
``SHA256SUMS`` and its ``release-manifest.json`` and linked so by its page, and hash to that on
disk (beside) or be vouched for by its release's ``SHA256SUMS-<variant>`` asset (linked,
:class:`~build_tools.stages.hosted.ReleaseSums`; no wheel is downloaded); a published file is
never rewritten (the same name with other bytes is refused: bump the version), so every
earlier release stays installable. The sdist (validated, ``dist/sdist/``) joins the variants
whose wheels carry no local version (what PyPI receives). Uploads (twine to
``$TWINE_REPOSITORY_URL``, GitHub Releases via ``gh``) run only on request.
"""

from __future__ import annotations

import html
import json
import logging
import os
import shutil
import sys
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from ..common import proc
from ..common.fsutil import replace_dir
from ..common.hashing import sha256_file
from ..common.names import dist_filename_problem, sha256_problem, variant_problem
from ..common.paths import REPO_ROOT
from ..dist import CLEARANCE_FILE, PROJECT, Clearance, ClearedWheel, DistDir
from ..errors import PublishError
from .hosted import (
    RELEASE_MANIFEST,
    RELEASE_SUMS,
    ReleaseSums,
    file_url,
    link_base_problem,
    link_problem,
    page_links,
    parse_sums,
)

log = logging.getLogger(__name__)

SDIST_REPORT = "sdist-validation.json"  # dist/sdist/: validate's verdict on the sdist
DEFAULT_OUT = REPO_ROOT / "dist" / "index"



@dataclass(frozen=True)
class PublishedFile:
    variant: str
    filename: str
    sha256: str
    requires_python: str | None
    path: Path | None  # the bytes here: in the index (beside), the dist folder (new), None (linked, old)
    url: str | None = None  # where the entry links (a release asset); None: beside the pages

    @property
    def href(self) -> str:
        """The project page's link (without the ``#sha256=`` fragment)."""
        return self.url if self.url is not None else urllib.parse.quote(self.filename)


@dataclass
class PublishedIndex:
    root: Path  # <out>/whl
    link_base: str | None = None
    files: list[PublishedFile] = field(default_factory=list)
    new: list[PublishedFile] = field(default_factory=list)
    given: list[PublishedFile] = field(default_factory=list)  # every file of this run, new or published before

    def variant_url(self, variant: str) -> str:
        return (self.root / variant).as_uri() + "/"

    def variants(self) -> list[str]:
        return sorted({f.variant for f in self.files})


def _cleared(dist_dirs: Sequence[DistDir]) -> list[tuple[Clearance, ClearedWheel, Path]]:
    """(clearance, wheel, file) for every wheel cleared for release (see :meth:`DistDir.cleared_files`)."""
    out = []
    for dist in dist_dirs:
        rel, files = dist.cleared_files()
        out += [(rel, w, path) for w, path in files]
        listed = {dist.path / w.filename for w in rel.wheels}
        for extra in sorted(set(dist.path.glob("*.whl")) - listed):
            log.warning("not publishing %s: it is not in %s", extra.name, dist.path / CLEARANCE_FILE)
    return out


def _place(src: Path, dst: Path) -> None:
    """Put a file into the staged index (a hard link when possible: wheels can be hundreds of MB)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _read_sums(variant_dir: Path) -> dict[str, str]:
    """The existing variant's SHA256SUMS, every line a sha256 and a plain wheel filename."""
    sums: dict[str, str] = {}
    path = variant_dir / "SHA256SUMS"
    if path.is_symlink():
        raise PublishError(f"the existing index's {path} is a link; remove that variant folder and re-publish")
    if not path.is_file():
        return sums
    return parse_sums(path.read_text(encoding="utf-8"), f"the existing index's {path}")


_Entry = tuple[str, str | None, str | None]  # sha256, requires_python, url


def _read_old_manifest(variant_dir: Path) -> tuple[dict[str, _Entry] | None, list[dict[str, Any]]]:
    """(sha256, requires_python, url) by filename, and the releases, of the existing variant's release
    manifest; None for the files when the variant has no manifest."""
    path = variant_dir / RELEASE_MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, []
    except (ValueError, UnicodeDecodeError) as exc:
        raise PublishError(f"the existing index's {path} is not valid JSON ({exc}); remove it and re-publish") from None

    def bad(what: str) -> PublishError:
        return PublishError(f"the existing index's {path}: {what}; remove it and re-publish")

    if not isinstance(data, dict) or not isinstance(data.get("files", []), list) \
            or not isinstance(data.get("releases", []), list):
        raise bad("expected an object with lists 'files' and 'releases'")
    meta: dict[str, _Entry] = {}
    for i, f in enumerate(data.get("files", [])):
        if not isinstance(f, dict):
            raise bad(f"files[{i}] is not an object")
        if (problem := dist_filename_problem(f.get("filename"))) is not None:
            raise bad(f"files[{i}].filename {problem}")
        if (problem := sha256_problem(f.get("sha256"))) is not None:
            raise bad(f"files[{i}].sha256 {problem}")
        rp = f.get("requires_python")
        if rp is not None and not isinstance(rp, str):
            raise bad(f"files[{i}].requires_python must be a string or null")
        url = f.get("url")
        if url is not None and (problem := link_problem(url, f["filename"])) is not None:
            raise bad(f"files[{i}].url {problem}")
        meta[f["filename"]] = (f["sha256"], rp, url)
    releases = data.get("releases", [])
    if not all(isinstance(r, dict) for r in releases):
        raise bad("every entry of 'releases' must be an object")
    return meta, releases


def verify_variant(variant: str, vdir: Path, release_sums: ReleaseSums | None = None,
                   ) -> tuple[list[PublishedFile], list[dict[str, Any]]]:
    """The files an existing variant serves, each proven: listed alike by ``SHA256SUMS``,
    ``release-manifest.json`` and the project page, and then hashing to that on disk (beside) or
    listed so by its release's ``SHA256SUMS-<variant>`` (linked), with nothing else in its project folder."""
    sums = _read_sums(vdir)
    meta, releases = _read_old_manifest(vdir)
    proj_dir = vdir / canonicalize_name(PROJECT)
    if meta is None:
        if sums:
            raise PublishError(f"the existing index's {vdir} has a SHA256SUMS but no {RELEASE_MANIFEST}: its files "
                               "cannot be checked against their releases; restore the manifest from the release "
                               "that wrote it")
        meta = {}
    disagree = sorted(n for n in set(sums) | set(meta) if sums.get(n) != meta.get(n, (None,))[0])
    if disagree:
        raise PublishError(f"the existing index's {vdir}: SHA256SUMS and {RELEASE_MANIFEST} disagree on "
                           f"{', '.join(disagree[:5])}; one of them was edited: restore both from the release "
                           "that published the file")
    files = [PublishedFile(variant, name, digest, meta[name][1], None, meta[name][2])
             for name, digest in sorted(sums.items())]
    page_path = proj_dir / "index.html"
    if files:
        if page_path.is_symlink() or not page_path.is_file():
            raise PublishError(f"the existing index lacks {page_path} (or it is a link): its links cannot be "
                               "checked; restore it from the last release")
        page = page_links(page_path.read_text(encoding="utf-8"))
        links = {n: (urllib.parse.unquote(h), d) for n, h, d in page}
        want = {f.filename: (urllib.parse.unquote(f.href), f.sha256) for f in files}
        edited = sorted(n for n in set(links) | set(want) if links.get(n) != want.get(n))
        twice = sorted({n for n, _h, _d in page if [m for m, _h2, _d2 in page].count(n) > 1})
        if twice:
            raise PublishError(f"the existing index's {page_path} was edited: it links {twice[0]} more than once; "
                               "restore the page from the release that published it")
        if edited:
            n = edited[0]
            raise PublishError(f"the existing index's {page_path} was edited: it links {n} as {links.get(n)}, but "
                               f"{RELEASE_MANIFEST} and SHA256SUMS publish it as {want.get(n)}; a published entry "
                               "is never rewritten: restore the page from the release that published it")
    checked = []
    for f in files:
        if f.url is not None:
            release_sums = release_sums or ReleaseSums()
            if (problem := release_sums.problem(variant, f.filename, f.url, f.sha256)) is not None:
                raise PublishError(f"the existing index's {vdir}: {problem}; a published entry is never "
                                   "rewritten: restore it from the release that published it")
            checked.append(f)
            continue
        src = proj_dir / f.filename
        if src.is_symlink() or not src.is_file():
            raise PublishError(f"the existing index is missing {src} (or it is a link), which its SHA256SUMS "
                               "lists; restore it from the release that published it")
        got = sha256_file(src)
        if got != f.sha256:
            raise PublishError(f"the existing index's {src} was edited: its sha256 is {got[:16]}, but it was "
                               f"published as {f.sha256[:16]} (SHA256SUMS, {RELEASE_MANIFEST}); a published "
                               "file is never rewritten: restore the original from the release that published it")
        checked.append(replace(f, path=src))
    if proj_dir.is_dir():
        beside = {f.filename for f in files if f.url is None}
        stray = sorted(p.name for p in proj_dir.iterdir() if p.name != "index.html" and p.name not in beside)
        if stray:
            raise PublishError(f"the existing index's {proj_dir} holds {', '.join(stray[:5])}, which neither its "
                               f"SHA256SUMS nor its {RELEASE_MANIFEST} serves from there; remove it, then re-publish")
    return checked, releases


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(f"    {a}<br/>" for a in links)
    return (f"<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.0\">\n"
            f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{body}\n  </body>\n</html>\n")


def _write_variant(stage: Path, variant: str, files: list[PublishedFile], releases: list[dict[str, Any]]) -> None:
    vdir = stage / variant
    proj = canonicalize_name(PROJECT)
    links = []
    for f in sorted(files, key=lambda f: f.filename):
        attrs = f' data-requires-python="{html.escape(f.requires_python, quote=True)}"' if f.requires_python else ""
        links.append(f'<a href="{html.escape(f.href)}#sha256={f.sha256}"{attrs}>{html.escape(f.filename)}</a>')
    (vdir / proj).mkdir(parents=True, exist_ok=True)
    (vdir / proj / "index.html").write_text(_page(f"Links for {proj}", links), encoding="utf-8")
    (vdir / "index.html").write_text(_page(f"Simple index ({variant})", [f'<a href="{proj}/">{proj}</a>']),
                                     encoding="utf-8")
    (vdir / "SHA256SUMS").write_text("".join(f"{f.sha256}  {f.filename}\n" for f in sorted(
        files, key=lambda f: f.filename)), encoding="utf-8")
    manifest = {"schema_version": 1, "project": PROJECT, "variant": variant,
                "files": [{"filename": f.filename, "sha256": f.sha256, "requires_python": f.requires_python,
                           **({"url": f.url} if f.url is not None else {})}
                          for f in sorted(files, key=lambda f: f.filename)],
                "releases": releases}
    (vdir / RELEASE_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _previous_variants(root: Path) -> dict[str, Path]:
    """The existing index's variant folders (refusing anything that is not one)."""
    found: dict[str, Path] = {}
    if not root.is_dir():
        return found
    for p in sorted(root.iterdir()):
        if p.name == "index.html" and p.is_file() and not p.is_symlink():
            continue
        if p.is_symlink() or not p.is_dir() or variant_problem(p.name) is not None:
            raise PublishError(f"the existing index {root} holds {p.name!r}, which is not a variant folder; "
                               "remove it, then re-publish")
        found[p.name] = p
    return found


@dataclass(frozen=True)
class ClearedSdist:
    """An sdist validate passed (``dist/sdist/sdist-validation.json``, by sha256)."""

    path: Path
    sha256: str
    version: str
    requires_python: str | None


def cleared_sdist(folder: Path) -> ClearedSdist | None:
    """The sdist in ``folder`` whose validation report passed these bytes; None when there is none."""
    report = folder / SDIST_REPORT
    if not report.is_file():
        return None
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PublishError(f"{report} is not valid JSON ({exc}); re-run nox -s sdist") from None
    name = data.get("filename") if isinstance(data, dict) else None
    if (problem := dist_filename_problem(name)) is not None or not str(name).endswith(".tar.gz"):
        raise PublishError(f"{report}: filename {problem or 'is not an sdist'}; re-run nox -s sdist")
    path = folder / name
    if not data.get("ok"):
        raise PublishError(f"{report}: validate refused {name}; fix it and re-run nox -s sdist")
    if path.is_symlink() or not path.is_file() or sha256_file(path) != data.get("sha256"):
        raise PublishError(f"refusing {path}: missing, a link, or not the bytes {report} validated")
    from packaging.utils import parse_sdist_filename

    from .wheels.build import read_project

    return ClearedSdist(path, data["sha256"], str(parse_sdist_filename(name)[1]), read_project().requires_python)


def run(dist_dirs: Sequence[DistDir], out: Path = DEFAULT_OUT, *, allow_dev: bool = True,
        sdist: ClearedSdist | None = None, replace_same_version: bool = False,
        link_base: str | None = None) -> PublishedIndex:
    """Merge every cleared wheel in ``dist_dirs`` (and ``sdist``) into the index under ``out/whl``, atomically.

    ``link_base`` None puts the new files beside the pages; a URL links them there instead (the
    release that hosts them is :func:`release_assets`' to lay out). ``replace_same_version`` is the
    local loop's (``nox -s release`` re-run after an edit, into a local index): a file this run
    rebuilt under a published name replaces it, with a warning. The old entries are verified either
    way; ``nox -s publish`` and the release workflow never rewrite an entry.
    """
    if link_base is not None and (problem := link_base_problem(link_base)) is not None:
        raise PublishError(f"link base {problem}")
    cleared = _cleared(dist_dirs)
    if not cleared:
        raise PublishError("nothing to publish: the clearances list no wheels")
    for rel, _w, _p in cleared:
        if not rel.release and not allow_dev:
            raise PublishError(f"{rel.config} is a development configuration (release = false)")
    root = out / "whl"
    release_sums = ReleaseSums()
    previous = {v: verify_variant(v, vdir, release_sums) for v, vdir in _previous_variants(root).items()}
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".whl.tmp-", dir=out))
    index = PublishedIndex(root, link_base)
    try:
        by_variant: dict[str, dict[str, PublishedFile]] = {}
        releases: dict[str, list[dict[str, Any]]] = {}
        proj = canonicalize_name(PROJECT)
        for v, (files, old_releases) in previous.items():
            for f in files:
                if f.url is None:
                    _place(f.path, stage / v / proj / f.filename)
                    f = replace(f, path=root / v / proj / f.filename)
                by_variant.setdefault(v, {})[f.filename] = f
            releases[v] = list(old_releases)
        new: list[tuple[str, str, str, str | None, Path]] = [
            (rel.variant, w.filename, w.sha256, w.requires_python, path) for rel, w, path in cleared]
        if sdist is not None:
            for v in sorted({rel.variant for rel, _w, _p in cleared if rel.version == sdist.version}):
                new.append((v, sdist.path.name, sdist.sha256, sdist.requires_python, sdist.path))
        for v, filename, digest, requires_python, path in new:
            target = stage / v / proj / filename
            if target.resolve().parent != (stage / v / proj).resolve():
                raise PublishError(f"refusing {filename}: it would be written outside {root / v}")
            url = file_url(link_base, filename) if link_base is not None else None
            old = by_variant.get(v, {}).get(filename)
            if old is not None and (old.sha256, old.url) != (digest, url) and replace_same_version:
                log.warning("replacing %s in the local index %s (rebuilt: sha256 %s, was %s)", filename, root / v,
                            digest[:16], old.sha256[:16])
                if old.url is None:
                    target.unlink()  # a hard link to the live index's file: never written through
            elif old is not None:
                if old.sha256 != digest:
                    raise PublishError(f"refusing {filename}: {root / v} already serves a file of that name with "
                                       f"sha256 {old.sha256[:16]}, and this one is {digest[:16]}; a published file "
                                       "is never rewritten: bump the version (llama_cpp/_version.py) and release again")
                if old.url != url:
                    was, now = old.url or "beside its pages", url or "beside its pages"
                    raise PublishError(f"refusing {filename}: {root / v} already links it to {was}, and this "
                                       f"release would link it to {now}; a published entry is never rewritten: "
                                       "bump the version and release again")
                index.given.append(replace(old, path=path))
                continue  # published before, byte for byte: nothing to write
            f = PublishedFile(v, filename, digest, requires_python,
                              root / v / proj / filename if url is None else path, url)
            if url is None:
                _place(path, target)
            by_variant.setdefault(v, {})[filename] = f
            index.new.append(replace(f, path=path))
            index.given.append(replace(f, path=path))
        for rel, _w, _p in cleared:
            rels = releases.setdefault(rel.variant, [])
            if not any(r.get("config") == rel.config and r.get("version") == rel.version for r in rels):
                rels.append(rel.raw)
        for v, files in by_variant.items():
            _write_variant(stage, v, list(files.values()), releases.get(v, []))
            index.files += files.values()
        (stage / "index.html").write_text(
            _page("llama-cpp-python wheel variants", [f'<a href="{v}/">{v}</a>' for v in sorted(by_variant)]),
            encoding="utf-8")
        replace_dir(stage, root)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    log.info("published %d new file(s) into %s", len(index.new), root)
    return index


def release_assets(index: PublishedIndex, folder: Path) -> list[Path]:
    """Lay out, flat in ``folder``, what this run's release hosts: every file it was given and, per
    variant, ``SHA256SUMS-<variant>`` listing them (the list publish later checks linked entries
    against). A release's assets share one namespace: one name with two contents is refused."""
    if folder.exists() and any(folder.iterdir()):
        raise PublishError(f"{folder} is not empty; release assets are laid out in an empty folder")
    by_name: dict[str, PublishedFile] = {}
    for f in index.given:
        seen = by_name.setdefault(f.filename, f)
        if seen.sha256 != f.sha256:
            raise PublishError(f"two release assets would be named {f.filename} ({seen.variant}: {seen.sha256[:16]}, "
                               f"{f.variant}: {f.sha256[:16]}); give the variants' files distinct names")
    # the sums list every entry linked into this release, also one an earlier run of it published
    # and this run was not given (a configuration left out of a re-run): the asset is replaced whole
    ours = {(f.variant, f.filename): f for f in index.files
            if index.link_base is not None and f.url is not None and f.url == file_url(index.link_base, f.filename)}
    ours.update({(f.variant, f.filename): f for f in index.given})
    sums: dict[str, list[PublishedFile]] = {}
    for f in ours.values():
        sums.setdefault(RELEASE_SUMS.format(variant=f.variant), []).append(f)
    clash = sorted(set(by_name) & set(sums))
    if clash:
        raise PublishError(f"a release asset would be named {clash[0]} twice")
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, f in sorted(by_name.items()):
        assert f.path is not None  # every given file comes from a dist folder
        _place(f.path, folder / name)
        out.append(folder / name)
    for name, files in sorted(sums.items()):
        (folder / name).write_text("".join(f"{f.sha256}  {f.filename}\n" for f in sorted(
            files, key=lambda f: f.filename)), encoding="utf-8")
        out.append(folder / name)
    return out


def upload_twine(files: Sequence[Path], repository_url: str | None = None) -> None:
    """Upload to a PyPI-compatible repository (URL and credentials from the environment)."""
    url = repository_url or os.environ.get("TWINE_REPOSITORY_URL")
    if not url:
        raise PublishError("set TWINE_REPOSITORY_URL (and TWINE_USERNAME/TWINE_PASSWORD or a token) to upload")
    cmd = [sys.executable, "-m", "twine", "upload", "--non-interactive", "--repository-url", url, *map(str, files)]
    proc.run(cmd, what=f"twine upload to {url}", error=PublishError, capture=False)


def _release_assets_of(gh: str, tag: str) -> dict[str, dict[str, Any]]:
    """The assets of GitHub release ``tag`` by name (``gh release view --json assets``)."""
    done = proc.run([gh, "release", "view", tag, "--json", "assets"], what=f"gh release view {tag}",
                    error=PublishError)
    try:
        assets = json.loads(done.stdout)["assets"]
        return {a["name"]: a for a in assets}
    except (ValueError, KeyError, TypeError) as exc:
        raise PublishError(f"gh release view {tag} --json assets printed no asset list ({exc})") from None


def _asset_problem(asset: dict[str, Any] | None, path: Path, digest: str, link: str | None) -> str | None:
    """Why the release asset does not serve ``path`` under its own name (and at ``link``), or None."""
    if asset is None:
        return "no asset has that name"
    if asset.get("size") != path.stat().st_size:
        return f"the asset of that name has {asset.get('size')} bytes, the file {path.stat().st_size}"
    if asset.get("digest") and asset["digest"] != f"sha256:{digest}":  # where gh reports one
        return f"the asset of that name has digest {asset['digest']}, the file sha256:{digest}"
    if link is not None and asset.get("url") and \
            urllib.parse.unquote(asset["url"]) != urllib.parse.unquote(link):
        return f"the asset is at {asset['url']}, but the index links {link} (another repository or tag?)"
    return None


def upload_github(files: Sequence[Path], tag: str, link_base: str | None = None) -> None:
    """Attach the files to the GitHub release ``tag`` (created if missing) with the ``gh`` CLI, then
    prove each is an asset under exactly its own name (and, given ``link_base``, at the URL the index
    links): an asset GitHub renamed must never be linked.

    A file the release already holds (same name, size and digest: a re-run) is not uploaded again;
    any other is uploaded with ``--clobber``: publish refused beforehand a name the hosted index
    already links with other bytes, so an asset replaced here is one no deployed page links yet.
    """
    gh = shutil.which("gh")
    if gh is None:
        raise PublishError("the GitHub CLI (gh) is not installed; it is needed for --github-release")
    exists = proc.run([gh, "release", "view", tag], check=False).returncode == 0
    if not exists:
        proc.run([gh, "release", "create", tag, "--title", tag, "--notes", f"llama-cpp-python {tag}"],
                 what=f"gh release create {tag}", error=PublishError, capture=False)
    digests = {p: sha256_file(p) for p in files}

    def link(p: Path) -> str | None:
        return file_url(link_base, p.name) if link_base is not None else None

    present = _release_assets_of(gh, tag) if exists else {}
    todo = [p for p in files if not (present.get(p.name, {}).get("digest") and  # without a digest, upload again
                                     _asset_problem(present[p.name], p, digests[p], link(p)) is None)]
    if todo:
        proc.run([gh, "release", "upload", tag, "--clobber", *map(str, todo)], what=f"gh release upload {tag}",
                 error=PublishError, capture=False)
    assets = _release_assets_of(gh, tag)
    wrong = [f"{p.name}: {problem}" for p in files
             if (problem := _asset_problem(assets.get(p.name), p, digests[p], link(p))) is not None]
    if wrong:
        unknown = sorted(set(assets) - {p.name for p in files})
        raise PublishError(f"GitHub release {tag} does not serve every file under its own name: "
                           + "; ".join(wrong[:5]) + (f" (the release's other assets: {', '.join(unknown[:5])})"
                                                     if unknown else "")
                           + "; an index link to a renamed asset would not resolve: do not deploy the index")
    log.info("GitHub release %s serves %d file(s) under their own names", tag, len(files))

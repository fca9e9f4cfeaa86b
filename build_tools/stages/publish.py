"""Step 6: publish exactly the wheels that passed validate and smoke, as a PEP 503 index.

Input: cleared ``dist/<config>/`` folders (:class:`~build_tools.dist.DistDir`; the gate,
:func:`build_tools.dist.clear`, writes their ``clearance.json`` only when validation and smoke
both passed); :func:`run` refuses any file whose sha256 is not in a clearance. Output, a
:class:`PublishedIndex` (default ``dist/index`` in the repository)::

    <out>/whl/index.html                                  the variants
    <out>/whl/<variant>/index.html                        PEP 503 root: llama-cpp-python
    <out>/whl/<variant>/llama-cpp-python/index.html       the files, #sha256= and data-requires-python
    <out>/whl/<variant>/llama-cpp-python/*.whl
    <out>/whl/<variant>/SHA256SUMS, release-manifest.json

The whole ``<out>/whl`` tree is built in a temp dir beside it and renamed into place: a
publish that fails half-way leaves the previous index exactly as it was.

Publishing *merges* into the index already in ``<out>`` (for a hosted index, first fetched with
:func:`fetch`): every file it serves must be listed, with the same sha256, by both its
``SHA256SUMS`` and its ``release-manifest.json``, and hash to that on disk; a published file is
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

log = logging.getLogger(__name__)

RELEASE_MANIFEST = "release-manifest.json"  # per index variant: the files it serves and their releases
SDIST_REPORT = "sdist-validation.json"  # dist/sdist/: validate's verdict on the sdist
DEFAULT_OUT = REPO_ROOT / "dist" / "index"



@dataclass(frozen=True)
class PublishedFile:
    variant: str
    filename: str
    sha256: str
    requires_python: str | None
    path: Path


@dataclass
class PublishedIndex:
    root: Path  # <out>/whl
    files: list[PublishedFile] = field(default_factory=list)
    new: list[PublishedFile] = field(default_factory=list)

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
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition(" ")
        name = name.strip().lstrip("*")
        problem = sha256_problem(digest) or dist_filename_problem(name)
        if problem is not None:
            raise PublishError(f"the existing index's {path}, line {n}: {problem}; remove that variant folder "
                               "or fix the line, then re-publish")
        sums[name] = digest
    return sums


def _read_old_manifest(variant_dir: Path) -> tuple[dict[str, tuple[str, str | None]] | None, list[dict[str, Any]]]:
    """(sha256, requires_python) by filename, and the releases, of the existing variant's release
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
    meta: dict[str, tuple[str, str | None]] = {}
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
        meta[f["filename"]] = (f["sha256"], rp)
    releases = data.get("releases", [])
    if not all(isinstance(r, dict) for r in releases):
        raise bad("every entry of 'releases' must be an object")
    return meta, releases


def verify_variant(variant: str, vdir: Path) -> tuple[list[PublishedFile], list[dict[str, Any]]]:
    """The files an existing variant serves, each proven: listed alike by ``SHA256SUMS`` and
    ``release-manifest.json`` and hashing to that on disk, with nothing else in its project folder."""
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
    files = []
    for name, digest in sorted(sums.items()):
        src = proj_dir / name
        if src.is_symlink() or not src.is_file():
            raise PublishError(f"the existing index is missing {src} (or it is a link), which its SHA256SUMS "
                               "lists; restore it from the release that published it")
        got = sha256_file(src)
        if got != digest:
            raise PublishError(f"the existing index's {src} was edited: its sha256 is {got[:16]}, but it was "
                               f"published as {digest[:16]} (SHA256SUMS, {RELEASE_MANIFEST}); a published "
                               "file is never rewritten: restore the original from the release that published it")
        files.append(PublishedFile(variant, name, digest, meta[name][1], src))
    if proj_dir.is_dir():
        stray = sorted(p.name for p in proj_dir.iterdir() if p.name != "index.html" and p.name not in sums)
        if stray:
            raise PublishError(f"the existing index's {proj_dir} holds {', '.join(stray[:5])}, which neither its "
                               f"SHA256SUMS nor its {RELEASE_MANIFEST} lists; remove it, then re-publish")
    return files, releases


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
        links.append(f'<a href="{html.escape(f.filename)}#sha256={f.sha256}"{attrs}>{html.escape(f.filename)}</a>')
    (vdir / proj).mkdir(parents=True, exist_ok=True)
    (vdir / proj / "index.html").write_text(_page(f"Links for {proj}", links), encoding="utf-8")
    (vdir / "index.html").write_text(_page(f"Simple index ({variant})", [f'<a href="{proj}/">{proj}</a>']),
                                     encoding="utf-8")
    (vdir / "SHA256SUMS").write_text("".join(f"{f.sha256}  {f.filename}\n" for f in sorted(
        files, key=lambda f: f.filename)), encoding="utf-8")
    manifest = {"schema_version": 1, "project": PROJECT, "variant": variant,
                "files": [{"filename": f.filename, "sha256": f.sha256, "requires_python": f.requires_python}
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
        sdist: ClearedSdist | None = None, replace_same_version: bool = False) -> PublishedIndex:
    """Merge every cleared wheel in ``dist_dirs`` (and ``sdist``) into the index under ``out/whl``, atomically.

    ``replace_same_version`` is the local loop's (``nox -s release`` re-run after an edit, into a
    local index): a file this run rebuilt under a published name replaces it, with a warning. The old
    entries are verified either way; ``nox -s publish`` and the release workflow never rewrite a file.
    """
    cleared = _cleared(dist_dirs)
    if not cleared:
        raise PublishError("nothing to publish: the clearances list no wheels")
    for rel, _w, _p in cleared:
        if not rel.release and not allow_dev:
            raise PublishError(f"{rel.config} is a development configuration (release = false)")
    root = out / "whl"
    previous = {v: verify_variant(v, vdir) for v, vdir in _previous_variants(root).items()}
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".whl.tmp-", dir=out))
    index = PublishedIndex(root)
    try:
        by_variant: dict[str, dict[str, PublishedFile]] = {}
        releases: dict[str, list[dict[str, Any]]] = {}
        proj = canonicalize_name(PROJECT)
        for v, (files, old_releases) in previous.items():
            for f in files:
                _place(f.path, stage / v / proj / f.filename)
                by_variant.setdefault(v, {})[f.filename] = replace(f, path=root / v / proj / f.filename)
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
            old = by_variant.get(v, {}).get(filename)
            if old is not None and old.sha256 != digest and replace_same_version:
                log.warning("replacing %s in the local index %s (rebuilt: sha256 %s, was %s)", filename, root / v,
                            digest[:16], old.sha256[:16])
                target.unlink()  # a hard link to the live index's file: never written through
            elif old is not None:
                if old.sha256 != digest:
                    raise PublishError(f"refusing {filename}: {root / v} already serves a file of that name with "
                                       f"sha256 {old.sha256[:16]}, and this one is {digest[:16]}; a published file "
                                       "is never rewritten: bump the version (llama_cpp/_version.py) and release again")
                continue  # published before, byte for byte: nothing to write
            f = PublishedFile(v, filename, digest, requires_python, root / v / proj / filename)
            _place(path, target)
            by_variant.setdefault(v, {})[filename] = f
            index.new.append(f)
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


def upload_twine(files: Sequence[Path], repository_url: str | None = None) -> None:
    """Upload to a PyPI-compatible repository (URL and credentials from the environment)."""
    url = repository_url or os.environ.get("TWINE_REPOSITORY_URL")
    if not url:
        raise PublishError("set TWINE_REPOSITORY_URL (and TWINE_USERNAME/TWINE_PASSWORD or a token) to upload")
    cmd = [sys.executable, "-m", "twine", "upload", "--non-interactive", "--repository-url", url, *map(str, files)]
    proc.run(cmd, what=f"twine upload to {url}", error=PublishError, capture=False)


def upload_github(files: Sequence[Path], tag: str) -> None:
    """Attach the files to the GitHub release ``tag`` (created if missing) with the ``gh`` CLI."""
    gh = shutil.which("gh")
    if gh is None:
        raise PublishError("the GitHub CLI (gh) is not installed; it is needed for --github-release")
    exists = proc.run([gh, "release", "view", tag], check=False).returncode == 0
    if not exists:
        proc.run([gh, "release", "create", tag, "--title", tag, "--notes", f"llama-cpp-python {tag}"],
                 what=f"gh release create {tag}", error=PublishError, capture=False)
    proc.run([gh, "release", "upload", tag, "--clobber", *files], what=f"gh release upload {tag}",
             error=PublishError, capture=False)

"""Publishing merges into an existing index: two releases side by side, pip resolves both, old files
are never rewritten, and a hosted index is fetched (verified) before the merge."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from build_tools import dist
from build_tools.common.interpreters import Interpreter
from build_tools.inputs.lock import load_lock
from build_tools.stages import hosted, publish, sdist, smoke, validate
from build_tools.stages import wheels as stage_wheels
from build_tools.stages.wheels import build as wheels

from ...native_fakes import snapshot_sources


def _release(native_build, config, repo: Path, base: Path, *, single: bool = True) -> tuple[Path, list]:
    """A cleared dist folder for the package in ``repo`` (wheels repacked from the cpu-host build)."""
    d = base / config.name
    built = stage_wheels.run(native_build, config, wheels.WheelOptions(out_dir=d, repo=repo, single=single))
    report = validate.run(built.wheels, native_build.manifest, config, d, twine=False, repo=repo)
    assert report.ok, report.render()
    passing = smoke.SmokeReport([smoke.SmokeResult(w.filename, w.sha256, "3.x", "pass") for w in built.wheels],
                                [Interpreter("3.x")])
    smoke.save_report(passing, d)
    dist.clear(dist.DistDir(d), config=config, wheels=built.wheels, validation=report, smoke=passing,
               native=native_build.manifest, strict=False)
    return d, built.wheels


def _bumped(root: Path, version: str) -> Path:
    repo = snapshot_sources(root)
    v = repo / "llama_cpp" / "_version.py"
    old = wheels.read_project(repo).version
    v.write_text(re.sub(r'__version__ = "[^"]+"', f'__version__ = "{version}"', v.read_text()))
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f"=={old}\"", f"=={version}\""))  # the plugin extras' pins
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    return repo


@pytest.fixture(scope="module")
def two_releases(native_build, tmp_path_factory):
    """Release 1 (wheels + sdist) and release 2 (a later version), each cleared in its own dist folder."""
    from build_tools.inputs.configs import load_matrix

    config = load_matrix().get(native_build.config.name)
    base = tmp_path_factory.mktemp("releases")
    v1 = wheels.read_project().version
    v2 = f"{v1}.post1" if "post" not in v1 else v1 + "1"
    repo1, repo2 = _bumped(base / "repo1", v1), _bumped(base / "repo2", v2)
    d1, w1 = _release(native_build, config, repo1, base / "dist1")
    sd = sdist.build(load_lock(), base / "dist1" / "sdist", repo=repo1)
    sdist.save_report(sdist.check(sd.path, repo=repo1, version=v1), sd.path.parent)
    d2, w2 = _release(native_build, config, repo2, base / "dist2")
    return config, (v1, d1, w1, sd), (v2, d2, w2)


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def served():
    servers = []

    def serve(root: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield serve
    for s in servers:
        s.shutdown()
        s.server_close()


def _overwrite(path: Path, data: bytes) -> None:
    """Edit an index file without writing through: publish hard-links the index to dist/."""
    path.unlink()
    path.write_bytes(data)


def _published(two_releases, out: Path) -> Path:
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    publish.run([dist.DistDir(d1)], out, sdist=publish.cleared_sdist(sd.path.parent))
    return out / "whl" / config.variant


def test_two_releases_in_one_index_and_pip_resolves_both(two_releases, tmp_path, served):
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    out = tmp_path / "index"
    vdir = _published(two_releases, out)
    before = _tree(vdir / "llama-cpp-python")
    inodes = {p.name: p.stat().st_ino for p in (vdir / "llama-cpp-python").iterdir()}
    index = publish.run([dist.DistDir(d2)], out)
    assert sorted(f.filename for f in index.new) == sorted(w.filename for w in w2)
    after = _tree(vdir / "llama-cpp-python")
    assert {k: v for k, v in after.items() if k in before and k != "index.html"} == \
        {k: v for k, v in before.items() if k != "index.html"}  # nothing published earlier changed
    page = (vdir / "llama-cpp-python" / "index.html").read_text()
    for w in [*w1, *w2]:
        assert f'href="{w.filename}#sha256={w.sha256}"' in page
    assert f'href="{sd.filename}#sha256={sd.sha256}"' in page and 'data-requires-python="&gt;=3.10"' in page
    manifest = json.loads((vdir / "release-manifest.json").read_text())
    assert sorted(r["version"] for r in manifest["releases"]) == sorted([v1, v2])
    sums = dict(reversed(line.split("  ")) for line in (vdir / "SHA256SUMS").read_text().splitlines())
    assert sums == {f["filename"]: f["sha256"] for f in manifest["files"]}
    # publishing the same release again rewrites nothing
    publish.run([dist.DistDir(d2)], out)
    assert {p.name: p.stat().st_ino for p in (vdir / "llama-cpp-python").iterdir() if p.name in inodes
            and p.name != "index.html"} == {k: v for k, v in inodes.items() if k != "index.html"}

    url = f"{served(out)}/whl/{config.variant}/"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "LLAMA_CPP_"))}
    for version, want in ((v1, w1[0].filename), (v2, w2[0].filename), (None, w2[0].filename)):
        dl = tmp_path / f"dl-{version}"
        spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                               "--no-deps", "--only-binary", ":all:", "--index-url", url, "-d", str(dl), spec],
                              capture_output=True, text=True, timeout=300, env=env, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [p.name for p in dl.iterdir()] == [want]
    # the sdist is served beside them (pip builds it where no wheel fits), by the sha256 the page names
    page = urllib.request.urlopen(url + "llama-cpp-python/", timeout=60).read().decode()
    assert f'href="{sd.filename}#sha256={sd.sha256}"' in page
    data = urllib.request.urlopen(url + "llama-cpp-python/" + sd.filename, timeout=60).read()
    assert hashlib.sha256(data).hexdigest() == sd.sha256


def test_an_edited_old_entry_is_refused(two_releases, tmp_path):
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    out = tmp_path / "index"
    vdir = _published(two_releases, out)
    old = vdir / "llama-cpp-python" / w1[0].filename
    saved = old.read_bytes()
    _overwrite(old, saved[:-1] + bytes([saved[-1] ^ 1]))
    snapshot = _tree(out)
    with pytest.raises(publish.PublishError, match="was edited.*never rewritten"):
        publish.run([dist.DistDir(d2)], out)
    assert _tree(out) == snapshot  # the refused publish changed nothing
    # covering the edit in SHA256SUMS alone: the release manifest still disagrees
    sums = vdir / "SHA256SUMS"
    sums.write_text(sums.read_text().replace(w1[0].sha256, hashlib.sha256(old.read_bytes()).hexdigest()))
    with pytest.raises(publish.PublishError, match="disagree"):
        publish.run([dist.DistDir(d2)], out)
    _overwrite(old, saved)
    sums.write_text(sums.read_text().replace(hashlib.sha256(saved[:-1] + bytes([saved[-1] ^ 1])).hexdigest(),
                                             w1[0].sha256))
    (vdir / "llama-cpp-python" / "llama_cpp_python-0.0.1-py3-none-any.whl").write_bytes(b"stray")
    with pytest.raises(publish.PublishError, match="neither its SHA256SUMS"):
        publish.run([dist.DistDir(d2)], out)


def test_a_new_file_never_replaces_a_published_one(two_releases, tmp_path):
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    out = tmp_path / "index"
    _published(two_releases, out)
    # a rebuilt release 1 whose bytes differ (another build date) under the same names
    other = tmp_path / "dist-again"
    shutil.copytree(d1, other)
    with pytest.raises(publish.PublishError, match="never rewritten: bump the version"):
        publish.run([dist.DistDir(other)], out,
                    sdist=publish.ClearedSdist(sd.path, "0" * 64, v1, ">=3.10"))


def test_the_hosted_index_is_fetched_verified_then_merged(two_releases, tmp_path, served):
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    hosted_root = tmp_path / "pages"
    _published(two_releases, hosted_root)
    url = served(hosted_root)
    assert hosted.fetch(url, tmp_path / "empty-site-first") == len(w1) + 1
    work = tmp_path / "work"
    hosted.fetch(url, work)
    assert _tree(work) == {k: v for k, v in _tree(hosted_root).items()  # the project pages, not the roots
                           if not k.endswith("index.html") or k.endswith("llama-cpp-python/index.html")}
    publish.run([dist.DistDir(d2)], work)
    assert {w.filename for w in [*w1, *w2]} <= {p.name for p in (work / "whl" / config.variant / "llama-cpp-python").iterdir()}
    assert hosted.fetch(served(tmp_path / "nothing-here"), tmp_path / "first") == 0
    _overwrite(hosted_root / "whl" / config.variant / "llama-cpp-python" / w1[0].filename, b"changed")
    with pytest.raises(publish.PublishError, match="changed after it was published"):
        hosted.fetch(url, tmp_path / "again")


def test_the_local_loop_replaces_a_rebuilt_file_without_writing_through(two_releases, tmp_path):
    """nox -s release re-run after an edit (replace_same_version): the rebuilt file replaces the old
    entry in the local index; the old bytes are never written over (the stage hard-links them)."""
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    out = tmp_path / "index"
    vdir = _published(two_releases, out)
    served_sdist = vdir / "llama-cpp-python" / sd.filename
    keep = tmp_path / "old-inode"
    os.link(served_sdist, keep)
    rebuilt = tmp_path / "rebuilt" / sd.filename
    rebuilt.parent.mkdir()
    rebuilt.write_bytes(sd.path.read_bytes() + b"\0")
    digest = hashlib.sha256(rebuilt.read_bytes()).hexdigest()
    publish.run([dist.DistDir(d1)], out, sdist=publish.ClearedSdist(rebuilt, digest, v1, ">=3.10"),
                replace_same_version=True)
    assert hashlib.sha256(served_sdist.read_bytes()).hexdigest() == digest
    assert keep.read_bytes() == sd.path.read_bytes()  # the old file's bytes were not written through
    assert f"{digest}  {sd.filename}" in (vdir / "SHA256SUMS").read_text()
    assert publish.verify_variant(config.variant, vdir)[0]  # the index verifies after the replacement


def _pages_only(root: Path) -> set[str]:
    """The names of the files a Pages site holds."""
    return {p.name for p in root.rglob("*") if p.is_file()}


def _release_linked(dist_dir: Path, pages: Path, pages_url: str | None, assets: Path, assets_url: str, tag: str,
                    work: Path, sdist: publish.ClearedSdist | None = None) -> publish.PublishedIndex:
    """What release.yml does for one tag: fetch the published site (if any), merge this release with
    links to its assets, lay the assets out on the "GitHub release" host, deploy the pages."""
    if pages_url is not None:
        assert hosted.fetch(pages_url, work) == 0  # linked entries: no wheel is downloaded
    index = publish.run([dist.DistDir(dist_dir)], work, sdist=sdist, link_base=f"{assets_url}/download/{tag}/")
    publish.release_assets(index, assets / "download" / tag)
    shutil.rmtree(pages / "whl", ignore_errors=True)
    shutil.copytree(work / "whl", pages / "whl")
    return index


@pytest.fixture
def linked(two_releases, tmp_path, served):
    """Release 1 and then release 2 published into one Pages site whose links point at a second host."""
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    pages, assets = tmp_path / "pages", tmp_path / "assets"
    pages.mkdir()
    assets.mkdir()
    pages_url, assets_url = served(pages), served(assets)
    _release_linked(d1, pages, None, assets, assets_url, "v1", tmp_path / "work1",
                    publish.cleared_sdist(sd.path.parent))
    _release_linked(d2, pages, pages_url, assets, assets_url, "v2", tmp_path / "work2")
    return pages, pages_url, assets, assets_url


def _pip_download(url: str, spec: str, dest: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "LLAMA_CPP_"))}
    return subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                           "--only-binary", ":all:", "--index-url", url, "-d", str(dest), spec],
                          capture_output=True, text=True, timeout=300, env=env, check=False)


def test_linked_releases_resolve_across_hosts_with_hash_checks(two_releases, linked, tmp_path):
    """The Pages site holds pages and lists only; pip follows its links to the release host, for
    both versions, and checks each download against the page's sha256."""
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    pages, pages_url, assets, assets_url = linked
    assert _pages_only(pages) == {"index.html", "SHA256SUMS", "release-manifest.json"}
    vdir = pages / "whl" / config.variant
    page = (vdir / "llama-cpp-python" / "index.html").read_text()
    for tag, ws in (("v1", w1), ("v2", w2)):
        for w in ws:
            assert f'href="{assets_url}/download/{tag}/{w.filename}#sha256={w.sha256}"' in page
        assert hosted.parse_sums((assets / "download" / tag / f"SHA256SUMS-{config.variant}").read_text(), "x") == \
            {w.filename: w.sha256 for w in ws} | ({sd.filename: sd.sha256} if tag == "v1" else {})
    assert f'href="{assets_url}/download/v1/{sd.filename}#sha256={sd.sha256}"' in page
    manifest = json.loads((vdir / "release-manifest.json").read_text())
    assert sorted(r["version"] for r in manifest["releases"]) == sorted([v1, v2])
    url = f"{pages_url}/whl/{config.variant}/"
    for version, want in ((v1, w1[0]), (v2, w2[0]), (None, w2[0])):
        dl = tmp_path / f"dl-{version}"
        done = _pip_download(url, f"llama-cpp-python=={version}" if version else "llama-cpp-python", dl)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [p.name for p in dl.iterdir()] == [want.filename]
        assert hashlib.sha256((dl / want.filename).read_bytes()).hexdigest() == want.sha256
    # an asset replaced on the release host: pip refuses it by the page's hash
    _overwrite(assets / "download" / "v1" / w1[0].filename, b"not the published wheel")
    done = _pip_download(url, f"llama-cpp-python=={v1}", tmp_path / "dl-tampered")
    assert done.returncode != 0 and "hash" in (done.stdout + done.stderr).lower()


def test_an_edited_linked_entry_is_refused(two_releases, linked, tmp_path):
    """Editing the site, however consistently, is caught by the release's own SHA256SUMS-<variant>;
    a page that disagrees with the lists, or a link to another file name, is refused too."""
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    pages, pages_url, assets, assets_url = linked
    vdir = pages / "whl" / config.variant
    page, sums, manifest = (vdir / "llama-cpp-python" / "index.html", vdir / "SHA256SUMS",
                            vdir / "release-manifest.json")
    saved = {p: p.read_text() for p in (page, sums, manifest)}
    forged = hashlib.sha256(b"another wheel").hexdigest()

    def merge_refused(match: str) -> None:
        work = tmp_path / f"work-{len(list(tmp_path.iterdir()))}"
        with pytest.raises(publish.PublishError, match=match):
            hosted.fetch(pages_url, work)
            publish.run([dist.DistDir(d2)], work, link_base=f"{assets_url}/download/v3/")
        for p, text in saved.items():
            p.write_text(text)

    for p in (page, sums, manifest):  # one old entry's sha256 changed in all three, consistently
        p.write_text(p.read_text().replace(w1[0].sha256, forged))
    merge_refused(r"SHA256SUMS-.*published .*edited after it was published")
    page.write_text(page.read_text().replace(w1[0].sha256, forged))  # the page alone
    merge_refused("index.html was edited")
    first = next(line for line in page.read_text().splitlines() if w1[0].filename in line)
    page.write_text(page.read_text().replace(first, first.replace(w1[0].sha256, forged) + "\n" + first))
    merge_refused("more than once")  # a second link of the same name before the published one
    renamed = w1[0].filename.replace("-none-", "-abi3-", 1)  # a link to another name than the entry's file
    assert renamed != w1[0].filename
    for p in (page, manifest):
        p.write_text(p.read_text().replace(f"/download/v1/{w1[0].filename}", f"/download/v1/{renamed}"))
    merge_refused(f"links to '{renamed}', not to '{w1[0].filename}'")
    _overwrite(assets / "download" / "v1" / f"SHA256SUMS-{config.variant}", b"")
    merge_refused("does not list")
    (assets / "download" / "v1" / f"SHA256SUMS-{config.variant}").unlink()
    merge_refused("missing .404.")


def test_a_linked_entry_is_never_relinked(two_releases, linked, tmp_path):
    """Release 2 published again under another tag: its files already have links, which stay."""
    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    pages, pages_url, assets, assets_url = linked
    hosted.fetch(pages_url, tmp_path / "again")
    with pytest.raises(publish.PublishError, match="already links it to .*/download/v2/.*never rewritten"):
        publish.run([dist.DistDir(d2)], tmp_path / "again", link_base=f"{assets_url}/download/v3/")
    # the same tag again (a re-run): nothing new, every file of the release still laid out as its asset
    index = publish.run([dist.DistDir(d2)], tmp_path / "again", link_base=f"{assets_url}/download/v2/")
    assert not index.new
    names = {p.name for p in publish.release_assets(index, tmp_path / "rerun-assets")}
    assert names == {w.filename for w in w2} | {f"SHA256SUMS-{config.variant}"}


def test_the_release_workflows_command_links_uploads_and_checks(two_releases, tmp_path, monkeypatch, caplog):
    """``build_tools publish --link-base URL --assets DIR --github-release TAG``, as release.yml runs it
    (``gh`` a stand-in keeping the release in a JSON file): the pages hold no file, every file is an
    asset under its own name at the linked URL, and assets under another tag fail the command."""
    from build_tools import cli

    from ...unit.build_tools.test_release_assets import FAKE_GH

    config, (v1, d1, w1, sd), (v2, d2, w2) = two_releases
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f"#!{sys.executable}\n" + FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GH_STATE", str(tmp_path / "release.json"))
    monkeypatch.setenv("FAKE_GH_LOG", str(tmp_path / "gh.log"))
    base = "https://github.com/owner/llama-cpp-python/releases/download/v1/"
    argv = ["publish", config.name, "--dist", str(d1.parent), "--out", str(tmp_path / "index"), "--link-base", base,
            "--assets", str(tmp_path / "assets"), "--github-release", "v1"]
    assert cli.main(argv) == 0
    assert _pages_only(tmp_path / "index") == {"index.html", "SHA256SUMS", "release-manifest.json"}
    release = json.loads((tmp_path / "release.json").read_text())
    assert set(release) == {w.filename for w in w1} | {sd.filename, f"SHA256SUMS-{config.variant}"}
    assert all(a["url"] == base + name for name, a in release.items())
    monkeypatch.setenv("FAKE_GH_STATE", str(tmp_path / "renamed.json"))
    monkeypatch.setenv("FAKE_GH_TAG", "v0")  # the assets land under another tag than the links name
    argv[argv.index(str(tmp_path / "index"))] = str(tmp_path / "index2")
    argv[argv.index(str(tmp_path / "assets"))] = str(tmp_path / "assets2")
    assert cli.main(argv) != 0
    assert "another repository or tag" in caplog.text and "do not deploy the index" in caplog.text

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

from ..native_fakes import snapshot_sources


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
    assert _tree(work) == {k: v for k, v in _tree(hosted_root).items() if not k.endswith("index.html")}
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

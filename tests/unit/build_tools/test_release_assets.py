"""The release a linked index points at: its assets laid out (one namespace, a SHA256SUMS-<variant>
per variant), uploaded with ``gh`` and proven to sit under their own names; the link helpers."""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from build_tools.errors import PublishError
from build_tools.stages import hosted, publish

BASE = "https://github.com/owner/llama-cpp-python/releases/download/v0.4.0/"
CU = "llama_cpp_python-0.4.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
CPU = "llama_cpp_python-0.4.0-cp312-cp312-manylinux_2_28_x86_64.whl"

# A stand-in for the GitHub CLI keeping a release's assets in a JSON file, as `gh release view
# --json assets` reports them; $FAKE_GH_RENAME renames on upload as GitHub does to some characters,
# $FAKE_GH_TAG serves the assets under another tag's URL.
FAKE_GH = textwrap.dedent('''\
    import hashlib, json, os, sys
    from pathlib import Path
    from urllib.parse import quote
    state = Path(os.environ["FAKE_GH_STATE"])
    args = sys.argv[1:]
    assets = json.loads(state.read_text()) if state.exists() else None
    with open(os.environ["FAKE_GH_LOG"], "a") as log:
        log.write(" ".join(args[:2] + [Path(a).name for a in args[2:]]) + "\\n")
    if args[:2] == ["release", "view"]:
        if assets is None:
            sys.exit(1)
        if "--json" in args:
            print(json.dumps({"assets": list(assets.values())}))
    elif args[:2] == ["release", "create"]:
        state.write_text("{}")
    elif args[:2] == ["release", "upload"]:
        tag = os.environ.get("FAKE_GH_TAG", args[2])
        for f in (a for a in args[3:] if a != "--clobber"):
            name = Path(f).name.replace("+", os.environ.get("FAKE_GH_RENAME", "+"))
            data = Path(f).read_bytes()
            assets[name] = {"name": name, "size": len(data), "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
                            "url": f"https://github.com/owner/llama-cpp-python/releases/download/{tag}/{quote(name)}"}
        state.write_text(json.dumps(assets))
''')


@pytest.fixture
def gh(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "gh"
    script.write_text(f"#!{sys.executable}\n" + FAKE_GH)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_GH_STATE", str(tmp_path / "release.json"))
    monkeypatch.setenv("FAKE_GH_LOG", str(tmp_path / "gh.log"))
    return tmp_path / "gh.log"


def _file(tmp_path: Path, variant: str, name: str, data: bytes) -> publish.PublishedFile:
    path = tmp_path / "dist" / variant / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return publish.PublishedFile(variant, name, hashlib.sha256(data).hexdigest(), ">=3.10", path,
                                 hosted.file_url(BASE, name))


def _index(tmp_path: Path, *files: publish.PublishedFile) -> publish.PublishedIndex:
    return publish.PublishedIndex(tmp_path / "index" / "whl", BASE, given=list(files), new=list(files))


def test_assets_are_the_files_and_each_variants_sums(tmp_path):
    cu, cpu = _file(tmp_path, "cu130", CU, b"cuda wheel"), _file(tmp_path, "cpu", CPU, b"cpu wheel")
    assets = publish.release_assets(_index(tmp_path, cu, cpu), tmp_path / "assets")
    assert sorted(p.name for p in assets) == sorted([CU, CPU, "SHA256SUMS-cu130", "SHA256SUMS-cpu"])
    assert (tmp_path / "assets" / "SHA256SUMS-cu130").read_text() == f"{cu.sha256}  {CU}\n"
    assert hosted.parse_sums((tmp_path / "assets" / "SHA256SUMS-cpu").read_text(), "x") == {CPU: cpu.sha256}
    assert (tmp_path / "assets" / CU).read_bytes() == b"cuda wheel"


def test_one_asset_name_with_two_contents_is_refused(tmp_path):
    a, b = _file(tmp_path, "cpu", CPU, b"one"), _file(tmp_path, "other", CPU, b"two")
    with pytest.raises(PublishError, match=f"two release assets would be named {CPU}"):
        publish.release_assets(_index(tmp_path, a, b), tmp_path / "assets")
    assert not (tmp_path / "assets").exists()
    # the same bytes in two variants (the sdist beside each local-version-free variant) are one asset
    same = _file(tmp_path, "other", CPU, b"one")
    a = _file(tmp_path, "cpu", CPU, b"one")
    names = [p.name for p in publish.release_assets(_index(tmp_path, a, same), tmp_path / "assets")]
    assert names.count(CPU) == 1


def test_uploaded_assets_are_checked_by_name_size_digest_and_url(tmp_path, gh):
    cu = _file(tmp_path, "cu130", CU, b"cuda wheel")
    assets = publish.release_assets(_index(tmp_path, cu), tmp_path / "assets")
    publish.upload_github(assets, "v0.4.0", BASE)
    state = json.loads((tmp_path / "release.json").read_text())
    assert state[CU]["url"] == BASE + CU.replace("+", "%2B") == cu.url  # GitHub keeps '+'; the link encodes it
    assert "release create v0.4.0" in gh.read_text()
    # a re-run finds every asset already there (same digest): nothing is uploaded again
    gh.write_text("")
    publish.upload_github(assets, "v0.4.0", BASE)
    assert "release upload" not in gh.read_text()


def test_an_asset_github_renamed_is_refused(tmp_path, gh, monkeypatch):
    monkeypatch.setenv("FAKE_GH_RENAME", ".")
    assets = publish.release_assets(_index(tmp_path, _file(tmp_path, "cu130", CU, b"w")), tmp_path / "assets")
    with pytest.raises(PublishError, match=rf"{CU.replace('+', '.')}.*do not deploy") as e:
        publish.upload_github(assets, "v0.4.0", BASE)
    assert f"{CU}: no asset has that name" in str(e.value)


def test_an_asset_under_another_tag_than_the_links_is_refused(tmp_path, gh, monkeypatch):
    monkeypatch.setenv("FAKE_GH_TAG", "v0.3.9")
    assets = publish.release_assets(_index(tmp_path, _file(tmp_path, "cu130", CU, b"w")), tmp_path / "assets")
    with pytest.raises(PublishError, match="another repository or tag"):
        publish.upload_github(assets, "v0.4.0", BASE)


def test_a_changed_asset_of_the_same_name_is_uploaded_again(tmp_path, gh):
    assets = publish.release_assets(_index(tmp_path, _file(tmp_path, "cu130", CU, b"first")), tmp_path / "a1")
    publish.upload_github(assets, "v0.4.0", BASE)
    assets = publish.release_assets(_index(tmp_path, _file(tmp_path, "cu130", CU, b"second")), tmp_path / "a2")
    gh.write_text("")
    publish.upload_github(assets, "v0.4.0", BASE)
    assert f"release upload v0.4.0 --clobber {CU}" in gh.read_text()
    assert json.loads((tmp_path / "release.json").read_text())[CU]["size"] == len(b"second")


@pytest.mark.parametrize(("url", "problem"), [
    (BASE + CU.replace("+", "%2B"), None),
    (BASE + CU, None),
    (BASE + CU.replace("+", "."), "links to"),
    (BASE + CU + "?raw=1", "without query"),
    ("ftp://example.org/" + CU, "http(s)"),
    (None, "must be a string"),
])
def test_a_link_must_name_its_file(url, problem):
    got = hosted.link_problem(url, CU)
    assert (got is None) if problem is None else (problem in got)


def test_link_base_and_page_links():
    assert hosted.link_base_problem(BASE) is None
    assert "ending in '/'" in hosted.link_base_problem(BASE.rstrip("/"))
    assert hosted.file_url(BASE, CU) == BASE + "llama_cpp_python-0.4.0%2Bcu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    page = f'<a href="{hosted.file_url(BASE, CU)}#sha256={"a" * 64}" data-requires-python="&gt;=3.10">{CU}</a><br/>'
    assert hosted.page_links(page) == [(CU, hosted.file_url(BASE, CU), "a" * 64)]
    with pytest.raises(PublishError, match="line 2"):
        hosted.parse_sums(f"{'a' * 64}  {CU}\nnot a line\n", "SHA256SUMS")


def test_a_rerun_given_fewer_files_keeps_the_releases_whole_list(tmp_path):
    """A re-run of the tag without one configuration: the entries the first run linked into this
    release stay in its SHA256SUMS-<variant> (the asset is replaced whole), though not re-uploaded."""
    cu = _file(tmp_path, "cu130", CU, b"cuda wheel")
    cp313 = CU.replace("cp312", "cp313")
    earlier = publish.PublishedFile("cu130", cp313, "a" * 64, ">=3.10", None, hosted.file_url(BASE, cp313))
    elsewhere = publish.PublishedFile("cu130", "llama_cpp_python-0.3.9+cu130-py3-none-any.whl", "b" * 64, None, None,
                                      "https://github.com/owner/llama-cpp-python/releases/download/v0.3.9/x.whl")
    index = publish.PublishedIndex(tmp_path / "whl", BASE, files=[cu, earlier, elsewhere], given=[cu], new=[cu])
    assets = {p.name: p for p in publish.release_assets(index, tmp_path / "assets")}
    assert set(assets) == {CU, "SHA256SUMS-cu130"}
    assert hosted.parse_sums(assets["SHA256SUMS-cu130"].read_text(), "x") == {CU: cu.sha256,
                                                                              earlier.filename: earlier.sha256}

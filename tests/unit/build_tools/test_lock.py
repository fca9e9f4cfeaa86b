"""The source lock: the committed one parses; malformed ones fail naming the key."""

from __future__ import annotations

import copy
import json

import pytest

from build_tools.common.paths import LOCK_FILE
from build_tools.errors import LockError, MissingInputError
from build_tools.inputs.lock import GitSource, PypiSdistSource, load_lock, parse_lock


@pytest.fixture()
def raw() -> dict:
    return json.loads(LOCK_FILE.read_text())


def test_committed_lock_parses():
    lock = load_lock()
    assert lock.commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert lock.build_number == 11312
    src = lock.source()
    assert isinstance(src, PypiSdistSource)
    assert src.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert isinstance(lock.source("github"), GitSource)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
        (lambda d: d["llama_cpp"].update(commit="abc"), "llama_cpp.commit"),
        (lambda d: d["llama_cpp"].update(build_number="11312"), "llama_cpp.build_number"),
        (lambda d: d["llama_cpp"].pop("build_number"), "missing key 'build_number'"),
        (lambda d: d["sources"]["pypi-sdist"].update(sha256="XYZ"), "sources.pypi-sdist.sha256"),
        (lambda d: d["sources"]["pypi-sdist"].update(subdir="../evil"), "sources.pypi-sdist.subdir"),
        (lambda d: d["sources"]["pypi-sdist"].update(kind="ftp"), "sources.pypi-sdist.kind"),
        (lambda d: d["sources"]["pypi-sdist"].update(mirror="x"), "unknown key(s) ['mirror']"),
        (lambda d: d["sources"]["github"].update(commit="1" * 40), "differs from llama_cpp.commit"),
        (lambda d: d.update(default_source="nope"), "default_source"),
        (lambda d: d.update(schema_version=2), "schema_version"),
        (lambda d: d["sources"]["pypi-sdist"].update(tree_sha256="short"), "tree_sha256"),
    ],
)
def test_bad_lock_names_the_key(raw, mutate, needle):
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(LockError) as info:
        parse_lock(data)
    assert needle in str(info.value)


def test_unknown_source_name(raw):
    with pytest.raises(LockError, match="no source named 'zip'"):
        parse_lock(raw).source("zip")


def test_missing_lock_file(tmp_path):
    with pytest.raises(MissingInputError, match="source lock not found"):
        load_lock(tmp_path / "none.json")


def test_invalid_json(tmp_path):
    p = tmp_path / "lock.json"
    p.write_text("{not json")
    with pytest.raises(LockError, match="invalid JSON"):
        load_lock(p)

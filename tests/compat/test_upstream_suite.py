"""The upstream-suite runner (``python -m build_tools compat``): its hub cache resolves offline
through huggingface_hub, every model upstream's tests download has a stand-in of the right kind,
and the runner reads pytest's verdict."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from build_tools.common.paths import downloads_dir
from build_tools.compat import NEEDS_REAL_MODEL, STAND_INS, HubFile, build_hub, stand_in_path, suite
from build_tools.inputs.lock import load_lock

SRC = suite.upstream_source(load_lock())
SDIST = downloads_dir() / SRC.filename
needs_sdist = pytest.mark.skipif(not SDIST.is_file(), reason=f"{SRC.filename} is not in the download cache "
                                                             "(nox -s vendor fetches it)")


def test_hub_cache_resolves_offline(tmp_path):
    pytest.importorskip("huggingface_hub")
    a = tmp_path / "a.gguf"
    a.write_bytes(b"model a")
    b = tmp_path / "b.gguf"
    b.write_bytes(b"model b")
    home = build_hub(tmp_path / "home", [HubFile("org/one", "sub/dir/a.gguf", a), HubFile("org/one", "b.gguf", b)])
    repo = home / "hub" / "models--org--one"
    rev = (repo / "refs" / "main").read_text()
    assert len(rev) == 40 and (repo / "snapshots" / rev / "sub" / "dir" / "a.gguf").is_symlink()
    code = ("from huggingface_hub import hf_hub_download as d; import sys;"
            "print(open(d('org/one', 'sub/dir/a.gguf'), 'rb').read().decode());"
            "print(open(d(repo_id='org/one', filename='b.gguf'), 'rb').read().decode())")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["model", "a", "model", "b"]
    # a file that is not in the cache stays an error offline (nothing is fetched)
    missing = subprocess.run([sys.executable, "-c", "from huggingface_hub import hf_hub_download as d;"
                              "d('org/one', 'c.gguf')"], check=False, env=env, capture_output=True, text=True)
    assert missing.returncode != 0


def test_recurrent_stand_in_is_a_mamba():
    from llama_cpp import Llama

    path = stand_in_path("QuantFactory/mamba-130m-hf-GGUF", "mamba-130m-hf.Q2_K.gguf")
    assert path == stand_in_path("QuantFactory/mamba-130m-hf-GGUF", "mamba-130m-hf.Q2_K.gguf")
    with Llama(str(path), n_ctx=64, n_batch=64, n_threads=1, verbose=False) as llm:
        assert llm.model.is_recurrent() and not llm.model.is_hybrid()
        text = llm("The quick brown fox", max_tokens=6, temperature=0)["choices"][0]["text"]
        again = llm("The quick brown fox", max_tokens=6, temperature=0)["choices"][0]["text"]
        assert text and text == again


def test_unknown_model_names_the_table():
    with pytest.raises(KeyError, match="STAND_INS"):
        stand_in_path("someone/else", "model.gguf")


@needs_sdist
def test_every_upstream_download_has_a_stand_in(tmp_path):
    root = suite.extract_tests(SDIST, tmp_path / "up")
    assert (root / "tests" / "test_llama.py").is_file()
    assert (root / "vendor" / "llama.cpp" / "models" / "ggml-vocab-llama-spm.gguf").is_file()
    assert not (root / "llama_cpp").exists()  # only the tests and the vocab files are taken
    pairs = suite.hub_downloads(root / "tests")
    assert len(pairs) >= 5 and set(pairs) <= set(STAND_INS)
    # every deselected test exists upstream
    names = {line.split("def ", 1)[1].split("(")[0] for line in (root / "tests" / "test_llama.py").read_text()
             .splitlines() if line.startswith("def test_")}
    assert {t.split("::")[1] for t in NEEDS_REAL_MODEL} <= names


def test_unsafe_sdist_members_are_not_extracted(tmp_path):
    sdist = tmp_path / "x.tar.gz"
    payload = tmp_path / "p"
    payload.write_text("x = 1\n")
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(payload, "pkg-1/tests/test_a.py")
        tf.add(payload, "pkg-1/tests/../../escape.py")
        tf.add(payload, "pkg-1/setup.py")
    root = suite.extract_tests(sdist, tmp_path / "out")
    assert (root / "tests" / "test_a.py").is_file()
    assert not (tmp_path / "escape.py").exists() and not (root / "setup.py").exists()


def test_junit_reading(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.test_x" name="test_ok"/>'
        '<testcase classname="tests.test_x" name="test_bad[p]"><failure message="AssertionError: 1 != 2&#10;more"/>'
        '</testcase><testcase classname="tests.test_y" name="test_skip"><skipped message="no gpu"/></testcase>'
        '</testsuite></testsuites>')
    outcomes, messages = suite.read_junit(junit)
    assert outcomes == {"tests/test_x.py::test_ok": "passed", "tests/test_x.py::test_bad[p]": "failed",
                        "tests/test_y.py::test_skip": "skipped"}
    assert messages["tests/test_x.py::test_bad[p]"] == "AssertionError: 1 != 2"


@needs_sdist
@pytest.mark.slow
def test_runner_runs_upstreams_chat_and_grammar_tests(tmp_path):
    pytest.importorskip("huggingface_hub")
    env = suite.checkout_env(Path(os.environ["LLAMA_CPP_LIB_PATH"]) if "LLAMA_CPP_LIB_PATH" in os.environ else None)
    report = suite.run(load_lock(), tmp_path / "run", archive=SDIST, env=env,
                       paths=["tests/test_llama_chat_format.py", "tests/test_llama_grammar.py"])
    assert report.count("passed") == 5 and report.count("failed") == 0, report.to_json()
    assert (tmp_path / "run" / "report.json").is_file()
    assert report.deselected == NEEDS_REAL_MODEL

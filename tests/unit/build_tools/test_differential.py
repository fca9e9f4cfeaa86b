"""The differential check and the downstream suite's plumbing (nox -s differential / downstream), and the
version rule they rest on; the checks themselves run in those sessions (they need upstream's build)."""

from __future__ import annotations

import re
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from build_tools.commands import downstream
from build_tools.common.paths import REPO_ROOT
from build_tools.differential import calls, compare, upstream
from build_tools.inputs.lock import load_lock


def test_floats_within_tolerance_are_equal_and_everything_else_exact():
    assert compare.first_difference({"a": [1.0, 2]}, {"a": [1.0 + 1e-6, 2]}) is None
    assert compare.first_difference({"a": [1.0, 2]}, {"a": [1.1, 2]}) == ".a[0]: 1.0 != 1.1"
    assert compare.first_difference({"t": "x"}, {"t": "y"}) == ".t: 'x' != 'y'"
    assert compare.first_difference([1, 2], [1, 2, 3]) == ": 2 items upstream, 3 here"
    assert compare.first_difference({"a": 1}, {"b": 1}) == ".a: only upstream has it"


def test_known_differences_need_a_reason_and_missing_cases_fail():
    up = {"package": {"version": "0.3.36"}, "x/greedy": "a", "x/only-upstream": 1}
    here = {"package": {"version": "0.3.36.1"}, "x/greedy": "b"}
    report = compare.compare(up, here, known={"package": "own version"})
    assert list(report.known) == ["package"] and list(report.different) == ["x/greedy"]
    assert report.missing == ["x/only-upstream"] and not report.ok


def test_every_known_difference_is_in_the_compatibility_page():
    doc = (REPO_ROOT / "docs" / "compatibility.md").read_text()
    for pattern in {**compare.KNOWN, **compare.DOWNSTREAM_KNOWN}:
        if pattern != "package":
            assert f"`{pattern}`" in doc, pattern


def test_the_calls_script_imports_only_llama_cpp_numpy_and_the_standard_library():
    src = (REPO_ROOT / "build_tools" / "differential" / "calls.py").read_text()
    imported = {m.split(".")[0] for m in re.findall(r"^(?:from|import) ([\w.]+)", src, re.M)}
    assert imported - set(sys.stdlib_module_names) <= {"llama_cpp", "numpy", "__future__"}
    assert calls.CHAT_FORMATS and len(calls.SAMPLERS) >= 15


def test_the_upstream_build_is_keyed_by_content_and_pins_this_packages_isa():
    defs = upstream.cmake_definitions()
    assert defs["GGML_NATIVE"] == "OFF" and defs["GGML_AVX2"] == "ON" and defs["GGML_OPENMP"] == "OFF"
    src = load_lock().sources["pypi-sdist"]
    key = upstream.cache_key(src, defs)
    assert key.startswith(f"{src.version}-{src.sha256[:12]}-cp{sys.version_info.major}{sys.version_info.minor}-")
    assert upstream.cache_key(src, {**defs, "GGML_AVX2": "OFF"}) != key


def test_each_downstream_library_is_pinned_exactly():
    lines = downstream.library_lines()
    names = {r.split("==")[0] for line in lines for r in line}
    assert {"outlines", "guidance", "llama-cpp-agent", "instructor", "langchain-community",
            "llama-index-llms-llama-cpp", "llama-cpp-haystack"} <= names
    assert all("==" in r for line in lines for r in line)


def test_the_version_names_the_upstream_api_line_it_implements():
    """0.3.36.N: the locked upstream sdist's version, then this package's release on that line; so a
    downstream pin of llama-cpp-python<0.4 or ~=0.3.36 keeps this wheel."""
    import llama_cpp

    v = Version(llama_cpp.__version__)
    src = load_lock().sources["pypi-sdist"]
    assert v.release[:3] == Version(src.version).release and len(v.release) == 4 and v.release[3] >= 1
    assert v > Version(src.version) and v in SpecifierSet("<0.4") and v in SpecifierSet(f"~={src.version}")


def test_a_pattern_star_is_one_path_segment():
    assert compare.known_reason("spm/logprobs/echo", {"*/logprobs/echo": "why"}) == "why"
    assert compare.known_reason("spm/logits_all/logprobs/echo", {"*/logprobs/echo": "why"}) is None

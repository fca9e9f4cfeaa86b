"""validate on macOS wheels: the dylibs' architecture and load commands (Mach-O), beside every other check."""

from __future__ import annotations

import pytest

from build_tools.stages import validate
from build_tools.stages.wheels import build as wheels
from build_tools.stages.wheels import inwheel

from ..macos_fakes import LIBRARIES, dylib

pytestmark = pytest.mark.macos


def _check(ws, native, config, repo):
    return validate.validate(ws, native.manifest, config, version=wheels.expected_version(config, repo),
                             python_tags=("cp311", "cp312"), twine=False, repo=repo)


def test_the_metal_wheels_pass(mac_wheels, mac_native, mac_config, mac_repo):
    report = _check(mac_wheels, mac_native, mac_config, mac_repo)
    assert report.ok, report.render()


@pytest.mark.parametrize(("lib", "data", "check", "needle"), [
    ("libllama.0.dylib", dylib("libllama.0.dylib", LIBRARIES["libllama.0.dylib"], cpu=0x01000007),
     "architecture", "a x86_64 file in an arm64 wheel"),
    ("libggml-metal.so", dylib("libggml-metal.so", (*LIBRARIES["libggml-metal.so"], "/opt/homebrew/lib/libomp.dylib")),
     "dylib-dependency", "/opt/homebrew/lib/libomp.dylib"),
    ("libggml.0.dylib", dylib("libggml.0.dylib", LIBRARIES["libggml.0.dylib"], rpaths=["/Users/runner/work/build"]),
     "dylib-dependency", "LC_RPATH '/Users/runner/work/build'"),
])
def test_a_wrong_dylib_is_refused_by_name(mac_wheels, mac_native, mac_config, mac_repo, lib, data, check, needle):
    w = mac_wheels[0]
    inwheel.rewrite(w.path, w.path, replace={f"llama_cpp/lib/{lib}": data})  # RECORD rewritten: consistent
    report = _check([w.refreshed(w.path)], mac_native, mac_config, mac_repo)
    failures = report.wheels[0].failures
    assert {check, "library-hash"} <= {f.check for f in failures}, report.render()
    assert any(f.check == check and needle in f.message and lib in f.message for f in failures), report.render()

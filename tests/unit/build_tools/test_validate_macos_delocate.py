"""The Metal build against delocate-wheel's rules (macos-14 release rows): repair_macos refuses any change
delocate makes to the libraries, so the build must give delocate nothing to rewrite and delocate must
not re-sign them.

delocate 0.13 rewrites every reference between a wheel's own libraries to ``@loader_path/<relative
path>`` unless it already reads so, and its rpath sanitizer (on by default) keeps only rpaths starting
``@loader_path/`` and re-signs each library that loads another of the wheel even when it deletes
nothing. The build therefore names its libraries ``@loader_path/<name>`` and repair turns the
sanitizer off. Where delocate is installed (macOS), its own decision functions are run on the
Metal build's library graph.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from build_tools.inputs.configs import load_matrix
from build_tools.inputs.lock import load_lock
from build_tools.stages.native import build as native
from build_tools.stages.wheels import repair_macos
from llama_cpp._native.binfmt import macho_dependencies
from tests.native.fake_binaries import macho_dylib

pytestmark = pytest.mark.macos

SYSTEM = ("/usr/lib/libc++.1.dylib", "/usr/lib/libSystem.B.dylib")
# The Metal build's libraries and which of them each loads (dylibs by install name; modules have none).
GRAPH = {
    "libggml-base.0.dylib": (),
    "libggml.0.dylib": ("libggml-base.0.dylib",),
    "libggml-cpu-apple_m1.so": ("libggml-base.0.dylib",),
    "libggml-metal.so": ("libggml-base.0.dylib",),
    "libllama.0.dylib": ("libggml-base.0.dylib", "libggml.0.dylib"),
    "libmtmd.0.dylib": ("libggml-base.0.dylib", "libggml.0.dylib", "libllama.0.dylib"),
}


def _install_dir(defines: dict[str, str]) -> str:
    """The directory part CMake gives install names: INSTALL_NAME_DIR, else @rpath (MACOSX_RPATH)."""
    if defines.get("CMAKE_BUILD_WITH_INSTALL_NAME_DIR", defines.get("CMAKE_BUILD_WITH_INSTALL_RPATH")) != "ON":
        pytest.fail("the build tree's install names would not be the install ones")
    return defines.get("CMAKE_INSTALL_NAME_DIR", "@rpath")


def _metal_libraries(lib: Path, install_dir: str) -> None:
    """The Metal build's libraries as the defines make them, written into ``lib``."""
    lib.mkdir(parents=True)
    rpath = native.cmake_defines(load_matrix().get("metal"), load_lock())["CMAKE_INSTALL_RPATH"]
    for name, loads in GRAPH.items():
        ident = f"{install_dir}/{name}" if name.endswith(".dylib") else None
        (lib / name).write_bytes(macho_dylib([*SYSTEM, *(f"{install_dir}/{d}" for d in loads)],
                                             install_name=ident, rpaths=[rpath]))


def test_metal_libraries_name_each_other_by_loader_path():
    m, lock = load_matrix(), load_lock()
    d = native.cmake_defines(m.get("metal"), lock)
    assert _install_dir(d) == "@loader_path"
    for c in m.configs.values():  # Linux and Windows keys stay as they were
        if c.target[0] != "Darwin":
            assert "CMAKE_INSTALL_NAME_DIR" not in native.cmake_defines(c, lock), c.name


def test_delocate_runs_without_its_rpath_sanitizer(tmp_path):
    args = repair_macos.delocate_args("macosx_14_0_arm64", tmp_path, "w.whl")
    assert "--no-sanitize-rpaths" in args and args[-1] == "w.whl"
    assert args[args.index("--require-archs") + 1] == "arm64" and args[args.index("-w") + 1] == str(tmp_path)


def _lib_dict(lib: Path) -> dict[str, dict[str, str]]:
    """delocate's view of the tree (libsana.tree_libs_from_directory): each library of the wheel a
    library loads, by real path, with the install name it is loaded by (system libraries filtered)."""
    out: dict[str, dict[str, str]] = {}
    for f in sorted(lib.iterdir()):
        deps = macho_dependencies(f.read_bytes())
        for name in deps.needed:
            if name.startswith(SYSTEM):
                continue
            prefix, base = name.split("/", 1)
            assert prefix in ("@rpath", "@loader_path") and (lib / base).is_file(), name
            out.setdefault(os.path.realpath(lib / base), {})[os.path.realpath(f)] = name
    return out


@pytest.mark.parametrize("install_dir, changes", [("@loader_path", False), ("@rpath", True)])
def test_delocate_leaves_the_metal_libraries_alone(tmp_path, monkeypatch, install_dir, changes):
    delocating = pytest.importorskip("delocate.delocating")
    wheel_cmd = pytest.importorskip("delocate.cmd.delocate_wheel")
    from delocate.cmd.common import delocate_values

    lib = tmp_path / "wheel" / "llama_cpp" / "lib"
    _metal_libraries(lib, install_dir)
    touched: list[tuple[str, str]] = []
    monkeypatch.setattr(delocating, "set_install_name", lambda f, old, new, *a, **k: touched.append((f, new)))
    monkeypatch.setattr(delocating, "_remove_absolute_rpaths", lambda f, *a, **k: touched.append((f, "re-signed")))
    parsed = wheel_cmd.parser.parse_args(repair_macos.delocate_args("macosx_14_0_arm64", tmp_path / "o", "w.whl"))
    sanitize = delocate_values(parsed)["sanitize_rpaths"]
    copied = delocating.delocate_tree_libs(_lib_dict(lib), str(tmp_path / "wheel" / "llama_cpp" / ".dylibs"),
                                           str(tmp_path / "wheel"), sanitize_rpaths=sanitize)
    assert copied == {}
    assert bool(touched) == changes, touched
    assert not sanitize


def test_delocates_sanitizer_would_delete_our_rpath():
    """Why repair turns it off: ``@loader_path`` (no slash) is not a "sanitary" rpath to delocate."""
    tools = pytest.importorskip("delocate.tools")
    assert not tools._is_rpath_sanitary("@loader_path") and tools._is_rpath_sanitary("@loader_path/x")


def test_the_build_defines_pass_delocate(tmp_path):
    """The library graph the Metal defines give has every in-wheel reference in delocate's final form."""
    lib = tmp_path / "lib"
    _metal_libraries(lib, _install_dir(native.cmake_defines(load_matrix().get("metal"), load_lock())))
    for required, requiring in _lib_dict(lib).items():
        for f, name in requiring.items():
            assert name == "@loader_path/" + os.path.relpath(required, os.path.dirname(f)), (f, name)

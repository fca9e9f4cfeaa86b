"""Every bound symbol exists in the built libraries; optional staging symbols resolve by mangled name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import binding_modules

LIB_OF = {"llama": "libllama.so", "mtmd": "libmtmd.so", "ggml": ("libggml.so", "libggml-base.so")}


def _dynamic_symbols(path: Path) -> set[str]:
    r = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}


def _lib_files(lib_dir: Path, stems: str | tuple[str, ...]) -> list[Path]:
    stems = (stems,) if isinstance(stems, str) else stems
    return [min(lib_dir.glob(stem + "*")) for stem in stems]


@pytest.fixture(scope="module")
def exported(lib_dir: Path) -> dict[str, set[str]]:
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    return {lib: set().union(*(_dynamic_symbols(p) for p in _lib_files(lib_dir, stems)))
            for lib, stems in LIB_OF.items()}


def test_every_required_symbol_is_exported_by_its_library(exported):
    missing = []
    for mod in binding_modules():
        for fn in mod.__bindings__.required():
            if fn.symbols[0] not in exported[fn.library]:
                missing.append(f"{fn.__name__} not in lib{fn.library}")
    assert not missing, "\n".join(missing)


def test_every_required_symbol_resolves_through_ctypes(lib_dir):
    from llama_cpp._native import loader as _loader

    assert _loader.lib_dir() == lib_dir.resolve()
    for mod in binding_modules():
        for fn in mod.__bindings__.required():
            assert fn.find() is not None, fn.__name__


def test_optional_staging_symbols_resolve(exported):
    from llama_cpp import llama_cpp as C

    for fn in C.__bindings__.optionals():
        assert fn.symbols[0] in exported["llama"], f"{fn.__name__}: {fn.symbols[0]} not exported"
    status = C.optional_symbols()
    assert status and all(status.values()), status
    assert status["llama_set_embeddings_nextn"]


def test_a_missing_optional_symbol_raises(lib_dir):
    import ctypes

    from llama_cpp import OptionalSymbolMissing
    from llama_cpp._native.ctypes_util import CFunction

    ghost = CFunction("llama_ghost", "llama", [ctypes.c_void_p], None,
                      symbols=("_Z11llama_ghostPv", "?llama_ghost@@YAXPEAX@Z"), optional=True)
    assert not ghost.available()
    with pytest.raises(OptionalSymbolMissing, match="llama_ghost"):
        ghost(None)


def test_calls_work_and_replace_the_lazy_stub(lib_dir):
    from llama_cpp import llama_cpp as C
    from llama_cpp._native.ctypes_util import CFunction

    stub = C.__bindings__.functions["llama_max_devices"]
    assert isinstance(stub, CFunction)
    assert stub() >= 1
    assert not isinstance(C.llama_max_devices, CFunction)  # the module now holds the raw ctypes function
    params = C.llama_context_default_params()
    assert params.n_ctx > 0 and params.ctx_type == C.LLAMA_CONTEXT_TYPE_DEFAULT
    assert C.llama_model_default_params().load_mtp is False
    assert isinstance(C.llama_version(), bytes)

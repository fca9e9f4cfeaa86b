"""Issue 13 item 9: clear messages for a foreign library, a stream continued after close()."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama
from llama_cpp._errors import ClosedError

from .probe import run_python

FOREIGN = textwrap.dedent('''
    import json
    import llama_cpp.llama_cpp
    try:
        llama_cpp.llama_cpp.llama_max_devices()
        print(json.dumps(["loaded", ""]))
    except Exception as e:
        print(json.dumps([type(e).__name__, str(e)]))
''')


def test_foreign_library_names_the_symbol_and_the_fix(tmp_path: Path) -> None:
    found = ctypes.util.find_library("z")
    candidates = [Path(d) / found for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib",
                                             "/lib")] if found else []
    foreign = next((p for p in candidates if p.is_file()), None)
    if foreign is None:
        pytest.skip("no libz to pose as a foreign llama.cpp library")
    for stem in ("ggml-base", "ggml", "llama", "mtmd"):
        shutil.copy(foreign, tmp_path / f"lib{stem}.so")
    kind, message = run_python(FOREIGN, env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(tmp_path)))
    assert kind == "LibraryLoadError", (kind, message)
    assert "does not export ggml_" in message and "LLAMA_CPP_LIB_PATH" in message


def test_stream_after_close_raises_closed_error() -> None:
    llm = Llama(fixture_path("llama_spm"), n_ctx=64, verbose=False)
    stream = llm("hello", max_tokens=8, temperature=0, stream=True)
    next(stream)
    llm.close()
    with pytest.raises(ClosedError, match="closed"):
        next(stream)
    llm = Llama(fixture_path("llama_spm"), n_ctx=64, verbose=False)
    tokens = llm.generate(llm.tokenize(b"hello"), temp=0)
    next(tokens)
    llm.close()
    with pytest.raises(ClosedError):
        next(tokens)

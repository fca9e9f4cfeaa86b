"""The bump tool: a checklist of header changes against the bindings, exit 1 when out of date."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from build_tools.bindgen import headers as H

REPO = Path(__file__).resolve().parents[2]


def _copy_tree(dst: Path) -> Path:
    for rel in H.HEADER_PATHS.values():
        src = H.VENDOR / rel
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)
    for p in (H.VENDOR / "ggml" / "include").glob("*.h"):  # headers the public ones include
        shutil.copy2(p, dst / "ggml" / "include" / p.name)
    return dst


def _bump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "build_tools", "bump", *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=120, check=False)


def test_bump_is_clean_on_the_vendored_headers():
    r = _bump()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to date" in r.stdout


def test_bump_reports_a_modified_llama_h(tmp_path):
    root = _copy_tree(tmp_path / "llama.cpp")
    h = root / "include" / "llama.h"
    text = h.read_text()
    edits = [
        ("#define LLAMA_SESSION_VERSION 10", "#define LLAMA_SESSION_VERSION 11"),
        ("    LLAMA_API int32_t llama_n_threads_batch(struct llama_context * ctx);\n", ""),
        ("                                               int32_t   idx,\n                                       const llama_pos * pos);",
         "                                               int64_t   idx,\n                                       const llama_pos * pos);"),
        ("        uint32_t n_rs_seq; ", "        uint32_t n_new_field;\n        uint32_t n_rs_seq; "),
        ("        LLAMA_CONTEXT_TYPE_MTP     = 1,\n", "        LLAMA_CONTEXT_TYPE_MTP     = 1,\n        LLAMA_CONTEXT_TYPE_DFLASH  = 2,\n"),
        ("    LLAMA_API const char * llama_version(void);\n",
         "    LLAMA_API const char * llama_version(void);\n    LLAMA_API int32_t llama_brand_new(const struct llama_model * model, float x);\n"),
    ]
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    h.write_text(text)
    r = _bump("--against", str(root))
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "- [ ] added: `int32_t llama_brand_new(const struct llama_model * model, float x)`" in out
    assert "- [ ] removed: llama_n_threads_batch" in out
    assert "llama_batch_ext_set_pos arg 1 (idx): ctypes i32 != header int64_t (i64)" in out
    assert "llama_context_params: field added in the header: uint32_t n_new_field" in out
    assert "- [ ] changed: LLAMA_SESSION_VERSION = 11 (bound as 10)" in out
    assert "- [ ] added: LLAMA_CONTEXT_TYPE_DFLASH = 2" in out
    assert "python -m build_tools.bindgen" in out


def test_bump_names_a_missing_tree(tmp_path):
    r = _bump("--against", str(tmp_path))
    assert r.returncode == 2 and "llama.h" in r.stderr

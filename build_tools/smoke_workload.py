"""The smoke workload: run with ``python -I`` inside a fresh venv holding one installed wheel.

Standard library only (plus what the wheel itself depends on); never imports from the
repository. Stages, each reported as pass/fail with a reason in the JSON written to ``--out``:

    import      ``import llama_cpp`` resolves to the venv's copy, with the intended version
    libraries   every loaded llama/ggml/mtmd library is the wheel's own (path inside the installed
                ``llama_cpp/lib`` and sha256 equal to the embedded native manifest)
    embedding   ``LlamaEmbedding(model).embed(["a", "b"])`` gives a finite float32 (2, n) array
    mtp         greedy completion with MTP speculative decoding equals plain greedy completion

Exit status 0 when every requested stage passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_OURS = re.compile(r"^(lib)?(llama|ggml|mtmd)[-.]")
STAGES = ("import", "libraries", "embedding", "mtp")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mapped_files() -> list[Path]:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    out = set()
    for line in maps.read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.add(Path(parts[5].strip()))
    return sorted(out)


def stage_import(args: argparse.Namespace, state: dict[str, Any]) -> str:
    import llama_cpp

    pkg = Path(llama_cpp.__file__).resolve().parent
    site_dirs = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if pkg.parent not in site_dirs:
        raise AssertionError(f"llama_cpp imported from {pkg}, not from this venv's site-packages {sorted(site_dirs)}")
    if args.version and llama_cpp.__version__ != args.version.split("+")[0]:
        raise AssertionError(f"llama_cpp.__version__ is {llama_cpp.__version__}, expected {args.version}")
    state["pkg"] = pkg
    return f"llama_cpp {llama_cpp.__version__} from {pkg}"


def stage_libraries(args: argparse.Namespace, state: dict[str, Any]) -> str:
    import llama_cpp

    pkg: Path = state.get("pkg") or Path(llama_cpp.__file__).resolve().parent
    lib_dir = (pkg / "lib").resolve()
    manifest = json.loads((pkg / "native-manifest.json").read_text(encoding="utf-8"))
    expected = {rec["path"].rsplit("/", 1)[-1]: rec["sha256"] for rec in manifest["libraries"]}
    try:
        from llama_cpp import _loader
    except ImportError as exc:
        raise AssertionError(f"llama_cpp._loader is not available ({exc})") from None
    _loader.load()
    if not any(s.loaded for s in _loader.backends()):
        raise AssertionError(f"no backend loaded: {_loader.backends()}")
    reported = {Path(p) for p in _loader.loaded_library_paths().values()}
    mapped = {p for p in _mapped_files() if _OURS.match(p.name)}
    loaded = sorted({p.resolve() for p in reported | mapped if _OURS.match(p.name)})
    problems = []
    for p in loaded:
        if p.parent != lib_dir:
            problems.append(f"{p} is loaded from outside the wheel's {lib_dir}")
        elif p.name not in expected:
            problems.append(f"{p.name} is not in the embedded native manifest")
        elif _sha256(p) != expected[p.name]:
            problems.append(f"{p.name}: sha256 differs from the embedded native manifest")
    names = {p.name for p in loaded}
    for core in ("libllama", "libggml", "libggml-base"):
        if not any(n.startswith(core + ".") for n in names):
            problems.append(f"{core} is not loaded")
    if args.require_gpu:
        gpu = [s for s in _loader.backends() if s.loaded and any(d.type in ("GPU", "IGPU") for d in s.devices)]
        if not gpu:
            problems.append(f"no GPU backend loaded: {[(s.name, s.reason) for s in _loader.backends()]}")
    if problems:
        raise AssertionError("; ".join(problems))
    state["libraries"] = [str(p) for p in loaded]
    return f"{len(loaded)} libraries, all from {lib_dir} and matching the manifest"


def _need(name: str) -> Any:
    import llama_cpp

    try:
        return getattr(llama_cpp, name)
    except (AttributeError, ImportError) as exc:
        raise AssertionError(f"llama_cpp.{name} is not available in this build of the package ({exc})") from None


def stage_embedding(args: argparse.Namespace, state: dict[str, Any]) -> str:
    import numpy as np

    if not args.embedding_model:
        raise AssertionError("no --embedding-model given")
    LlamaEmbedding = _need("LlamaEmbedding")
    emb = LlamaEmbedding(args.embedding_model)
    out = emb.embed(["a", "b"])
    arr = np.asarray(out)
    if arr.dtype != np.float32 or arr.ndim != 2 or arr.shape[0] != 2:
        raise AssertionError(f"embed(['a', 'b']) gave {arr.dtype} {arr.shape}, expected float32 (2, n_embd)")
    if not np.isfinite(arr).all() or not np.abs(arr).sum(axis=1).all():
        raise AssertionError("embeddings contain non-finite or all-zero rows")
    close = getattr(emb, "close", None)
    if callable(close):
        close()
    return f"embeddings {arr.shape} {arr.dtype}"


def stage_mtp(args: argparse.Namespace, state: dict[str, Any]) -> str:
    if not args.mtp_model:
        raise AssertionError("no --mtp-model given")
    Llama = _need("Llama")
    SpecConfig = _need("SpecConfig")
    SpeculativeType = _need("SpeculativeType")
    plain = Llama(args.mtp_model, n_ctx=256, verbose=False)
    ref = plain.create_completion(args.prompt, max_tokens=16, temperature=0)["choices"][0]["text"]
    getattr(plain, "close", lambda: None)()
    spec = Llama(args.mtp_model, n_ctx=256, verbose=False,
                 speculative=SpecConfig(spec_type=SpeculativeType.DRAFT_MTP, draft_n_max=4))
    got = spec.create_completion(args.prompt, max_tokens=16, temperature=0)["choices"][0]["text"]
    stats = getattr(spec, "last_speculative_stats", None)
    getattr(spec, "close", lambda: None)()
    if got != ref:
        raise AssertionError(f"MTP greedy output {got!r} != plain greedy {ref!r}")
    if stats is None:
        raise AssertionError("llm.last_speculative_stats is None after an MTP completion")
    return f"MTP output equals greedy ({len(ref)} chars); stats {stats}"


_STAGE_FUNCS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], str]] = {
    "import": stage_import, "libraries": stage_libraries, "embedding": stage_embedding, "mtp": stage_mtp,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--version", default="")
    p.add_argument("--embedding-model", default="")
    p.add_argument("--mtp-model", default="")
    p.add_argument("--prompt", default="a b c")
    p.add_argument("--require-gpu", action="store_true")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in _STAGE_FUNCS]
    if unknown:
        p.error(f"unknown stages {unknown}; choose from {list(STAGES)}")
    results: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] = {}
    failed = False
    for name in stages:
        started = time.monotonic()
        if failed and name in ("libraries", "embedding", "mtp") and results.get("import", {}).get("status") != "pass":
            results[name] = {"status": "fail", "detail": "not run: import failed", "seconds": 0.0}
            continue
        try:
            detail = _STAGE_FUNCS[name](args, state)
            results[name] = {"status": "pass", "detail": detail}
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its type, never raised
            failed = True
            msg = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
            results[name] = {"status": "fail", "detail": msg,
                             "traceback": traceback.format_exc(limit=6)[-2000:]}
        results[name]["seconds"] = round(time.monotonic() - started, 3)
    report = {"python": sys.version.split()[0], "executable": sys.executable, "cwd": os.getcwd(),
              "stages": results, "libraries": state.get("libraries", [])}
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

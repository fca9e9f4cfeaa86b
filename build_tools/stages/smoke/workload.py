"""The smoke workload: run with ``python -I`` inside a fresh venv holding one installed wheel.

Standard library only (plus the installed ``llama_cpp`` and its dependencies, numpy among
them); never imports from the repository. One registry of stages, each reported as pass/fail
with a reason in the JSON written to ``--out``:

    import      ``import llama_cpp`` resolves to the venv's copy, with the intended version
    libraries   every loaded llama/ggml/mtmd library is the wheel's own (path inside the installed
                ``llama_cpp/lib`` and sha256 equal to the embedded native manifest)
    backends    a GPU backend is loaded with a device (``--allow-cpu``: run the GPU side on the
                CPU); from here on the later stages compare the GPU with the CPU
    generation  all layers offloaded; teacher-forced logits and greedy tokens match the CPU
    embedding   ``LlamaEmbedding.embed`` gives finite float32 rows (and, after ``backends``,
                the GPU's rows match the CPU's)
    mtp         greedy completion with MTP speculative decoding equals plain greedy completion

A failed gate stage (``import``, ``backends``) marks every later stage as not run. Exit status
0 when every requested stage passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RELEASE_STAGES = ("import", "libraries", "embedding", "mtp")
GPU_STAGES = ("import", "libraries", "backends", "generation", "embedding", "mtp")
MODEL_ROLES = ("generation", "embedding", "mtp")
PROMPT = "the quick brown fox"
N_PREDICT = 32
ALL_LAYERS = 999
# GPU kernels reorder float sums (and cuBLAS may use other algorithms): results differ from
# the CPU in the last bits. A broken offload differs by the size of the values themselves.
LOGITS_RTOL = 2e-2
EMBD_MIN_COSINE = 0.999
EMBED_TEXTS = ("the quick brown fox", "jumps over the lazy dog", "a")
_OURS = re.compile(r"^(lib)?(llama|ggml|mtmd)[-.]")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


@dataclass
class Context:
    """What the stages share: the command line and what earlier stages found."""

    args: argparse.Namespace
    pkg: Path | None = None
    libraries: list[str] = field(default_factory=list)
    gpu_layers: int | None = None  # set by ``backends``: the later stages compare GPU and CPU

    def model(self, role: str) -> str:
        path = getattr(self.args, f"{role}_model")
        if not path:
            raise AssertionError(f"no --{role}-model given")
        return path


@dataclass(frozen=True)
class Stage:
    run: Callable[[Context], str]
    gate: bool = False  # when it fails, the later stages are not run


# ============================================================================ numeric comparisons

def compare_logits(cpu: Any, gpu: Any, rtol: float = LOGITS_RTOL) -> tuple[bool, float, float]:
    """(ok, max |cpu - gpu|, bound): the largest difference must stay under ``rtol`` x the logits' scale."""
    import numpy as np

    cpu, gpu = np.asarray(cpu, dtype=np.float64), np.asarray(gpu, dtype=np.float64)
    if cpu.shape != gpu.shape:
        return False, float("inf"), 0.0
    if not (np.isfinite(cpu).all() and np.isfinite(gpu).all()):
        return False, float("inf"), 0.0
    diff = float(np.max(np.abs(cpu - gpu))) if cpu.size else 0.0
    bound = rtol * max(float(np.max(np.abs(cpu))) if cpu.size else 0.0, 1e-6)
    return diff <= bound, diff, bound


def greedy_agrees(cpu_ids: Sequence[int], gpu_ids: Sequence[int], cpu_logits: Any, tie: float) -> tuple[bool, str]:
    """Greedy tokens must be equal; a divergence is accepted only at a near-tie of the CPU's top two logits.

    ``cpu_logits[i]`` are the logits that chose ``cpu_ids[i]``; ``tie`` is the largest logit
    difference between the backends, below which the two best tokens are interchangeable.
    """
    import numpy as np

    n = min(len(cpu_ids), len(gpu_ids))
    for i in range(n):
        if cpu_ids[i] != gpu_ids[i]:
            row = np.sort(np.asarray(cpu_logits[i], dtype=np.float64))[::-1]
            gap = float(row[0] - row[1])
            if gap <= 2 * tie:
                return True, f"diverged at token {i} on a near-tie (top-2 gap {gap:.2e} <= {2 * tie:.2e})"
            return False, f"token {i}: CPU {cpu_ids[i]}, GPU {gpu_ids[i]} (top-2 gap {gap:.2e})"
    if len(cpu_ids) != len(gpu_ids):
        return False, f"CPU produced {len(cpu_ids)} tokens, GPU {len(gpu_ids)}"
    return True, f"{n} greedy tokens identical"


def offloaded(lines: Sequence[str]) -> tuple[int, int] | None:
    """(N, M) of llama.cpp's last "offloaded N/M layers to GPU" log line."""
    for line in reversed(lines):
        m = _OFFLOADED.search(line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


# ============================================================================ helpers

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


def _need(name: str) -> Any:
    import llama_cpp

    try:
        return getattr(llama_cpp, name)
    except (AttributeError, ImportError) as exc:
        raise AssertionError(f"llama_cpp.{name} is not available in this build of the package ({exc})") from None


def _layers(n_gpu_layers: int | None) -> dict[str, int]:
    """Constructor keywords: the package default when no comparison is running."""
    return {} if n_gpu_layers is None else {"n_gpu_layers": n_gpu_layers}


def _gpu_backends() -> list[Any]:
    return [s for s in _need("backends")() if s.loaded and any(d.type in ("GPU", "IGPU") for d in s.devices)]


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# ============================================================================ stages

def stage_import(ctx: Context) -> str:
    import llama_cpp

    pkg = Path(llama_cpp.__file__).resolve().parent
    site_dirs = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if pkg.parent not in site_dirs:
        raise AssertionError(f"llama_cpp imported from {pkg}, not from this venv's site-packages {sorted(site_dirs)}")
    if ctx.args.version and llama_cpp.__version__ != ctx.args.version.split("+")[0]:
        raise AssertionError(f"llama_cpp.__version__ is {llama_cpp.__version__}, expected {ctx.args.version}")
    ctx.pkg = pkg
    return f"llama_cpp {llama_cpp.__version__} from {pkg}"


def stage_libraries(ctx: Context) -> str:
    import llama_cpp

    pkg = ctx.pkg or Path(llama_cpp.__file__).resolve().parent
    lib_dir = (pkg / "lib").resolve()
    manifest = json.loads((pkg / "native-manifest.json").read_text(encoding="utf-8"))
    expected = {rec["path"].rsplit("/", 1)[-1]: rec["sha256"] for rec in manifest["libraries"]}
    try:
        from llama_cpp import _loader as loader
    except ImportError as exc:
        raise AssertionError(f"llama_cpp._loader is not available ({exc})") from None
    loader.load()
    if not any(s.loaded for s in loader.backends()):
        raise AssertionError(f"no backend loaded: {loader.backends()}")
    # The serving backends are asked too (the chosen CPU variant of GGML_CPU_ALL_VARIANTS among
    # them): under qemu-user /proc/self/maps names no guest library.
    serving = [s for s in loader.backends() if s.loaded and s.path is not None]
    reported = {Path(p) for p in loader.loaded_library_paths().values()} | {Path(s.path) for s in serving}
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
    if ctx.args.require_gpu and not _gpu_backends():
        problems.append(f"no GPU backend loaded: {[(s.name, s.reason) for s in loader.backends()]}")
    if problems:
        raise AssertionError("; ".join(problems))
    ctx.libraries = [str(p) for p in loaded]
    cpu = sorted(Path(s.path).name for s in serving if s.name == "CPU")
    return (f"{len(loaded)} libraries, all from {lib_dir} and matching the manifest; "
            f"CPU backend {', '.join(cpu) or 'linked in'} on {platform.machine()}")


def stage_backends(ctx: Context) -> str:
    statuses = _need("backends")()
    desc = "; ".join(f"{s.name}: {'loaded' if s.loaded else 'not loaded (' + str(s.reason) + ')'}"
                     f"{' ' + ', '.join(d.description or d.name for d in s.devices) if s.devices else ''}"
                     for s in statuses)
    gpus = [d for s in _gpu_backends() for d in s.devices if d.type in ("GPU", "IGPU")]
    if not gpus:
        if ctx.args.allow_cpu:
            ctx.gpu_layers = 0
            return f"no GPU device (allowed by --allow-cpu: the GPU side runs on the CPU); {desc}"
        raise AssertionError(f"no GPU backend is loaded with a device: {desc}")
    ctx.gpu_layers = ALL_LAYERS
    return "; ".join(f"{d.description or d.name} ({d.memory_total / 2**30:.1f} GiB)" for d in gpus)


def _greedy_run(model: str, n_gpu_layers: int) -> dict[str, Any]:
    """Greedy ids after PROMPT, then the teacher-forced logits of prompt + ids in one batch."""
    import numpy as np

    Llama = _need("Llama")
    cap = _LogCapture()
    native = logging.getLogger("llama_cpp.native")
    old_level = native.level
    native.setLevel(logging.DEBUG)
    native.addHandler(cap)
    try:
        llm = Llama(model, n_gpu_layers=n_gpu_layers, n_ctx=256, n_batch=256, n_ubatch=256,
                    logits_all=True, verbose=False, seed=0)
    finally:
        native.removeHandler(cap)
        native.setLevel(old_level)
    try:
        prompt = llm.tokenize(PROMPT.encode("utf-8"))
        t = time.monotonic()
        ids: list[int] = []
        for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            ids.append(int(tok))
            if len(ids) >= N_PREDICT:
                break
        seconds = time.monotonic() - t
        llm.reset()
        seq = prompt + ids
        llm.eval(seq)
        # Row j holds the logits that predict token j + 1: the ones that chose ids[k] are row
        # len(prompt) - 1 + k.
        logits = np.stack([np.array(llm.ctx.logits_ith(j), dtype=np.float32)
                           for j in range(len(prompt) - 1, len(seq) - 1)])
    finally:
        llm.close()
    return {"ids": ids, "logits": logits, "seconds": seconds, "offloaded": offloaded(cap.lines)}


def _tokens_per_second(run: dict[str, Any]) -> float:
    return len(run["ids"]) / run["seconds"] if run["seconds"] > 0 else float("inf")


def stage_generation(ctx: Context) -> str:
    model = ctx.model("generation")
    layers = ALL_LAYERS if ctx.gpu_layers is None else ctx.gpu_layers
    cpu, gpu = _greedy_run(model, 0), _greedy_run(model, layers)
    problems = []
    if layers:
        off = gpu["offloaded"]
        if off is None:
            problems.append("llama.cpp did not log 'offloaded N/N layers to GPU'")
        elif off[0] != off[1]:
            problems.append(f"only {off[0]}/{off[1]} layers were offloaded")
    n = min(len(cpu["logits"]), len(gpu["logits"]))
    ok, diff, bound = compare_logits(cpu["logits"][:n], gpu["logits"][:n])
    if not ok:
        problems.append(f"teacher-forced logits differ by {diff:.3e} (> {bound:.3e})")
    agree, why = greedy_agrees(cpu["ids"], gpu["ids"], cpu["logits"], diff)
    if not agree:
        problems.append(f"greedy tokens differ: {why}")
    if problems:
        raise AssertionError("; ".join(problems))
    return (f"{why}; max logit diff {diff:.2e} (bound {bound:.2e}); layers {gpu['offloaded']}; "
            f"CPU {_tokens_per_second(cpu):.0f} tok/s, GPU {_tokens_per_second(gpu):.0f} tok/s")


def _embed(model: str, n_gpu_layers: int | None) -> tuple[Any, float]:
    """Checked float32 rows of EMBED_TEXTS (as float64) and the seconds ``embed`` took."""
    import numpy as np

    emb = _need("LlamaEmbedding")(model, **_layers(n_gpu_layers))
    try:
        t = time.monotonic()
        arr = np.asarray(emb.embed(list(EMBED_TEXTS)))
        seconds = time.monotonic() - t
    finally:
        getattr(emb, "close", lambda: None)()
    if arr.dtype != np.float32 or arr.ndim != 2 or arr.shape[0] != len(EMBED_TEXTS):
        raise AssertionError(f"embed({len(EMBED_TEXTS)} texts) gave {arr.dtype} {arr.shape}, "
                             f"expected float32 ({len(EMBED_TEXTS)}, n_embd)")
    if not np.isfinite(arr).all() or not np.abs(arr).sum(axis=1).all():
        raise AssertionError("embeddings contain non-finite or all-zero rows")
    return arr.astype(np.float64), seconds


def stage_embedding(ctx: Context) -> str:
    import numpy as np

    model = ctx.model("embedding")
    if ctx.gpu_layers is None:
        rows, _ = _embed(model, None)
        return f"embeddings {rows.shape} float32"
    (cpu, cpu_s), (gpu, gpu_s) = _embed(model, 0), _embed(model, ctx.gpu_layers)
    cos = (cpu * gpu).sum(1) / (np.linalg.norm(cpu, axis=1) * np.linalg.norm(gpu, axis=1))
    ok, diff, bound = compare_logits(cpu, gpu)
    if not ok or float(cos.min()) < EMBD_MIN_COSINE:
        raise AssertionError(f"embeddings differ: min cosine {cos.min():.6f}, max diff {diff:.3e} (bound {bound:.3e})")
    return (f"{cpu.shape[0]}x{cpu.shape[1]}: min cosine {cos.min():.6f}, max diff {diff:.2e}; "
            f"CPU {cpu_s * 1e3:.0f} ms, GPU {gpu_s * 1e3:.0f} ms")


def stage_mtp(ctx: Context) -> str:
    model = ctx.model("mtp")
    Llama, SpecConfig, SpeculativeType = _need("Llama"), _need("SpecConfig"), _need("SpeculativeType")
    out = {}
    for label, kw in (("plain", {}), ("mtp", {"speculative": SpecConfig(spec_type=SpeculativeType.DRAFT_MTP,
                                                                           draft_n_max=4)})):
        llm = Llama(model, n_ctx=256, verbose=False, **_layers(ctx.gpu_layers), **kw)
        try:
            t = time.monotonic()
            text = llm.create_completion(PROMPT, max_tokens=N_PREDICT, temperature=0)["choices"][0]["text"]
            out[label] = (text, time.monotonic() - t, getattr(llm, "last_speculative_stats", None))
        finally:
            getattr(llm, "close", lambda: None)()
    (ref, plain_s, _), (got, mtp_s, stats) = out["plain"], out["mtp"]
    if got != ref:
        raise AssertionError(f"MTP greedy output {got!r} != plain greedy {ref!r}")
    if stats is None:
        raise AssertionError("llm.last_speculative_stats is None after an MTP completion")
    rate = getattr(stats, "acceptance_rate", None)
    return (f"MTP output equals plain greedy ({len(ref)} chars); acceptance "
            f"{'n/a' if rate is None else f'{rate:.0%}'}; plain {plain_s * 1e3:.0f} ms, MTP {mtp_s * 1e3:.0f} ms")


REGISTRY: dict[str, Stage] = {
    "import": Stage(stage_import, gate=True),
    "libraries": Stage(stage_libraries),
    "backends": Stage(stage_backends, gate=True),
    "generation": Stage(stage_generation),
    "embedding": Stage(stage_embedding),
    "mtp": Stage(stage_mtp),
}


def run_stages(names: Sequence[str], ctx: Context) -> dict[str, dict[str, Any]]:
    """Run ``names`` in order; every failure is a result with its reason, never raised."""
    results: dict[str, dict[str, Any]] = {}
    failed_gate = None
    for name in names:
        started = time.monotonic()
        if failed_gate:
            results[name] = {"status": "fail", "detail": f"not run: {failed_gate} failed", "seconds": 0.0}
            continue
        try:
            results[name] = {"status": "pass", "detail": REGISTRY[name].run(ctx)}
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its type, never raised
            msg = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
            results[name] = {"status": "fail", "detail": msg, "traceback": traceback.format_exc(limit=8)[-2500:]}
            if REGISTRY[name].gate:
                failed_gate = name
        results[name]["seconds"] = round(time.monotonic() - started, 3)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--stages", default=",".join(RELEASE_STAGES))
    p.add_argument("--version", default="", help="the version llama_cpp must report")
    for role in MODEL_ROLES:
        p.add_argument(f"--{role}-model", default="")
    p.add_argument("--require-gpu", action="store_true", help="libraries: a GPU backend must be loaded")
    p.add_argument("--allow-cpu", action="store_true", help="backends: run the GPU side on the CPU")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in REGISTRY]
    if unknown:
        p.error(f"unknown stages {unknown}; choose from {list(REGISTRY)}")
    ctx = Context(args)
    results = run_stages(stages, ctx)
    report = {"python": sys.version.split()[0], "executable": sys.executable, "cwd": os.getcwd(),
              "stages": results, "libraries": ctx.libraries}
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0 if all(r["status"] == "pass" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

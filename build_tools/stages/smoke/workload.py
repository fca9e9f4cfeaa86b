"""The smoke workload: run with ``python -I`` inside a fresh venv holding one installed wheel.

Standard library only (plus the installed ``llama_cpp`` and its dependencies, numpy among
them); never imports from the repository. One registry of stages, each reported as pass/fail
with a reason in the JSON written to ``--out``:

    import          ``import llama_cpp`` resolves to the venv's copy, with the intended version
    libraries       every loaded llama/ggml/mtmd library is the wheel's own (path inside the installed
                    ``llama_cpp/lib`` and sha256 equal to the embedded native manifest); a CUDA
                    wheel's report is checked against the machine: without the NVIDIA driver
                    (libcuda.so.1, nvcuda.dll) CUDA must say "<driver> not found (NVIDIA driver not
                    installed)" and the CPU serve; with it, CUDA serves or names the missing device
    backends        a GPU backend is loaded with a device (``--allow-cpu``: run the GPU side on the
                    CPU); from here on the later stages compare the GPU with the CPU
    generation      all layers offloaded; greedy tokens and the teacher-forced next-token
                    distributions (KL divergence) match the CPU's
    real-generation the same on a real small model (``--real-model``: Gemma 3 270M in the release)
    embedding       ``LlamaEmbedding.embed`` gives finite float32 rows (and, after ``backends``, all
                    layers offloaded and the GPU's rows within cosine 0.999 of the CPU's)
    mtp             greedy completion with MTP speculative decoding equals plain greedy completion
                    (after ``backends``: on the GPU, all layers offloaded)
    chat            libllama-cpp-ext (llama.cpp's chat layer) loads from the wheel, matches the
                    manifest, renders a conversation with a tool, parses a tool call and reasoning
                    out of raw output, and turns a broken template into an exception

The CPU side of a comparison runs in a child process of this script in which no GPU backend has a
device (``CPU_ONLY_ENV``): with ``n_gpu_layers=0`` alone, llama.cpp still offloads big batches'
matrix multiplications to the GPU (``op_offload``), so an in-process "CPU" run would share the
kernels it is meant to check.

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
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RELEASE_STAGES = ("import", "libraries", "chat", "embedding", "mtp")
GPU_STAGES = ("import", "libraries", "chat", "backends", "generation", "real-generation", "embedding", "mtp")
# The GPU stages on the generated fixtures alone (a GPU bundle carries no real model).
FIXTURE_GPU_STAGES = tuple(s for s in GPU_STAGES if s != "real-generation")
# The model role each stage reads (``--ROLE-model``).
STAGE_MODELS = {"generation": "generation", "real-generation": "real", "embedding": "embedding", "mtp": "mtp"}
MODEL_ROLES = ("generation", "embedding", "mtp", "real")
PROMPT = "the quick brown fox"
N_PREDICT = 32
ALL_LAYERS = 999
# GPU kernels reorder float sums (and cuBLAS may use other algorithms): results differ from
# the CPU in the last bits. A broken offload differs by the size of the values themselves.
LOGITS_RTOL = 2e-2
# Generation logits are compared as the distributions they define, as llama.cpp's `perplexity
# --kl-divergence` compares a model's outputs across quantizations and backends. With quantized
# weights the CPU multiplies by activations quantized to q8 and the GPU by f16/f32 ones, so
# far-tail logits move by whole units while the distribution hardly does: Gemma 3 270M Q4_K_M on
# lavapipe, against the CPU, measured max |diff| 3.2 (at a logit of -15, 22 below the row's top),
# KL mean 0.017 and max 0.079 nats, top-1 equal on every row. A broken backend is nats away.
LOGITS_MAX_KL = 0.25  # nats, any one row
LOGITS_MEAN_KL = 0.05  # nats, over the rows
EMBD_MIN_COSINE = 0.999
EMBED_TEXTS = ("the quick brown fox", "jumps over the lazy dog", "a")
# The CPU reference process: every GPU backend loads with no device (GGML_VK_VISIBLE_DEVICES
# lists none, CUDA sees none, Metal registers none), so nothing can run on a GPU there.
CPU_ONLY_ENV = {"GGML_VK_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "", "GGML_METAL_DEVICES": "0"}
CORE_LIBRARIES = ("llama", "ggml", "ggml-base")
# The NVIDIA driver library the CUDA backend needs from the system, per platform.
CUDA_DRIVER = {"win32": "nvcuda.dll"}
CUDA_DRIVER_DEFAULT = "libcuda.so.1"
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


def compare_distributions(cpu: Any, gpu: Any, max_kl: float = LOGITS_MAX_KL,
                          mean_kl: float = LOGITS_MEAN_KL) -> tuple[bool, float, float]:
    """(ok, max, mean) over rows of KL(softmax(cpu) || softmax(gpu)) in nats: both under their bounds."""
    import numpy as np

    cpu, gpu = np.asarray(cpu, dtype=np.float64), np.asarray(gpu, dtype=np.float64)
    if cpu.shape != gpu.shape or not cpu.size or not (np.isfinite(cpu).all() and np.isfinite(gpu).all()):
        return False, float("inf"), float("inf")

    def log_softmax(x: Any) -> Any:
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = log_softmax(cpu), log_softmax(gpu)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    worst, mean = float(kl.max()), float(kl.mean())
    return worst <= max_kl and mean <= mean_kl, worst, mean


def greedy_agrees(cpu_ids: Sequence[int], gpu_ids: Sequence[int], cpu_logits: Any, gpu_logits: Any) -> tuple[bool, str]:
    """Greedy tokens must be equal; a divergence is accepted only where the two choices are a near-tie.

    ``cpu_logits[i]`` are the CPU's logits that chose ``cpu_ids[i]``, ``gpu_logits[i]`` the GPU's
    for the same tokens (teacher-forced). Where the CPU chose ``a`` and the GPU ``b``, the GPU can
    rank ``b`` first only if the CPU's logits for them are no further apart than the two logits
    moved between the backends, ``|Δa| + |Δb|``: that divergence is accepted (llama.cpp's own
    backend tests compare with tolerances, never bit for bit), any other is not. After it the
    sequences differ, so the tokens that follow are not compared.
    """
    import numpy as np

    n = min(len(cpu_ids), len(gpu_ids))
    for i in range(n):
        a, b = cpu_ids[i], gpu_ids[i]
        if a != b:
            c, g = np.asarray(cpu_logits[i], dtype=np.float64), np.asarray(gpu_logits[i], dtype=np.float64)
            gap, moved = float(c[a] - c[b]), float(abs(c[a] - g[a]) + abs(c[b] - g[b]))
            if gap <= moved:
                return True, (f"diverged at token {i} on a near-tie (CPU's logits for the two choices {gap:.2e} "
                              f"apart <= {moved:.2e}, what they moved between the backends)")
            return False, (f"token {i}: CPU {a}, GPU {b} (CPU's logits for them {gap:.2e} apart, "
                           f"> {moved:.2e} they moved between the backends)")
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


def _load_logged(make: Callable[[], Any]) -> tuple[Any, tuple[int, int] | None]:
    """``make()`` (a model load) with llama.cpp's log captured: the object and its offload count."""
    cap = _LogCapture()
    native = logging.getLogger("llama_cpp.native")
    old_level = native.level
    native.setLevel(logging.DEBUG)
    native.addHandler(cap)
    try:
        obj = make()
    finally:
        native.removeHandler(cap)
        native.setLevel(old_level)
    return obj, offloaded(cap.lines)


def offload_problem(layers: int | None, off: tuple[int, int] | None) -> str | None:
    """Why a GPU run did not run every layer on the GPU (None when it did, or when no GPU was asked for)."""
    if not layers:
        return None
    if off is None:
        return "llama.cpp did not log 'offloaded N/N layers to GPU'"
    if off[0] != off[1]:
        return f"only {off[0]}/{off[1]} layers were offloaded"
    return None


def core_library_missing(names: Sequence[str], core: str) -> bool:
    """Whether none of ``names`` is the core library ``core`` (``llama``, ``ggml``, ``ggml-base``) on
    any platform: ``libllama.so.0``, ``libllama.0.dylib``, ``llama.dll`` (MSVC) or ``libllama.dll``
    (MinGW), and never ``ggml-base`` for ``ggml``."""
    pattern = re.compile(rf"^(lib)?{re.escape(core)}\.(so|dylib|dll|\d)", re.IGNORECASE)
    return not any(pattern.match(n) for n in names)


# ============================================================================ the CPU reference process

def cpu_reference(kind: str, model: str, timeout: float = 1800.0) -> dict[str, Any]:
    """``kind`` ("generation", "embedding") of ``model`` computed by this script in a child process
    where no GPU backend has a device (``CPU_ONLY_ENV``); its arrays by name."""
    import numpy as np

    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_REQUIRE_GPU"}
    env.update(CPU_ONLY_ENV)
    with tempfile.TemporaryDirectory(prefix="cpu-reference-") as tmp:
        out = Path(tmp) / "reference.npz"
        isolated = ["-I"] if sys.flags.isolated else []  # as this process runs (the release: -I in the venv)
        done = subprocess.run([sys.executable, *isolated, str(Path(__file__).resolve()), "--out", str(out),
                               "--cpu-reference", kind, "--reference-model", model],
                              env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or not out.is_file():
            raise AssertionError(f"the CPU reference process failed (exit {done.returncode}): "
                                 f"{(done.stderr or done.stdout)[-1500:]}")
        with np.load(out) as data:
            return {k: data[k] for k in data.files}


def _cpu_reference_main(kind: str, model: str, out: Path) -> int:
    """Inside the reference process: refuse to run where a GPU device is visible, then compute."""
    import numpy as np

    gpus = [f"{s.name}: {d.description or d.name}" for s in _gpu_backends() for d in s.devices]
    if gpus:
        raise SystemExit(f"the CPU reference process still sees GPU devices {gpus} although {CPU_ONLY_ENV} is set")
    if kind == "generation":
        run = _greedy_run(model, 0)
        np.savez(out, ids=np.asarray(run["ids"], dtype=np.int64), logits=run["logits"],
                 seconds=np.float64(run["seconds"]))
    elif kind == "embedding":
        rows, seconds, _ = _embed(model, 0)
        np.savez(out, rows=rows, seconds=np.float64(seconds))
    else:
        raise SystemExit(f"unknown reference kind {kind!r}")
    return 0


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


def _expected_libraries(ctx: Context, pkg: Path) -> dict[str, str]:
    """sha256 by file name of the libraries the package must load: a wheel's embedded native manifest;
    for a source build (``--source-build``: ``pip install <sdist>``, which has no manifest) what its
    build installed into ``lib/``, so every loaded library must still come from there."""
    if ctx.args.source_build:
        return {p.name: _sha256(p) for p in sorted((pkg / "lib").iterdir()) if p.is_file()}
    manifest = json.loads((pkg / "native-manifest.json").read_text(encoding="utf-8"))
    return {rec["path"].rsplit("/", 1)[-1]: rec["sha256"] for rec in manifest["libraries"]}


def _plugin_libraries(version: str) -> dict[Path, dict[str, str]]:
    """The installed backend plugins' ``lib/`` folders (resolved) -> sha256 by name of the modules
    their ``plugin.json`` records (``pip install "llama-cpp-python[vulkan]"``)."""
    try:
        from llama_cpp._native import plugins
    except ImportError:
        return {}
    out = {}
    for plugin in plugins.discover(version):
        if plugin.lib_dir is not None:
            record = json.loads((plugin.lib_dir.parent / "plugin.json").read_text(encoding="utf-8"))
            out[plugin.lib_dir.resolve()] = dict(record["modules"])
    return out


def stage_libraries(ctx: Context) -> str:
    import llama_cpp

    pkg = ctx.pkg or Path(llama_cpp.__file__).resolve().parent
    lib_dir = (pkg / "lib").resolve()
    expected = _expected_libraries(ctx, pkg)
    from_plugins = _plugin_libraries(llama_cpp.__version__)
    try:
        from llama_cpp._native import loader
    except ImportError as exc:
        raise AssertionError(f"llama_cpp._native.loader is not available ({exc})") from None
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
        if p.parent in from_plugins:  # a plugin wheel's module: the bytes its plugin.json records
            if _sha256(p) != from_plugins[p.parent].get(p.name):
                problems.append(f"{p}: not a module its plugin's plugin.json records (by name and sha256)")
        elif p.parent != lib_dir:
            problems.append(f"{p} is loaded from outside the wheel's {lib_dir}")
        elif p.name not in expected:
            problems.append(f"{p.name} is not in the embedded native manifest")
        elif _sha256(p) != expected[p.name]:
            problems.append(f"{p.name}: sha256 differs from the embedded native manifest")
    names = {p.name for p in loaded}
    for core in CORE_LIBRARIES:
        if core_library_missing(sorted(names), core):
            problems.append(f"the {core} library is not loaded (loaded: {sorted(names)})")
    if ctx.args.require_gpu and not _gpu_backends():
        problems.append(f"no GPU backend loaded: {[(s.name, s.reason) for s in loader.backends()]}")
    driver = CUDA_DRIVER.get(sys.platform, CUDA_DRIVER_DEFAULT)
    cuda_problem, cuda = cuda_report(loader.backends(), _library_present(driver), driver)
    if cuda_problem:
        problems.append(cuda_problem)
    if problems:
        raise AssertionError("; ".join(problems))
    ctx.libraries = [str(p) for p in loaded]
    cpu = sorted(Path(s.path).name for s in serving if s.name == "CPU")
    plugged = sorted(p.name for p in loaded if p.parent in from_plugins)
    if plugged:
        return (f"{len(loaded)} libraries matching their records: {len(loaded) - len(plugged)} from {lib_dir}, "
                f"{', '.join(plugged)} from the installed plugins; CPU backend {', '.join(cpu) or 'linked in'} "
                f"on {platform.machine()}{'; ' + cuda if cuda else ''}")
    return (f"{len(loaded)} libraries, all from {lib_dir} and matching the manifest; "
            f"CPU backend {', '.join(cpu) or 'linked in'} on {platform.machine()}{'; ' + cuda if cuda else ''}")


def _library_present(name: str) -> bool:
    import ctypes

    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def cuda_report(statuses: Sequence[Any], driver_present: bool, driver: str) -> tuple[str | None, str | None]:
    """(problem, summary) of a CUDA backend's status against whether the NVIDIA driver is installed;
    (None, None) when the report has no CUDA backend."""
    cuda = [s for s in statuses if s.name.upper().startswith("CUDA")]
    if not cuda:
        return None, None
    serving = [s for s in cuda if s.loaded]
    if driver_present:
        if serving:
            return None, f"CUDA serves {[d.description or d.name for d in serving[0].devices]}"
        return None, f"NVIDIA driver {driver} present, CUDA not loaded: {cuda[0].reason}"
    if serving:
        return f"CUDA is reported as serving although {driver} cannot be loaded", None
    reason = str(cuda[0].reason)
    if not reason.startswith(f"{driver} not found") or "NVIDIA driver not installed" not in reason:
        return (f"without {driver} the CUDA backend must be reported as '{driver} not found (NVIDIA driver not "
                f"installed)', it says {reason!r}"), None
    if not any(s.loaded and s.name.upper() == "CPU" for s in statuses):
        return f"CUDA did not load ({reason}) and the CPU backend does not serve either", None
    return None, f"CUDA not loaded: {reason}; the CPU serves"


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


def _greedy_run(model: str, n_gpu_layers: int, forced: Sequence[int] | None = None) -> dict[str, Any]:
    """Greedy ids after PROMPT, then the teacher-forced logits of prompt + ``forced`` (default: the
    ids) in one batch, and llama.cpp's offload count."""
    import numpy as np

    Llama = _need("Llama")
    llm, off = _load_logged(lambda: Llama(model, n_gpu_layers=n_gpu_layers, n_ctx=256, n_batch=256, n_ubatch=256,
                                          logits_all=True, verbose=False, seed=0))
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
        seq = prompt + [int(i) for i in (ids if forced is None else forced)]
        llm.eval(seq)
        # Row j holds the logits that predict token j + 1: the ones that chose ids[k] are row
        # len(prompt) - 1 + k.
        logits = np.stack([np.array(llm.ctx.logits_ith(j), dtype=np.float32)
                           for j in range(len(prompt) - 1, len(seq) - 1)])
    finally:
        llm.close()
    return {"ids": ids, "logits": logits, "seconds": seconds, "offloaded": off}


def _tokens_per_second(run: dict[str, Any]) -> float:
    return len(run["ids"]) / run["seconds"] if run["seconds"] > 0 else float("inf")


def _compare_generation(model: str, ctx: Context) -> str:
    layers = ALL_LAYERS if ctx.gpu_layers is None else ctx.gpu_layers
    ref = cpu_reference("generation", model)
    cpu_ids = [int(i) for i in ref["ids"]]
    gpu = _greedy_run(model, layers, forced=cpu_ids)  # teacher-forced on the CPU's tokens: same inputs
    problems = [p for p in (offload_problem(layers, gpu["offloaded"]),) if p]
    ok, worst, mean = compare_distributions(ref["logits"], gpu["logits"])
    if not ok:
        problems.append(f"teacher-forced next-token distributions differ: KL max {worst:.3e} (bound {LOGITS_MAX_KL}), "
                        f"mean {mean:.3e} (bound {LOGITS_MEAN_KL}) nats")
    agree, why = greedy_agrees(cpu_ids, gpu["ids"], ref["logits"], gpu["logits"])
    if not agree:
        problems.append(f"greedy tokens differ: {why}")
    if problems:
        raise AssertionError("; ".join(problems))
    cpu_tps = len(cpu_ids) / float(ref["seconds"]) if float(ref["seconds"]) > 0 else float("inf")
    diff = float(abs(ref["logits"].astype("float64") - gpu["logits"]).max())
    return (f"{why}; KL max {worst:.2e} mean {mean:.2e} nats, max logit diff {diff:.2e}; layers {gpu['offloaded']}; "
            f"CPU (reference process) {cpu_tps:.0f} tok/s, GPU {_tokens_per_second(gpu):.0f} tok/s")


def stage_generation(ctx: Context) -> str:
    return _compare_generation(ctx.model("generation"), ctx)


def stage_real_generation(ctx: Context) -> str:
    return f"{Path(ctx.model('real')).name}: {_compare_generation(ctx.model('real'), ctx)}"


def _embed(model: str, n_gpu_layers: int | None) -> tuple[Any, float, tuple[int, int] | None]:
    """Checked float32 rows of EMBED_TEXTS (as float64), the seconds ``embed`` took, the offload count."""
    import numpy as np

    Embedding = _need("LlamaEmbedding")
    emb, off = _load_logged(lambda: Embedding(model, **_layers(n_gpu_layers)))
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
    return arr.astype(np.float64), seconds, off


def stage_embedding(ctx: Context) -> str:
    import numpy as np

    model = ctx.model("embedding")
    if ctx.gpu_layers is None:
        rows, _, _ = _embed(model, None)
        return f"embeddings {rows.shape} float32"
    ref = cpu_reference("embedding", model)
    cpu, cpu_s = ref["rows"], float(ref["seconds"])
    gpu, gpu_s, off = _embed(model, ctx.gpu_layers)
    problems = [p for p in (offload_problem(ctx.gpu_layers, off),) if p]
    if cpu.shape != gpu.shape:
        raise AssertionError("; ".join([*problems, f"embedding shapes differ: CPU {cpu.shape}, GPU {gpu.shape}"]))
    cos = (cpu * gpu).sum(1) / (np.linalg.norm(cpu, axis=1) * np.linalg.norm(gpu, axis=1))
    ok, diff, bound = compare_logits(cpu, gpu)
    if not ok or float(cos.min()) < EMBD_MIN_COSINE:
        problems.append(f"embeddings differ: min cosine {cos.min():.6f}, max diff {diff:.3e} (bound {bound:.3e})")
    if problems:
        raise AssertionError("; ".join(problems))
    return (f"{cpu.shape[0]}x{cpu.shape[1]}: min cosine {cos.min():.6f}, max diff {diff:.2e}; layers {off}; "
            f"CPU (reference process) {cpu_s * 1e3:.0f} ms, GPU {gpu_s * 1e3:.0f} ms")


def stage_mtp(ctx: Context) -> str:
    model = ctx.model("mtp")
    Llama, SpecConfig, SpeculativeType = _need("Llama"), _need("SpecConfig"), _need("SpeculativeType")
    out = {}
    for label, kw in (("plain", {}), ("mtp", {"speculative": SpecConfig(spec_type=SpeculativeType.DRAFT_MTP,
                                                                           draft_n_max=4)})):
        llm, off = _load_logged(lambda kw=kw: Llama(model, n_ctx=256, verbose=False, **_layers(ctx.gpu_layers), **kw))
        try:
            t = time.monotonic()
            text = llm.create_completion(PROMPT, max_tokens=N_PREDICT, temperature=0)["choices"][0]["text"]
            out[label] = (text, time.monotonic() - t, getattr(llm, "last_speculative_stats", None), off)
        finally:
            getattr(llm, "close", lambda: None)()
    (ref, plain_s, _, plain_off), (got, mtp_s, stats, mtp_off) = out["plain"], out["mtp"]
    problems = [f"{label}: {p}" for label, off in (("plain", plain_off), ("MTP", mtp_off))
                if (p := offload_problem(ctx.gpu_layers, off))]
    if got != ref:
        problems.append(f"MTP greedy output {got!r} != plain greedy {ref!r}")
    if problems:
        raise AssertionError("; ".join(problems))
    if stats is None:
        raise AssertionError("llm.last_speculative_stats is None after an MTP completion")
    rate = getattr(stats, "acceptance_rate", None)
    return (f"MTP output equals plain greedy ({len(ref)} chars); acceptance "
            f"{'n/a' if rate is None else f'{rate:.0%}'}; layers {mtp_off if ctx.gpu_layers else 'CPU'}; "
            f"plain {plain_s * 1e3:.0f} ms, MTP {mtp_s * 1e3:.0f} ms")


# A Hermes-style template (tools in the system turn, calls as <tool_call> JSON): enough for
# llama.cpp's automatic parser to derive a tool-call and reasoning parser from it.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "Call a tool as <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{%- endif %}"
    "{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", "
    "\"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}"
)
CHAT_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def stage_chat(ctx: Context) -> str:
    import llama_cpp

    try:
        from llama_cpp._chat import native_chat
    except ImportError as exc:
        raise AssertionError(f"llama_cpp._chat.native_chat is not available ({exc})") from None
    pkg = ctx.pkg or Path(llama_cpp.__file__).resolve().parent
    expected = _expected_libraries(ctx, pkg)
    lib = native_chat.load_library()
    path = Path(lib.path).resolve()
    if path.parent != (pkg / "lib").resolve():
        raise AssertionError(f"{path} is loaded from outside the wheel's {pkg / 'lib'}")
    if expected.get(path.name) != _sha256(path):
        raise AssertionError(f"{path.name} is not in the embedded native manifest, or its sha256 differs")
    for mapped in _mapped_files():  # libllama-common, loaded with it
        if mapped.name.startswith("libllama-common") and expected.get(mapped.name) != _sha256(mapped):
            raise AssertionError(f"{mapped} is not the wheel's libllama-common")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = native_chat.apply_chat(messages, chat_template=CHAT_TEMPLATE, tools=[CHAT_TOOL], now=0)
    if "get_weather" not in prompt.prompt or not prompt.prompt.endswith("<|im_start|>assistant\n<think>"):
        raise AssertionError(f"unexpected prompt {prompt.prompt!r}")
    raw = 'Paris, then.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    msg = native_chat.parse_chat(prompt, raw)
    calls = [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]
    if calls != [("get_weather", {"city": "Paris"})] or msg.reasoning_content.strip() != "Paris, then.":
        raise AssertionError(f"{prompt.format_name}: parsed {msg!r} from {raw!r}")
    try:
        native_chat.apply_chat(messages, chat_template="{% for %}")
    except ValueError:
        pass
    else:
        raise AssertionError("a broken template did not raise")
    return (f"{path.name} from the wheel; format {prompt.format_name}, grammar "
            f"{'lazy' if prompt.grammar_lazy else 'eager'} ({len(prompt.grammar)} chars); tool call and reasoning parsed")


REGISTRY: dict[str, Stage] = {
    "import": Stage(stage_import, gate=True),
    "libraries": Stage(stage_libraries),
    "chat": Stage(stage_chat),
    "backends": Stage(stage_backends, gate=True),
    "generation": Stage(stage_generation),
    "real-generation": Stage(stage_real_generation),
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
    p.add_argument("--source-build", action="store_true",
                   help="libraries, chat: the package was built from the sdist (no embedded native manifest)")
    p.add_argument("--allow-cpu", action="store_true", help="backends: run the GPU side on the CPU")
    p.add_argument("--cpu-reference", choices=("generation", "embedding"), default="",
                   help=argparse.SUPPRESS)  # the child process that computes the CPU side of a comparison
    p.add_argument("--reference-model", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu_reference:
        return _cpu_reference_main(args.cpu_reference, args.reference_model, args.out)
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

"""GPU smoke test of a CUDA wheel: ``prepare`` a self-contained bundle here, ``run`` it on a GPU machine.

A GPU machine may have no network and no repository, so everything travels as one folder::

    gpu_smoke.py    this file (standard library only at import: it runs without the repository)
    bundle.json     what is inside, with the sha256 of every file
    wheels/         the CUDA wheel and every dependency wheel (numpy, jinja2, NVIDIA's runtime)
                    for each target Python
    models/         tiny generated GGUF models: llama (generation), mean-pooled (embeddings),
                    qwen35 with one NextN head in "echo" form (MTP)
    run.sh          python3 gpu_smoke.py run "$(dirname "$0")"

``run`` verifies the hashes, installs the wheel into a fresh venv with ``--no-index`` from
``wheels/`` and runs the ``workload`` inside it with ``python -I``. The workload checks that the
CUDA backend is loaded and lists a GPU, that all layers are offloaded (llama.cpp's own
"offloaded N/N layers to GPU" log line), that teacher-forced logits and greedy tokens match the
CPU within tolerance, that embeddings match the CPU, and that MTP greedy output equals plain
greedy output on the GPU; it prints a timing per stage. Installing the wheels dominates; the
whole run takes well under the 5-minute budget on a fresh machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUNDLE_SCHEMA = 1
MODELS = {"generation": "llama.gguf", "embedding": "embed.gguf", "mtp": "mtp-echo.gguf"}
STAGES = ("backends", "generation", "embedding", "mtp")
PROMPT = "the quick brown fox"
N_PREDICT = 32
ALL_LAYERS = 999
# GPU kernels reorder float sums (and cuBLAS may use other algorithms): results differ from
# the CPU in the last bits. A broken offload differs by the size of the values themselves.
LOGITS_RTOL = 2e-2
EMBD_MIN_COSINE = 0.999
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_NVIDIA_REQ = re.compile(r"^nvidia-", re.IGNORECASE)


class GpuSmokeError(Exception):
    """A bundle is incomplete or tampered with, or the smoke run could not start."""


# ============================================================================ bundle files

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _bundle_files(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in ("bundle.json",) and not rel.startswith((".venv", "results")):
            out[rel] = sha256_file(p)
    return out


def verify_bundle(root: Path) -> dict[str, Any]:
    """Load ``bundle.json`` and check every listed file's hash; raise naming the first problem."""
    meta_path = root / "bundle.json"
    if not meta_path.is_file():
        raise GpuSmokeError(f"{root} is not a GPU smoke bundle (no bundle.json): run `gpu-smoke prepare` first")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("schema") != BUNDLE_SCHEMA:
        raise GpuSmokeError(f"{meta_path}: schema {meta.get('schema')} is not {BUNDLE_SCHEMA}: prepare it again")
    problems = []
    for rel, digest in meta["files"].items():
        p = root / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_file(p) != digest:
            problems.append(f"{rel}: sha256 differs from bundle.json")
    if problems:
        raise GpuSmokeError(f"bundle {root} is damaged: " + "; ".join(problems) + "; prepare it again")
    return meta


# ============================================================================ prepare (here)

def wheel_requirements(wheel: Path) -> list[str]:
    """The unconditional and marker-guarded ``Requires-Dist`` lines of a wheel (extras excluded)."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta_name is None:
            raise GpuSmokeError(f"{wheel}: no .dist-info/METADATA")
        text = zf.read(meta_name).decode("utf-8", "replace")
    reqs = []
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1].strip()
            if "extra ==" not in req:
                reqs.append(req)
    return reqs


def _platform_tags(wheel: Path) -> list[str]:
    tags = wheel.name[:-4].split("-")[-1].split(".")
    # Dependency wheels (numpy, NVIDIA's) use older manylinux tags than ours may.
    extra = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]
    return list(dict.fromkeys(t for t in tags + extra if t != "any"))


def _pip_download(reqs: Sequence[str], dest: Path, python: str, platforms: Sequence[str], no_deps: bool) -> None:
    py = python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--only-binary=:all:", "--dest", str(dest), "--python-version", python,
           "--implementation", "cp", "--abi", f"cp{py}", "--abi", "abi3", "--abi", "none"]
    for plat in platforms:
        cmd += ["--platform", plat]
    if no_deps:
        cmd.append("--no-deps")
    proc = subprocess.run(cmd + list(reqs), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise GpuSmokeError(f"pip download for Python {python} failed:\n{proc.stderr.strip()[-2000:]}")


def _python_of(wheel: Path) -> set[str]:
    """Python versions a wheel's tags accept (cp310 -> 3.10; py3 -> every one)."""
    py_tags = wheel.name[:-4].split("-")[-3].split(".")
    out = set()
    for t in py_tags:
        m = re.match(r"^cp3(\d+)$", t)
        if m:
            out.add(f"3.{m.group(1)}")
        elif t in ("py3", "py2.py3"):
            out.add("*")
    return out


def generate_models(models_dir: Path) -> dict[str, str]:
    """Write the three tiny models with the repository's fixture generators (needs numpy + gguf)."""
    from tests.fixtures import models as fx_models
    from tests.fixtures import mtp as fx_mtp

    models_dir.mkdir(parents=True, exist_ok=True)
    fx_models.llama_spm(models_dir / MODELS["generation"])
    fx_models.embedding_model(models_dir / MODELS["embedding"], pooling="mean")
    fx_mtp.qwen35_mtp(models_dir / MODELS["mtp"], form="echo")
    return dict(MODELS)


def prepare(out: Path, wheels: Sequence[Path], *, config: str, pythons: Sequence[str],
            nvidia_wheels: bool = True, models_from: Path | None = None) -> dict[str, Any]:
    """Assemble the bundle at ``out`` (replaced if present) and return its ``bundle.json`` content."""
    if not wheels:
        raise GpuSmokeError("no CUDA wheel given: pass --wheel (build it with `nox -s wheels -- CONFIG`)")
    for w in wheels:
        if not w.is_file() or w.suffix != ".whl":
            raise GpuSmokeError(f"{w} is not a wheel file")
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    started = time.monotonic()
    chosen: dict[str, str] = {}
    for python in pythons:
        wheel = next((w for w in wheels if python in _python_of(w) or "*" in _python_of(w)), None)
        if wheel is None:
            raise GpuSmokeError(f"none of {[w.name for w in wheels]} installs on Python {python}")
        chosen[python] = wheel.name
        if not (out / "wheels" / wheel.name).exists():
            shutil.copy2(wheel, out / "wheels" / wheel.name)
        reqs = wheel_requirements(wheel)
        if not nvidia_wheels:
            reqs = [r for r in reqs if not _NVIDIA_REQ.match(r)]
        if reqs:
            _pip_download(reqs, out / "wheels", python, _platform_tags(wheel), no_deps=False)
    if models_from is not None:
        shutil.copytree(models_from, out / "models")
        models = {k: v for k, v in MODELS.items() if (out / "models" / v).is_file()}
    else:
        models = generate_models(out / "models")
    shutil.copy2(Path(__file__), out / "gpu_smoke.py")
    run_sh = out / "run.sh"
    run_sh.write_text('#!/bin/sh\nexec python3 "$(dirname "$0")/gpu_smoke.py" run "$(dirname "$0")" "$@"\n')
    run_sh.chmod(0o755)
    meta = {
        "schema": BUNDLE_SCHEMA, "config": config, "wheels": chosen, "nvidia_wheels": nvidia_wheels,
        "models": models, "files": _bundle_files(out),
    }
    (out / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    size = sum((out / rel).stat().st_size for rel in meta["files"])
    log.info("GPU smoke bundle %s: %d files, %.1f MB, prepared in %.0f s", out, len(meta["files"]),
             size / 1e6, time.monotonic() - started)
    return meta


# ============================================================================ run (GPU machine)

def run(bundle: Path, *, python: str | None = None, out: Path | None = None, allow_cpu: bool = False,
        timeout: float = 270.0) -> int:
    """Install the bundle's wheel in a fresh venv and run the workload in it; print the report."""
    t0 = time.monotonic()
    bundle = bundle.resolve()
    meta = verify_bundle(bundle)
    python = python or sys.executable
    ver = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    wheel = meta["wheels"].get(ver)
    if wheel is None:
        raise GpuSmokeError(f"the bundle has wheels for Python {sorted(meta['wheels'])}, not {ver} "
                            f"({python}): prepare it with --python {ver} or pass --python")
    timings: dict[str, float] = {"verify": time.monotonic() - t0}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        venv = Path(tmp) / "venv"
        t = time.monotonic()
        cmd = [python, "-m", "venv", str(venv)]
        if not meta["nvidia_wheels"]:
            cmd.insert(3, "--system-site-packages")  # NVIDIA's runtime comes from the machine
        vpy = venv / "bin" / "python"
        install = [str(vpy), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                   "--find-links", str(bundle / "wheels"), str(bundle / "wheels" / wheel)]
        for step in (cmd, install):
            proc = subprocess.run(step, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise GpuSmokeError(f"`{' '.join(step[:4])} …` failed:\n{(proc.stdout + proc.stderr).strip()[-2000:]}")
        timings["install"] = time.monotonic() - t
        result = out or Path(tmp) / "result.json"
        t = time.monotonic()
        cmd = [str(vpy), "-I", str(bundle / "gpu_smoke.py"), "workload", "--models", str(bundle / "models"),
               "--out", str(result)]
        if allow_cpu:
            cmd.append("--allow-cpu")
        env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "PYTHONPATH")}
        try:
            proc = subprocess.run(cmd, env=env, cwd=tmp, timeout=timeout, check=False)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            print(f"gpu-smoke: the workload ran past {timeout:.0f} s and was stopped")
            return 1
        timings["workload"] = time.monotonic() - t
        report = json.loads(result.read_text()) if result.is_file() else {"stages": {}}
    timings["total"] = time.monotonic() - t0
    report["timings"] = {k: round(v, 2) for k, v in timings.items()}
    print(format_report(report, wheel))
    if out is not None:
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return rc


def format_report(report: dict[str, Any], wheel: str = "") -> str:
    lines = [f"GPU smoke of {wheel}" if wheel else "GPU smoke"]
    for name, st in report.get("stages", {}).items():
        lines.append(f"  {name:11s} {st['status'].upper():4s} {st.get('seconds', 0):7.2f} s  {st.get('detail', '')}")
    for k, v in report.get("timings", {}).items():
        lines.append(f"  time {k:9s} {v:7.2f} s")
    return "\n".join(lines)


# ============================================================================ workload (inside the venv)

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


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _offloaded(lines: Sequence[str]) -> tuple[int, int] | None:
    for line in reversed(lines):
        m = _OFFLOADED.search(line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _greedy_run(model: Path, n_gpu_layers: int, n_predict: int) -> dict[str, Any]:
    """Greedy ids after PROMPT, then the teacher-forced logits of prompt + ids in one batch."""
    import numpy as np

    import llama_cpp

    cap = _LogCapture()
    native = logging.getLogger("llama_cpp.native")
    old_level = native.level
    native.setLevel(logging.DEBUG)
    native.addHandler(cap)
    try:
        llm = llama_cpp.Llama(str(model), n_gpu_layers=n_gpu_layers, n_ctx=256, n_batch=256, n_ubatch=256,
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
            if len(ids) >= n_predict:
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
    return {"ids": ids, "logits": logits, "seconds": seconds, "offloaded": _offloaded(cap.lines)}


def stage_backends(args: argparse.Namespace, state: dict[str, Any]) -> str:
    import llama_cpp

    statuses = llama_cpp.backends()
    desc = "; ".join(f"{s.name}: {'loaded' if s.loaded else 'not loaded (' + str(s.reason) + ')'}"
                     f"{' ' + ', '.join(d.description or d.name for d in s.devices) if s.devices else ''}"
                     for s in statuses)
    cuda = [s for s in statuses if s.name.lower().startswith("cuda") and s.loaded
            and any(d.type == "GPU" for d in s.devices)]
    if not cuda:
        if args.allow_cpu:
            state["gpu_layers"] = 0
            return f"no CUDA device (allowed by --allow-cpu: the GPU side runs on the CPU); {desc}"
        raise AssertionError(f"the CUDA backend is not loaded with a GPU device: {desc}")
    state["gpu_layers"] = ALL_LAYERS
    gpus = [d for s in cuda for d in s.devices if d.type == "GPU"]
    return "; ".join(f"{d.description or d.name} ({d.memory_total / 2**30:.1f} GiB)" for d in gpus)


def stage_generation(args: argparse.Namespace, state: dict[str, Any]) -> str:
    model = args.models / MODELS["generation"]
    cpu = _greedy_run(model, 0, N_PREDICT)
    gpu = _greedy_run(model, state.get("gpu_layers", ALL_LAYERS), N_PREDICT)
    problems = []
    if state.get("gpu_layers", ALL_LAYERS):
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
    def tps(r: dict[str, Any]) -> float:
        return len(r["ids"]) / r["seconds"] if r["seconds"] > 0 else float("inf")

    return (f"{why}; max logit diff {diff:.2e} (bound {bound:.2e}); layers {gpu['offloaded']}; "
            f"CPU {tps(cpu):.0f} tok/s, GPU {tps(gpu):.0f} tok/s")


def stage_embedding(args: argparse.Namespace, state: dict[str, Any]) -> str:
    import numpy as np

    import llama_cpp

    texts = ["the quick brown fox", "jumps over the lazy dog", "a"]
    rows = {}
    for side, layers in (("cpu", 0), ("gpu", state.get("gpu_layers", ALL_LAYERS))):
        emb = llama_cpp.LlamaEmbedding(str(args.models / MODELS["embedding"]), n_gpu_layers=layers)
        try:
            t = time.monotonic()
            rows[side] = np.asarray(emb.embed(texts), dtype=np.float64)
            rows[side + "_s"] = time.monotonic() - t
        finally:
            getattr(emb, "close", lambda: None)()
    cpu, gpu = rows["cpu"], rows["gpu"]
    if cpu.shape != gpu.shape or cpu.ndim != 2:
        raise AssertionError(f"embedding shapes differ: CPU {cpu.shape}, GPU {gpu.shape}")
    cos = (cpu * gpu).sum(1) / (np.linalg.norm(cpu, axis=1) * np.linalg.norm(gpu, axis=1))
    ok, diff, bound = compare_logits(cpu, gpu)
    if not ok or float(cos.min()) < EMBD_MIN_COSINE:
        raise AssertionError(f"embeddings differ: min cosine {cos.min():.6f}, max diff {diff:.3e} (bound {bound:.3e})")
    return (f"{cpu.shape[0]}x{cpu.shape[1]}: min cosine {cos.min():.6f}, max diff {diff:.2e}; "
            f"CPU {rows['cpu_s'] * 1e3:.0f} ms, GPU {rows['gpu_s'] * 1e3:.0f} ms")


def stage_mtp(args: argparse.Namespace, state: dict[str, Any]) -> str:
    import llama_cpp

    try:
        SpecConfig, SpeculativeType = llama_cpp.SpecConfig, llama_cpp.SpeculativeType
    except (AttributeError, ImportError) as exc:
        raise AssertionError(f"llama_cpp.SpecConfig is not available in this wheel ({exc})") from None
    model = str(args.models / MODELS["mtp"])
    layers = state.get("gpu_layers", ALL_LAYERS)
    out = {}
    for label, kw in (("plain", {}), ("mtp", {"speculative": SpecConfig(spec_type=SpeculativeType.DRAFT_MTP,
                                                                           draft_n_max=4)})):
        llm = llama_cpp.Llama(model, n_gpu_layers=layers, n_ctx=256, verbose=False, **kw)
        try:
            t = time.monotonic()
            text = llm.create_completion(PROMPT, max_tokens=N_PREDICT, temperature=0)["choices"][0]["text"]
            out[label] = (text, time.monotonic() - t, getattr(llm, "last_speculative_stats", None))
        finally:
            llm.close()
    if out["mtp"][0] != out["plain"][0]:
        raise AssertionError(f"MTP greedy output {out['mtp'][0]!r} != plain greedy {out['plain'][0]!r}")
    stats = out["mtp"][2]
    rate = getattr(stats, "acceptance_rate", None)
    return (f"MTP output equals plain greedy ({len(out['plain'][0])} chars); acceptance "
            f"{'n/a' if rate is None else f'{rate:.0%}'}; plain {out['plain'][1] * 1e3:.0f} ms, "
            f"MTP {out['mtp'][1] * 1e3:.0f} ms")


_STAGES: dict[str, Callable[[argparse.Namespace, dict[str, Any]], str]] = {
    "backends": stage_backends, "generation": stage_generation, "embedding": stage_embedding, "mtp": stage_mtp,
}


def workload(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_smoke.py workload")
    p.add_argument("--models", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--allow-cpu", action="store_true", help="run without a GPU (checks the script itself)")
    args = p.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] = {}
    failed = False
    for name in [s for s in args.stages.split(",") if s]:
        if name not in _STAGES:
            p.error(f"unknown stage {name!r}; choose from {list(STAGES)}")
        t = time.monotonic()
        if failed and results.get("backends", {}).get("status") == "fail":
            results[name] = {"status": "fail", "detail": "not run: no CUDA device", "seconds": 0.0}
            continue
        try:
            results[name] = {"status": "pass", "detail": _STAGES[name](args, state)}
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its reason, never raised
            failed = True
            msg = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
            results[name] = {"status": "fail", "detail": msg, "traceback": traceback.format_exc(limit=8)[-2500:]}
        results[name]["seconds"] = round(time.monotonic() - t, 3)
    report = {"python": sys.version.split()[0], "stages": results}
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the bundled copy: ``python3 gpu_smoke.py run DIR`` or ``... workload ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["workload"]:
        return workload(argv[1:])
    p = argparse.ArgumentParser(prog="gpu_smoke.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="install the bundled wheel in a fresh venv and run the GPU checks")
    r.add_argument("bundle", type=Path)
    r.add_argument("--python", default=None)
    r.add_argument("--out", type=Path, default=None)
    r.add_argument("--allow-cpu", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return run(args.bundle, python=args.python, out=args.out, allow_cpu=args.allow_cpu)
    except GpuSmokeError as exc:
        print(f"gpu-smoke: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Generation and prompt throughput of ``Llama`` vs llama.cpp's own tools built from the same source.

    python benchmarks/generation.py [--gemma] [--threads N] [--n-prompt P] [--n-gen G] [--reps R]

Same model, threads and batch sizes on both sides. References: ``llama-bench`` (pure decode: pp =
one batch of P prompt tokens, tg = G single-token decodes) and ``llama-completion`` (its eval
rate includes sampling, like ``Llama``). Ours: prompt = ``Llama.eval`` of P tokens from an empty
cache; generation = greedy ``create_completion`` tokens/s after the prompt. Prints medians over
interleaved repetitions and the ratios ours/reference (no assertions).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def native_tools() -> tuple[Path, dict[str, str]]:
    """The cpu-host build's tools dir (built on first use) and an environment to run them in."""
    from build_tools.inputs.configs import load_matrix
    from build_tools.inputs.lock import load_lock
    from build_tools.stages.native import build as native
    from build_tools.stages.vendor import current_tree

    lock = load_lock()
    plan = native.plan(load_matrix().get(os.environ.get("LLAMA_CPP_TEST_CONFIG", "cpu-host")), lock,
                       current_tree(lock))
    nb = native.build(plan)
    tools = native.build_reference_tools(nb, plan)
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(nb.lib_dir))
    return tools, native.tool_env(tools)


def default_model(gemma: bool) -> Path:
    if gemma:
        from tests.runtime.realmodels import gemma_path

        return gemma_path()
    from build_tools.fixtures import fixture_path

    return fixture_path("llama_spm")


def llama_bench(tools: Path, env: dict[str, str], model: Path, threads: int, n_prompt: int, n_gen: int,
                n_batch: int, n_ubatch: int, reps: int) -> tuple[float, float]:
    out = subprocess.run([str(tools / "llama-bench"), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen),
                          "-t", str(threads), "-b", str(n_batch), "-ub", str(n_ubatch), "-r", str(reps),
                          "-fa", "0", "-o", "json"], capture_output=True, text=True, env=env, check=True).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return pp, tg


def llama_completion(tools: Path, env: dict[str, str], model: Path, threads: int, prompt: str, n_gen: int,
                     n_batch: int, n_ubatch: int) -> tuple[float, float]:
    for _ in range(5):  # its asynchronous logger can drop the last lines at exit: run again
        err = subprocess.run([str(tools / "llama-completion"), "-m", str(model), "-p", prompt, "-n", str(n_gen),
                              "--temp", "0", "-no-cnv", "-t", str(threads), "-b", str(n_batch), "-ub",
                              str(n_ubatch), "-c", "2048", "-fa", "off", "--no-display-prompt", "--ignore-eos"],
                             capture_output=True, text=True, env=env, check=True).stderr
        pp = re.search(r"prompt eval time =.*?([\d.]+) tokens per second", err)
        tg = re.search(r"\s eval time =.*?([\d.]+) tokens per second", err)
        if pp and tg:
            return float(pp.group(1)), float(tg.group(1))
    raise RuntimeError("llama-completion printed no timings")


def ours(model: Path, threads: int, prompt_tokens: list[int], n_gen: int, **llama_kwargs: Any) -> tuple[float, float]:
    """Prompt tok/s (median of 3 evals after a warm-up) and generation tok/s (greedy, after the first
    token) of ``Llama(model, **llama_kwargs)``."""
    from llama_cpp import Llama

    with Llama(model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, flash_attn=False, verbose=False,
               **llama_kwargs) as llm:
        llm.eval(prompt_tokens)  # warm-up run (graph allocation), like llama-bench's
        times = []
        for _ in range(3):
            llm.reset()
            t = time.perf_counter()
            llm.eval(prompt_tokens)
            times.append(time.perf_counter() - t)
        pp = len(prompt_tokens) / statistics.median(times)
        llm.reset()
        short = prompt_tokens[:4]
        it = llm.generate(short, temp=0)
        next(it)  # prompt + first token
        t = time.perf_counter()
        for i, _ in enumerate(it, start=2):
            if i == n_gen:
                break
        tg = (n_gen - 1) / (time.perf_counter() - t)
        it.close()
    return pp, tg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GGUF (default: the tiny llama fixture)")
    ap.add_argument("--gemma", action="store_true", help="use Gemma 3 270M from its PyPI package")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=256)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--n-ubatch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    tools, env = native_tools()
    model = a.model or default_model(a.gemma)
    from llama_cpp import Llama

    with Llama(model, vocab_only=True, verbose=False) as v:
        words = b" the cat sat on the mat and looked at the house" * 64
        prompt_tokens = v.tokenize(words)[: a.n_prompt]
        prompt_text = v.detokenize(prompt_tokens).decode("utf-8", errors="ignore")
    res: dict[str, list[float]] = {k: [] for k in ("pp", "tg", "bench_pp", "bench_tg", "compl_pp", "compl_tg")}
    for _ in range(a.reps):  # interleaved, so machine-load drift hits both sides alike
        pp, tg = ours(model, a.threads, prompt_tokens, a.n_gen, n_batch=a.n_batch, n_ubatch=a.n_ubatch)
        res["pp"].append(pp)
        res["tg"].append(tg)
        bpp, btg = llama_bench(tools, env, model, a.threads, len(prompt_tokens), a.n_gen, a.n_batch, a.n_ubatch, 1)
        res["bench_pp"].append(bpp)
        res["bench_tg"].append(btg)
        cpp, ctg = llama_completion(tools, env, model, a.threads, prompt_text, a.n_gen, a.n_batch, a.n_ubatch)
        res["compl_pp"].append(cpp)
        res["compl_tg"].append(ctg)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"model {model.name}  threads {a.threads}  prompt {len(prompt_tokens)}  gen {a.n_gen}  "
          f"batch {a.n_batch}/{a.n_ubatch}  reps {a.reps}")
    print(f"{'':18s}{'prompt tok/s':>14s}{'gen tok/s':>12s}")
    print(f"{'Llama':18s}{med['pp']:14.1f}{med['tg']:12.1f}")
    print(f"{'llama-bench':18s}{med['bench_pp']:14.1f}{med['bench_tg']:12.1f}")
    print(f"{'llama-completion':18s}{med['compl_pp']:14.1f}{med['compl_tg']:12.1f}")
    print(f"ratio vs llama-bench:      prompt {med['pp'] / med['bench_pp']:.3f}  gen {med['tg'] / med['bench_tg']:.3f}")
    print(f"ratio vs llama-completion: prompt {med['pp'] / med['compl_pp']:.3f}  gen {med['tg'] / med['compl_tg']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

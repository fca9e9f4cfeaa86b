"""Tokens/s with and without MTP speculative decoding, with acceptance statistics.

    python benchmarks/mtp.py [--model PATH ...] [--no-fixtures] [--drafts 1,2,4,8] [--n-gen G]
                             [--threads N] [--n-gpu-layers L] [--reps R] [--prompt TEXT] [--tool]

Fixtures: the tiny qwen35 + NextN models (echo: ~100 % acceptance, noisy: partial, random: ~0 %),
generated on first use. ``--model`` adds real MTP models (e.g. a Qwen3.5 GGUF with its MTP head).
Baseline: greedy token-at-a-time decoding on the same target context parameters. MTP: the
:class:`llama_cpp.speculative.MTPDecoder` at each ``draft_n_max``. ``--tool`` also runs
``llama-speculative-simple`` from the same build and prints its decode rate and acceptance.
Medians over ``--reps`` runs; no assertions.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _native():
    from build_tools.inputs.configs import load_matrix
    from build_tools.inputs.lock import load_lock
    from build_tools.stages.native import build as native
    from build_tools.stages.vendor import current_tree

    lock = load_lock()
    plan = native.plan(load_matrix().get(os.environ.get("LLAMA_CPP_TEST_CONFIG", "cpu-host")), lock,
                       current_tree(lock))
    return native.build(plan), plan


def plain_tps(model, prompt: list[int], n_gen: int, ctx_params: dict) -> tuple[float, list[int]]:
    import numpy as np

    from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaSampler

    with LlamaContext(model, **ctx_params) as ctx, LlamaSampler() as s:
        s.add_greedy()
        b = LlamaBatch(ctx.n_batch(), 0, 1)
        b.add_sequence(np.asarray(prompt, dtype=np.int32), 0, 0, logits="last")
        ctx.decode(b)
        out: list[int] = []
        pos = len(prompt)
        t0 = time.perf_counter()
        while len(out) < n_gen:
            t = s.sample(ctx, -1)
            out.append(t)
            if model.is_eog(t) or len(out) == n_gen:
                break
            b.clear()
            b.add(t, pos, 0, True)
            pos += 1
            ctx.decode(b)
        dt = time.perf_counter() - t0
        b.close()
    return len(out) / dt, out


def mtp_run(model, prompt: list[int], n_gen: int, ctx_params: dict, draft_n_max: int):
    from llama_cpp._internals import LlamaSampler
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    with MTPDecoder(model, ctx_params, SpecConfig(draft_n_max=draft_n_max)) as dec, LlamaSampler() as s:
        s.add_greedy()
        dec.prefill(prompt)
        toks = list(dec.generate(s, n_gen))
        return dec.stats, toks


def tool_run(tools: Path, path: Path, prompt: str, n_gen: int, dn: int, threads: int, ngl: int) -> str:
    from build_tools.stages.native.build import tool_env

    proc = subprocess.run([str(tools / "llama-speculative-simple"), "-m", str(path), "--spec-type", "draft-mtp",
                           "--spec-draft-n-max", str(dn), "--temp", "0", "-p", prompt, "-n", str(n_gen),
                           "-t", str(threads), "-tb", str(threads), "-c", "4096", "-ngl", str(ngl)],
                          capture_output=True, text=True, timeout=600, check=False, env=tool_env(tools))
    err = proc.stderr
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", err)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", err)
    if proc.returncode != 0 or not speed:
        return f"llama-speculative-simple failed ({proc.returncode}): {err.strip()[-300:]}"
    return f"{float(speed.group(3)):9.1f} tok/s, accept {acc.group(1) if acc else '?'}%"


def bench(label: str, path: Path, args, tools: Path | None) -> None:
    from llama_cpp.speculative import load_mtp_model

    ctx_params = {"n_ctx": 4096, "n_batch": 512, "n_ubatch": 512, "n_threads": args.threads,
                      "n_threads_batch": args.threads}
    with load_mtp_model(path, n_gpu_layers=args.n_gpu_layers) as model:
        prompt = model.tokenize(args.prompt.encode(), add_special=True)
        base = [plain_tps(model, prompt, args.n_gen, ctx_params) for _ in range(args.reps)]
        base_tps = statistics.median(t for t, _ in base)
        ref = base[0][1]
        print(f"\n{label}: {path}")
        print(f"  plain greedy        {base_tps:9.1f} tok/s ({len(ref)} tokens)")
        for dn in args.drafts:
            runs = [mtp_run(model, prompt, args.n_gen, ctx_params, dn) for _ in range(args.reps)]
            tps = statistics.median(st.tokens_per_second for st, _ in runs)
            st, toks = runs[0]
            same = "same tokens" if toks == ref else "DIFFERENT TOKENS"
            per = " ".join(f"{r:.2f}" for r in st.acceptance_rate_at)
            print(f"  mtp draft_n_max={dn:<2}  {tps:9.1f} tok/s  x{tps / base_tps:5.2f}  accept "
                  f"{100 * st.acceptance_rate:5.1f}%  per-pos [{per}]  tokens/step {st.tokens_per_step:.2f}  "
                  f"rollbacks {st.rollbacks_partial}+{st.rollbacks_checkpoint}ckpt  "
                  f"draft/verify/catch-up {st.t_draft:.3f}/{st.t_verify:.3f}/{st.t_catchup:.3f}s  {same}")
            if tools is not None:
                print(f"      llama-speculative-simple: "
                      f"{tool_run(tools, path, args.prompt, args.n_gen, dn, args.threads, args.n_gpu_layers)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", type=Path, default=[], help="a real GGUF with NextN layers")
    ap.add_argument("--no-fixtures", action="store_true", help="skip the tiny generated models")
    ap.add_argument("--drafts", default="1,2,4,8", help="comma-separated draft_n_max values")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", default="Once upon a time there was")
    ap.add_argument("--tool", action="store_true", help="also run llama-speculative-simple")
    args = ap.parse_args(argv)
    args.drafts = [int(x) for x in args.drafts.split(",") if x]

    nb, plan = _native()
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(nb.lib_dir))
    tools = None
    if args.tool:
        from build_tools.stages.native import build as native

        tools = native.build_reference_tools(nb, plan)
    if not args.no_fixtures:
        from build_tools.fixtures import fixture_path

        for form in ("echo", "noisy", "random"):
            bench(f"fixture qwen35_mtp form={form}", fixture_path("qwen35_mtp", form=form), args, tools)
    for path in args.model:
        bench("model", path, args, tools)
    return 0


if __name__ == "__main__":
    sys.exit(main())

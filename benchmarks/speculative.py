"""Speculative decoding, every implemented type: ours vs ``llama-speculative-simple`` vs plain.

    python benchmarks/speculative.py [--types T,...] [--drafts 2,4,8] [--n-gen G] [--threads N]
                                     [--reps R] [--target PATH --prompt TEXT [--draft PATH]]

One row per (case, type, draft size): our tokens/s (generation only, after the prompt), the tool's
"decoded ... speed" from the same build, plain greedy token-at-a-time tokens/s on the same target
context parameters, ours/tool, ours/plain, and both acceptance rates. Same model, threads and
context size on both sides; greedy (``--temp 0``). Medians over ``--reps``; no assertions.

Wall-clock rates swing by 2x on a shared machine, so the ``cpu`` columns repeat the comparison
in CPU time (one thread on both sides): ours is the process CPU time of ``generate()``, the tool's
is the CPU time of a run with ``-n G`` minus one with ``-n G/4`` per extra decoded token.

Cases (tiny fixtures, generated on first use):

- ``echo-cycle``: the qwen35 echo target (hybrid) with a prompt that repeats the cycle its greedy
  output ends in: every n-gram draft is right.
- ``bpe-text``: the pure-attention ``llama_bpe`` target with a repetitive text prompt.
- ``draft-echo`` / ``draft-noisy``: ``draft-simple`` with the one-layer draft fixture on the
  echo target (100 % / partial acceptance).
- ``mtp-echo`` / ``mtp-noisy``: ``draft-mtp`` with the target's own NextN head.

``--target``/``--prompt`` (and ``--draft``) add a case for a real model.

Findings on the tiny fixtures (one thread, CPU-time columns; see REPORT-E for tables):

- n-gram types and draft-simple run at 0.8-1.3x the tool's CPU rate with the same tokens. On
  the attention target over 201 tokens the accepted counts equal the tool's for every n-gram type
  and size; drafted counts are equal (map-k, map-k4v, cache) or within one draft (simple, mod),
  which matches how each side cuts its last drafts to the ``-n`` budget.
- MTP runs at 0.88-1.0x the tool at 100 % acceptance and 1.06-1.16x at partial acceptance. What
  remains is Python per drafted token (about ten ctypes calls and an argmax over the logits,
  where the tool samples top-k in the graph).
- On these models a decode is mostly fixed overhead, so a step of k + 2 decodes (k drafts, the
  verify, the catch-up) cannot beat one decode per token: MTP is slower than plain decoding here
  in the tool too. Speed-ups need models whose decode cost grows with the model.
- ``llama-speculative-simple`` reports 100 % acceptance on hybrid/recurrent targets whatever the
  draft: after a partial acceptance it restores its checkpoint and re-verifies the accepted
  tokens as a new draft, and counts only that pass.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation import native_tools  # noqa: E402 (a sibling script)

NGRAM = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
TEXT = ("the cat sat on the mat and the dog sat on the log and the cat sat on the mat and the dog sat "
        "on the log and the cat sat on the")


def _ngram_kw(m: int) -> dict:
    n = min(2, m)
    return {"ngram_simple": {"size_n": n, "size_m": m}, "ngram_map_k": {"size_n": 2, "size_m": m},
            "ngram_map_k4v": {"size_n": 2, "size_m": m}, "ngram_mod": {"n_match": 2, "n_max": m, "n_min": 1},
            "ngram_cache": {"n_draft": 8}}


def _tool_args(spec_type: str, m: int, draft: Path | None) -> list[str]:
    n = min(2, m)
    if spec_type == "ngram-simple":
        return ["--spec-ngram-simple-size-n", str(n), "--spec-ngram-simple-size-m", str(m)]
    if spec_type in ("ngram-map-k", "ngram-map-k4v"):
        k = spec_type.removeprefix("ngram-")
        return [f"--spec-ngram-{k}-size-n", "2", f"--spec-ngram-{k}-size-m", str(m)]
    if spec_type == "ngram-mod":
        return ["--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-max", str(m), "--spec-ngram-mod-n-min", "1"]
    if spec_type == "ngram-cache":
        return []
    if spec_type == "draft-simple":
        return ["-md", str(draft), "--spec-draft-n-max", str(m)]
    return ["--spec-draft-n-max", str(m)]  # draft-mtp


def plain_tps(model, prompt: list[int], n_gen: int, ctx_params: dict) -> tuple[float, list[int], float]:
    """(wall tok/s, tokens, CPU seconds) of greedy token-at-a-time decoding after the prompt."""
    import numpy as np

    from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaSampler

    with LlamaContext(model, **ctx_params) as ctx, LlamaSampler() as s, LlamaBatch(ctx.n_batch(), 0, 1) as b:
        s.add_greedy()
        for i in range(0, len(prompt), ctx.n_batch()):
            b.clear()
            b.add_sequence(np.asarray(prompt[i:i + ctx.n_batch()], dtype=np.int32), 0, i, logits="last")
            ctx.decode(b)
        out: list[int] = []
        pos = len(prompt)
        t0, c0 = time.perf_counter(), time.process_time()
        while len(out) < n_gen:
            t = s.sample(ctx, -1)
            out.append(t)
            if model.is_eog(t) or len(out) == n_gen:
                break
            b.clear()
            b.add(t, pos, 0, True)
            pos += 1
            ctx.decode(b)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
    return len(out) / dt, out, dc


def ours(model, prompt: list[int], n_gen: int, ctx_params: dict, cfg):
    """(stats, tokens, CPU seconds of the generation)."""
    from llama_cpp._internals import LlamaSampler
    from llama_cpp.speculative import make_decoder

    with make_decoder(model, cfg, ctx_params=dict(ctx_params)) as dec, LlamaSampler() as s:
        s.add_greedy()
        dec.prefill(prompt)
        c0 = time.process_time()
        toks = list(dec.generate(s, n_gen))
        return dec.stats, toks, time.process_time() - c0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tool(tools: Path, env: dict, path: Path, prompt: str, n_gen: int, spec_type: str, m: int,
         draft: Path | None, threads: int, n_ctx: int) -> tuple[float | None, float | None, int, float]:
    """(decode tok/s, acceptance, tokens decoded, CPU seconds of the whole run)."""
    cmd = [str(tools / "llama-speculative-simple"), "-m", str(path), "--spec-type", spec_type,
           *_tool_args(spec_type, m, draft), "--temp", "0", "-p", prompt, "-n", str(n_gen), "-c", str(n_ctx),
           "-t", str(threads), "-tb", str(threads), "--seed", "1"]
    c0 = _children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)
    cpu = _children_cpu() - c0
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", proc.stderr)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", proc.stderr)
    if proc.returncode != 0 or not speed:
        print(f"    llama-speculative-simple failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        return None, None, 0, cpu
    return float(speed.group(3)), (float(acc.group(1)) / 100 if acc else None), int(speed.group(1)), cpu


def tool_cpu_per_token(tools, env, path, text, n_gen, spec_type, m, draft, threads, n_ctx, reps) -> float:
    """CPU seconds per generated token of the tool: (long run - short run) / token difference, so
    loading and the prompt cancel out. CPU time, unlike wall time, is not inflated by other load."""
    vals = []
    for _ in range(reps):
        _, _, n_long, c_long = tool(tools, env, path, text, n_gen, spec_type, m, draft, threads, n_ctx)
        _, _, n_short, c_short = tool(tools, env, path, text, max(n_gen // 4, 1), spec_type, m, draft, threads,
                                      n_ctx)
        if n_long > n_short:
            vals.append((c_long - c_short) / (n_long - n_short))
    return statistics.median(vals) if vals else float("nan")


def _cycle_text(model) -> str:
    """Text whose tokens repeat the cycle the echo target's greedy chain from ' cat' ends in."""
    start = model.tokenize(b" cat", add_special=False)[0]
    _, chain, _ = plain_tps(model, [start], 200, {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 1,
                                               "n_threads_batch": 1})
    seen: dict[int, int] = {}
    for i, t in enumerate(chain):
        if t in seen:
            cyc = chain[seen[t]:i]
            break
        seen[t] = i
    else:
        raise RuntimeError("no cycle")
    reps = -(-60 // len(cyc)) + 1
    return model.detokenize(cyc * reps).decode("utf-8", errors="replace")


def run_case(label: str, path: Path, prompt_text: str | None, types: list[str], drafts: list[int], args,
             tools: Path, env: dict, draft: Path | None = None, mtp: bool = False) -> None:
    from llama_cpp._internals import LlamaModel
    from llama_cpp.speculative import SpecConfig, load_mtp_model

    ctx = {"n_ctx": args.n_ctx, "n_batch": 256, "n_ubatch": 256, "n_threads": args.threads,
           "n_threads_batch": args.threads}
    model = load_mtp_model(path) if mtp else LlamaModel(path)
    try:
        text = prompt_text if prompt_text is not None else _cycle_text(model)
        prompt = model.tokenize(text.encode(), add_special=True, parse_special=True)
        base = [plain_tps(model, prompt, args.n_gen, ctx) for _ in range(args.reps)]
        plain = statistics.median(t for t, _, _ in base)
        plain_cpu = statistics.median(len(o) / c for _, o, c in base if c > 0)
        ref = base[0][1]
        print(f"\n{label}: {path.name}, prompt {len(prompt)} tokens, plain {plain:.1f} tok/s wall, "
              f"{plain_cpu:.1f} tok/s cpu")
        print(f"  {'type':<14} {'n':>3} {'ours':>9} {'tool':>9} {'ours/tool':>9} {'ours/plain':>10} "
              f"{'ours cpu':>9} {'tool cpu':>9} {'cpu o/t':>8} {'cpu o/pl':>9} {'accept':>7} {'tool acc':>8}  tokens")
        for spec_type in types:
            for m in drafts:
                kw = _ngram_kw(m) if spec_type in NGRAM else {}
                cfg = SpecConfig(spec_type, draft_n_max=m if spec_type not in NGRAM else 3,
                                 draft_model_path=str(draft) if spec_type == "draft-simple" else None, **kw)
                runs = [ours(model, prompt, args.n_gen, ctx, cfg) for _ in range(args.reps)]
                tps = statistics.median(st.tokens_per_second for st, _, _ in runs)
                cpu_tps = statistics.median(len(t) / c for _, t, c in runs if c > 0)
                st, toks, _ = runs[0]
                t_runs = [tool(tools, env, path, text, args.n_gen, spec_type, m, draft, args.threads, args.n_ctx)
                          for _ in range(args.reps)]
                t_tps = [r[0] for r in t_runs if r[0] is not None]
                t_med = statistics.median(t_tps) if t_tps else float("nan")
                t_acc = t_runs[0][1]
                t_cpu = 1.0 / tool_cpu_per_token(tools, env, path, text, args.n_gen, spec_type, m, draft,
                                                 args.threads, args.n_ctx, args.reps)
                same = "same" if toks == ref[:len(toks)] else "DIFFERENT"
                print(f"  {spec_type:<14} {m:>3} {tps:9.1f} {t_med:9.1f} {tps / t_med:9.2f} {tps / plain:10.2f} "
                      f"{cpu_tps:9.1f} {t_cpu:9.1f} {cpu_tps / t_cpu:8.2f} {cpu_tps / plain_cpu:9.2f} "
                      f"{100 * st.acceptance_rate:6.1f}% {100 * t_acc if t_acc is not None else float('nan'):7.1f}%"
                      f"  {same}")
                if spec_type == "ngram-cache":
                    break  # llama.cpp fixes its draft length at 8
    finally:
        model.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(NGRAM + ("draft-simple", "draft-mtp")))
    ap.add_argument("--drafts", default="2,4,8")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--target", type=Path, help="a real target model (adds a case)")
    ap.add_argument("--draft", type=Path, help="its draft model (draft-simple)")
    ap.add_argument("--prompt", default=TEXT)
    args = ap.parse_args(argv)
    types = [t for t in args.types.split(",") if t]
    drafts = [int(x) for x in args.drafts.split(",") if x]
    tools, env = native_tools()
    from build_tools.fixtures import fixture_path

    ngram = [t for t in types if t in NGRAM]
    if args.target is None:
        if ngram:
            run_case("echo-cycle", fixture_path("qwen35_mtp", form="echo"), None, ngram, drafts, args, tools, env)
            run_case("bpe-text", fixture_path("llama_bpe"), args.prompt, ngram, drafts, args, tools, env)
        if "draft-simple" in types:
            for form in ("echo", "noisy"):
                run_case(f"draft-{form}", fixture_path("qwen35_mtp", form="echo"), "Once upon a time there was",
                         ["draft-simple"], drafts, args, tools, env, draft=fixture_path("draft_model", form=form))
        if "draft-mtp" in types:
            for form in ("echo", "noisy"):
                run_case(f"mtp-{form}", fixture_path("qwen35_mtp", form=form), "Once upon a time there was",
                         ["draft-mtp"], drafts, args, tools, env, mtp=True)
    else:
        run_case("model", args.target, args.prompt, [t for t in types if t != "draft-mtp" or True], drafts, args,
                 tools, env, draft=args.draft, mtp="draft-mtp" in types)
    return 0


if __name__ == "__main__":
    sys.exit(main())

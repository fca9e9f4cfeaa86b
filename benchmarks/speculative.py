"""Speculative decoding, every implemented type: ours vs ``llama-speculative-simple`` vs plain.

    python benchmarks/speculative.py [--cases C,...] [--types T,...] [--drafts 1,2,3,4] [--n-gen G]
                                     [-t N] [--reps R] [--tool-poll P] [--cpu] [--breakdown]
                                     [--target PATH --prompt TEXT [--draft PATH]] [--batch-cost N,...]

One row per (case, type, draft size): our tokens/s (generation only, after the prompt), the tool's
"decoded ... speed" from the same build, plain greedy token-at-a-time tokens/s on the same target
context parameters, and the ratios, each the median over ``--reps`` rounds of plain, ours and the
tool run back to back, in an order that rotates from round to round (the machine is shared: the
load average ends each row); both acceptance
rates; whether our tokens equal plain decoding's. Same model, threads and context size on both
sides; greedy (``--temp 0``). No assertions. ``--cpu`` adds CPU-time columns (tokens per CPU
second, one thread on both sides): ours and plain are the process CPU time of the generation, the
tool's the CPU time of a run with ``-n G`` minus one with ``-n G/4`` per extra decoded token.

Cases (fixtures generated on first use; ``large-*`` on ``qwen35_mtp_large``, 89 M parameters in
f16, where decoding costs, with drafts built for it; the others on the tiny fixtures):

- ``echo-cycle`` / ``large-cycle``: the qwen35 echo target with a prompt that repeats the cycle its
  greedy output ends in: every n-gram draft is right.
- ``bpe-text``: the pure-attention ``llama_bpe`` target with a repetitive text prompt.
- ``draft-echo`` / ``draft-noisy`` / ``large-draft`` / ``large-draft-noisy``: ``draft-simple`` with
  the one-layer draft fixture (100 % / partial acceptance; about 5 M parameters for the large one).
- ``eagle3-echo`` / ``large-eagle3``: ``draft-eagle3`` (100 %).
- ``dflash-first`` / ``large-dflash`` and ``dflash2-first`` / ``large-dflash2`` (the selector
  lattice): ``draft-dflash`` whose first drafted token is right and the others wrong.
- ``dspark-first`` (a Markov head without bias: as ``dflash-first``) / ``large-dspark`` (the
  target's successor chain: 100 %): ``draft-dspark``.
- ``mtp-echo`` / ``mtp-noisy`` / ``large-mtp`` / ``large-mtp-noisy``: ``draft-mtp`` with the
  target's own NextN head. ``large-mtp-q8`` / ``large-mtp-f32``: ``large-mtp`` with the matrices in
  q8_0 / f32 (how a multi-token verify costs against one token depends on ggml's matmul kernels
  for the weight type); ``large-mtp-f32-24``: f32 with 24 trunk layers (the one NextN block, a
  draft step, then costs half as much against a target decode).
- ``heads-echo`` / ``large-heads``: ``draft-mtp`` chaining step35's NextN heads (3 on the tiny
  trunk; 4 on ``qwen35_mtp_large``'s trunk sizes, 96 M parameters); draft sizes are capped at the
  head count. ``large-heads-f32-24``: the same in f32 with 24 trunk layers, a pure-attention NextN
  target (step35: sliding-window and full attention only) to set against ``large-mtp-f32-24``.

``--target``/``--prompt`` (and ``--draft``) run a real model instead. ``--breakdown`` prints where
our last run's time went (draft, verify, catch-up, rollback, other).

The table of results, with the command that produced it, is in docs/architecture.md ("Speculative
decoding speed"). What explains them:

- ``-t 2``: the tool's default ``--poll 50`` keeps its target pool's workers spinning while its
  draft context computes, which on two cores makes it several times slower than plain decoding;
  ``--tool-poll 0`` compares against the tool without that (our draft contexts share the
  target's pool). Any ``-t 2`` number needs a quiet machine.
- Tiny fixtures: a decode is fixed overhead (0.1-0.3 ms), so the types with draft decodes lose
  to plain decoding in the tool too, and a run lasts 10-50 ms: on a loaded machine single rounds
  swing by 2x, so only medians over many rounds compare. A context's first decode with outputs
  costs about 1.3 ms there; the tool pays it in its warm-up before timing, and every context our
  decoders and drafters create is warmed up the same way (draft contexts too, which the tool
  does not warm).
- ``llama-speculative-simple`` reports 100 % acceptance for draft-simple on hybrid targets
  whatever the draft: after a partial acceptance it restores its checkpoint and re-verifies the
  accepted tokens as a new draft, and counts only that pass.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation import native_tools  # noqa: E402 (a sibling script)

NGRAM = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
TEXT = ("the cat sat on the mat and the dog sat on the log and the cat sat on the mat and the dog sat "
        "on the log and the cat sat on the")
PROMPT = "Once upon a time there was"


def _ngram_kw(m: int) -> dict:
    n = min(2, m)
    return {"ngram_simple": {"size_n": n, "size_m": m}, "ngram_map_k": {"size_n": 2, "size_m": m},
            "ngram_map_k4v": {"size_n": 2, "size_m": m}, "ngram_mod": {"n_match": 2, "n_max": m, "n_min": 1},
            "ngram_cache": {"n_draft": 8}}


FEATURE = ("draft-eagle3", "draft-dflash", "draft-dspark")
DRAFTED = ("draft-simple",) + FEATURE


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
    if spec_type in DRAFTED:
        return ["-md", str(draft), "--spec-draft-n-max", str(m)]
    return ["--spec-draft-n-max", str(m)]  # draft-mtp


def spec_config(spec_type: str, m: int, draft: Path | None):
    """Our configuration for the tool's ``--spec-type spec_type`` with ``_tool_args(spec_type, m)``."""
    from llama_cpp.speculative import SpecConfig

    if spec_type in NGRAM:
        return SpecConfig(spec_type, draft_n_max=3, **_ngram_kw(m))
    # the feature drafters roll back with n_rs_seq snapshots, as the tool's context does for them
    kw = {"n_rs_seq": m} if spec_type in FEATURE else {}
    return SpecConfig(spec_type, draft_n_max=m, draft_model_path=str(draft) if spec_type in DRAFTED else None, **kw)


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


def breakdown(st) -> str:
    """Where the last run of ours spent its generation time (shares of ``t_generate``)."""
    tot = st.t_generate or float("nan")
    parts = {"draft": st.t_draft, "verify": st.t_verify, "catch-up": st.t_catchup, "rollback": st.t_rollback}
    rest = tot - sum(parts.values())
    per = f"{1e3 * tot / max(st.steps, 1):.2f} ms/step over {st.steps} steps"
    return per + ": " + ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in (*parts.items(), ("other", rest)))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tool(tools: Path, env: dict, path: Path, prompt: str, n_gen: int, spec_type: str, m: int,
         draft: Path | None, threads: int, n_ctx: int,
         extra: Sequence[str] = ()) -> tuple[float | None, float | None, int, float]:
    """(decode tok/s, acceptance, tokens decoded, CPU seconds of the run).

    The tool's log thread is not joined at exit, so its last lines are sometimes lost: a run
    without its speed line is repeated."""
    cmd = [str(tools / "llama-speculative-simple"), "-m", str(path), "--spec-type", spec_type,
           *_tool_args(spec_type, m, draft), "--temp", "0", "-p", prompt, "-n", str(n_gen), "-c", str(n_ctx),
           "-t", str(threads), "-tb", str(threads), "--seed", "1", *extra]
    for _ in range(6):
        c0 = _children_cpu()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)
        cpu = _children_cpu() - c0
        speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", proc.stderr)
        acc = re.search(r"accept\s+=\s+([\d.]+)%", proc.stderr)
        if proc.returncode != 0 or (speed and acc):
            break
    if proc.returncode != 0 or not speed:
        print(f"    llama-speculative-simple failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        return None, None, 0, cpu
    return float(speed.group(3)), (float(acc.group(1)) / 100 if acc else None), int(speed.group(1)), cpu


def tool_cpu_per_token(tools, env, path, text, n_gen, spec_type, m, draft, threads, n_ctx, reps, extra) -> float:
    """CPU seconds per generated token of the tool: (long run - short run) / token difference, so
    loading and the prompt cancel out. CPU time, unlike wall time, is not inflated by other load."""
    vals = []
    for _ in range(reps):
        _, _, n_long, c_long = tool(tools, env, path, text, n_gen, spec_type, m, draft, threads, n_ctx, extra)
        _, _, n_short, c_short = tool(tools, env, path, text, max(n_gen // 4, 1), spec_type, m, draft, threads,
                                      n_ctx, extra)
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


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def run_case(label: str, path: Path, prompt_text: str | None, types: list[str], drafts: list[int], args,
             tools: Path, env: dict, draft: Path | None = None, mtp: bool = False) -> None:
    """One table: per (type, draft size), ``--reps`` rounds of plain, ours and the tool back to back;
    rates are medians, ratios the medians of each round's ratio."""
    from llama_cpp._internals import LlamaModel
    from llama_cpp.speculative import load_mtp_model

    ctx = {"n_ctx": args.n_ctx, "n_batch": 256, "n_ubatch": 256, "n_threads": args.threads,
           "n_threads_batch": args.threads}
    extra = ["--poll", str(args.tool_poll), "--poll-batch", str(args.tool_poll)] if args.tool_poll is not None else []
    model = load_mtp_model(path) if mtp else LlamaModel(path)
    try:
        text = prompt_text if prompt_text is not None else _cycle_text(model)
        prompt = model.tokenize(text.encode(), add_special=True, parse_special=True)
        ref = plain_tps(model, prompt, args.n_gen, ctx)[1]
        print(f"\n{label}: {path.name} ({path.stat().st_size / 2**20:.1f} MiB), prompt {len(prompt)} tokens, "
              f"-t {args.threads}, {args.n_gen} tokens, {args.reps} rounds"
              + (f", tool --poll {args.tool_poll}" if extra else "") + f"; {_load()}")
        cpu_head = (f" {'ours cpu':>9} {'tool cpu':>9} {'plain cpu':>9} {'cpu o/t':>8} {'cpu o/p':>8}"
                    if args.cpu else "")
        print(f"  {'type':<14} {'n':>3} {'ours':>8} {'tool':>8} {'plain':>8} {'ours/tool':>9} {'ours/plain':>10} "
              f"{'tool/plain':>10}{cpu_head} {'accept':>7} {'tool acc':>8}  tokens  load")
        for spec_type in types:
            for m in drafts:
                cfg = spec_config(spec_type, m, draft)
                o_tps, t_tps, p_tps, o_t, o_p, t_p = [], [], [], [], [], []
                st = toks = t_acc = None
                for r in range(args.reps):
                    # the order rotates, so that no side always runs first (or after the tool's process)
                    for w in ("plain", "ours", "tool")[r % 3:] + ("plain", "ours", "tool")[:r % 3]:
                        if w == "plain":
                            p = plain_tps(model, prompt, args.n_gen, ctx)[0]
                        elif w == "ours":
                            st, toks, _ = ours(model, prompt, args.n_gen, ctx, cfg)
                        else:
                            t, t_acc, _, _ = tool(tools, env, path, text, args.n_gen, spec_type, m, draft,
                                                  args.threads, args.n_ctx, extra)
                    o = st.tokens_per_second
                    t = t if t is not None else float("nan")
                    o_tps.append(o), t_tps.append(t), p_tps.append(p)
                    o_t.append(o / t), o_p.append(o / p), t_p.append(t / p)
                cpu_cols = ""
                if args.cpu:
                    runs = [ours(model, prompt, args.n_gen, ctx, cfg) for _ in range(args.reps)]
                    cpu_tps = _med([len(tk) / c for _, tk, c in runs if c > 0])
                    plains = [plain_tps(model, prompt, args.n_gen, ctx) for _ in range(args.reps)]
                    p_cpu = _med([len(tk) / c for _, tk, c in plains if c > 0])
                    t_cpu = 1.0 / tool_cpu_per_token(tools, env, path, text, args.n_gen, spec_type, m, draft,
                                                     args.threads, args.n_ctx, args.reps, extra)
                    cpu_cols = f" {cpu_tps:9.1f} {t_cpu:9.1f} {p_cpu:9.1f} {cpu_tps / t_cpu:8.2f} {cpu_tps / p_cpu:8.2f}"
                same = "same" if toks == ref[:len(toks)] else "DIFFERENT"
                t_acc_s = f"{100 * t_acc:7.1f}%" if t_acc is not None else f"{'-':>8}"
                print(f"  {spec_type:<14} {m:>3} {_med(o_tps):8.1f} {_med(t_tps):8.1f} {_med(p_tps):8.1f} "
                      f"{_med(o_t):9.2f} {_med(o_p):10.2f} {_med(t_p):10.2f}{cpu_cols} "
                      f"{100 * st.acceptance_rate:6.1f}% {t_acc_s}  {same:<6}  {os.getloadavg()[0]:.2f}",
                      flush=True)
                if args.breakdown:
                    print("    " + breakdown(st), flush=True)
                if spec_type == "ngram-cache":
                    break  # llama.cpp fixes its draft length at 8
    finally:
        model.close()


def batch_cost(path: Path, sizes: list[int], reps: int, threads: int) -> None:
    """CPU ms of one target decode of ``n`` tokens (every row an output, as a verify batch), per
    size in ``sizes``, interleaved over ``reps`` rounds at growing positions; thread CPU time
    (``-t 1``: the decode runs on the calling thread), medians, and each size's multiple of the
    first's: what a verify of ``n - 1`` drafted tokens costs in single-token decodes."""
    from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel

    if threads != 1:
        raise SystemExit("--batch-cost measures thread CPU time: use -t 1")
    model = LlamaModel(path)
    res: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        with LlamaContext(model, n_ctx=4096, n_batch=256, n_ubatch=256, n_threads=1, n_threads_batch=1) as ctx, \
                LlamaBatch(256, 0, 1) as b:
            pos = 0
            for r in range(reps + 2):  # two warm-up rounds
                for n in sizes:
                    b.clear()
                    for i in range(n):
                        b.add(10 + i, pos + i, 0, True)
                    c0 = time.thread_time()
                    ctx.decode(b)
                    if r >= 2:
                        res[n].append(1e3 * (time.thread_time() - c0))
                    pos += n
                    if pos + max(sizes) >= 4096:
                        ctx.memory_clear(True)
                        pos = 0
    finally:
        model.close()
    base = _med(res[sizes[0]])
    print(f"{path.name}: " + ", ".join(f"{n} tokens {_med(v):.2f} ms ({_med(v) / base:.2f}x)" for n, v in res.items())
          + f"; {_load()}")


class Case(NamedTuple):
    """A benchmark case: the target fixture (name, params), the prompt (None: the echo cycle), the
    types it runs, the draft fixture (name, params) and whether the target loads its NextN layers."""

    target: tuple[str, dict]
    prompt: str | None
    types: tuple[str, ...]
    draft: tuple[str, dict] | None = None
    mtp: bool = False
    max_draft: int | None = None  # chained heads: a draft is at most as long as there are heads


ECHO = ("qwen35_mtp", {"form": "echo"})
LARGE = ("qwen35_mtp_large", {"form": "echo"})
BIG = {"target": "qwen35_mtp_large"}  # the draft fixtures' parameter for the large target
HEADS = 3
LARGE_HEADS = 4

CASES: dict[str, Case] = {
    "echo-cycle": Case(ECHO, None, NGRAM),
    "bpe-text": Case(("llama_bpe", {}), TEXT, NGRAM),
    "draft-echo": Case(ECHO, PROMPT, ("draft-simple",), ("draft_model", {"form": "echo"})),
    "draft-noisy": Case(ECHO, PROMPT, ("draft-simple",), ("draft_model", {"form": "noisy"})),
    "eagle3-echo": Case(ECHO, PROMPT, ("draft-eagle3",), ("eagle3_draft", {"form": "echo"})),
    "dflash-first": Case(ECHO, PROMPT, ("draft-dflash",), ("dflash_draft", {"form": "first"})),
    "dflash2-first": Case(ECHO, PROMPT, ("draft-dflash",), ("dflash_draft", {"form": "first", "selector": True})),
    "dspark-first": Case(ECHO, PROMPT, ("draft-dspark",), ("dflash_draft", {"form": "first", "markov": "zero"})),
    "mtp-echo": Case(ECHO, PROMPT, ("draft-mtp",), mtp=True),
    "mtp-noisy": Case(("qwen35_mtp", {"form": "noisy"}), PROMPT, ("draft-mtp",), mtp=True),
    "heads-echo": Case(("step35_mtp_heads", {"form": "echo", "heads": HEADS}), PROMPT, ("draft-mtp",), mtp=True,
                       max_draft=HEADS),
    "large-mtp": Case(LARGE, PROMPT, ("draft-mtp",), mtp=True),
    "large-mtp-noisy": Case(("qwen35_mtp_large", {"form": "noisy"}), PROMPT, ("draft-mtp",), mtp=True),
    "large-mtp-q8": Case(("qwen35_mtp_large", {"form": "echo", "wtype": "q8_0"}), PROMPT, ("draft-mtp",), mtp=True),
    "large-mtp-f32": Case(("qwen35_mtp_large", {"form": "echo", "wtype": "f32"}), PROMPT, ("draft-mtp",), mtp=True),
    "large-mtp-f32-24": Case(("qwen35_mtp_large", {"form": "echo", "wtype": "f32", "n_trunk": 24}), PROMPT,
                             ("draft-mtp",), mtp=True),
    "large-cycle": Case(LARGE, None, NGRAM),
    "large-draft": Case(LARGE, PROMPT, ("draft-simple",), ("draft_model", {"form": "echo", **BIG})),
    "large-draft-noisy": Case(LARGE, PROMPT, ("draft-simple",),
                              ("draft_model", {"form": "noisy", "noise": 0.005, **BIG})),
    "large-eagle3": Case(LARGE, PROMPT, ("draft-eagle3",), ("eagle3_draft", {"form": "echo", **BIG})),
    "large-dflash": Case(LARGE, PROMPT, ("draft-dflash",), ("dflash_draft", {"form": "first", **BIG})),
    "large-dflash2": Case(LARGE, PROMPT, ("draft-dflash",),
                          ("dflash_draft", {"form": "first", "selector": True, **BIG})),
    "large-dspark": Case(LARGE, PROMPT, ("draft-dspark",),
                         ("dflash_draft", {"form": "first", "markov": "chain", **BIG})),
    "large-heads": Case(("step35_mtp_heads", {"form": "echo", "heads": LARGE_HEADS, "size": "large"}), PROMPT,
                        ("draft-mtp",), mtp=True, max_draft=LARGE_HEADS),
    "large-heads-f32-24": Case(("step35_mtp_heads", {"form": "echo", "heads": LARGE_HEADS, "size": "large",
                                                     "wtype": "f32", "n_trunk": 24}), PROMPT,
                               ("draft-mtp",), mtp=True, max_draft=LARGE_HEADS),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--types", default=",".join(NGRAM + DRAFTED + ("draft-mtp",)),
                    help="only these types (of each case's)")
    ap.add_argument("--drafts", default="1,2,3,4")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cpu", action="store_true",
                    help="add CPU-time columns, tok/s per CPU second (more runs; not inflated by other load)")
    ap.add_argument("--breakdown", action="store_true", help="print where our last run's time went")
    ap.add_argument("--tool-poll", type=int, default=None,
                    help="the tool's --poll/--poll-batch (its default 50 spins its target pool's workers "
                         "while its draft context computes; 0 is what our shared pool amounts to)")
    ap.add_argument("--target", type=Path, help="a real target model (replaces the cases)")
    ap.add_argument("--draft", type=Path, help="its draft model (draft-simple, -eagle3, -dflash, -dspark)")
    ap.add_argument("--prompt", default=TEXT)
    ap.add_argument("--batch-cost", metavar="N,...",
                    help="instead: CPU ms of one target decode of N tokens (all outputs) for each case's target "
                         "(or --target), e.g. 1,2,5,9")
    args = ap.parse_args(argv)
    types = [t for t in args.types.split(",") if t]
    drafts = [int(x) for x in args.drafts.split(",") if x]
    tools, env = native_tools()
    from build_tools.fixtures import fixture_path

    if args.batch_cost:
        sizes = [int(x) for x in args.batch_cost.split(",") if x]
        paths = [args.target] if args.target is not None else [
            fixture_path(CASES[c].target[0], **CASES[c].target[1]) for c in args.cases.split(",") if c]
        for p in dict.fromkeys(paths):
            batch_cost(p, sizes, args.reps, args.threads)
        return 0
    if args.target is not None:
        run_case("model", args.target, args.prompt, types, drafts, args, tools, env, draft=args.draft,
                 mtp="draft-mtp" in types)
        return 0
    for name in [c for c in args.cases.split(",") if c]:
        case = CASES[name]
        run_types = [t for t in case.types if t in types]
        if run_types:
            draft = fixture_path(case.draft[0], **case.draft[1]) if case.draft else None
            sizes = sorted({min(m, case.max_draft or m) for m in drafts})
            run_case(name, fixture_path(case.target[0], **case.target[1]), case.prompt, run_types, sizes, args,
                     tools, env, draft=draft, mtp=case.mtp)
    return 0


if __name__ == "__main__":
    sys.exit(main())

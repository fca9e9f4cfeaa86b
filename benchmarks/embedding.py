"""``LlamaEmbedding`` inputs/s vs llama.cpp's ``llama-embedding`` on the same inputs.

    python benchmarks/embedding.py [--minilm] [--model M] [--n-inputs N] [--threads T] [--reps R]

Both sides embed the same N sentences with the same threads, tokens per decode (``-b`` for the
tool, ``pack_tokens`` for us; measured at --pack and at --n-batch), pooling and L2 normalisation,
flash attention off. The tool's rate is its wall time on all
inputs minus its wall time on one input (so model loading and start-up do not count against it);
ours is the wall time of ``embed()`` including tokenization and Python. Medians over interleaved
repetitions (no assertions).
"""

from __future__ import annotations

import argparse
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

WORDS = ["the", "cat", "sat", "on", "the", "mat", "while", "a", "dog", "ran", "in", "the", "park", "and", "people", "were", "eating", "food", "in", "the", "city", "near", "the", "river", "under", "a", "lovely", "sky"]


def sentences(n: int) -> list[str]:
    out = []
    for i in range(n):
        k = 6 + (i * 7) % 14
        out.append(" ".join(WORDS[(i + j * 3) % len(WORDS)] for j in range(k)))
    return out


def _tool_wall(tools: Path, env: dict[str, str], model: Path, texts: list[str], threads: int, n_batch: int) -> float:
    t = time.perf_counter()
    subprocess.run([str(tools / "llama-embedding"), "-m", str(model), "-p", "\n".join(texts), "--embd-normalize",
                    "2", "--embd-output-format", "array", "-t", str(threads), "-b", str(n_batch), "-c", str(n_batch),
                    "-fa", "off"], capture_output=True, env=env, check=True)
    return time.perf_counter() - t


def tool_rate(tools: Path, env: dict[str, str], model: Path, texts: list[str], threads: int, n_batch: int) -> float:
    """Inputs/s of llama-embedding with its start-up (load, context, warm-up) subtracted: the wall
    time of a one-input run is taken off that of the full run. (Its perf counters are printed
    through an asynchronous logger that often loses them at exit.)"""
    full = _tool_wall(tools, env, model, texts, threads, n_batch)
    one = _tool_wall(tools, env, model, texts[:1], threads, n_batch)
    return (len(texts) - 1) / max(full - one, 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--minilm", action="store_true", help="all-MiniLM-L6-v2 from its PyPI package (needs torch)")
    ap.add_argument("--n-inputs", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--pack", type=int, default=256, help="tokens per decode (LlamaEmbedding's pack_tokens)")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    tools, env = native_tools()
    if a.model:
        model = a.model
    elif a.minilm:
        from tests.runtime.realmodels import minilm_gguf

        model = minilm_gguf()
    else:
        from build_tools.fixtures import fixture_path

        model = fixture_path("embedding_model", pooling="mean")
    from llama_cpp import LlamaEmbedding

    texts = sentences(a.n_inputs)
    res: dict[str, list[float]] = {"ours": [], "tool": [], "ours_full": [], "tool_full": []}
    with LlamaEmbedding(model, n_batch=a.n_batch, n_threads=a.threads) as e:
        e.embed(texts[:64])  # warm-up
        n_tokens = sum(len(e.tokenize(x)) for x in texts)
        for _ in range(a.reps):
            for key, pack in (("ours", a.pack), ("ours_full", a.n_batch)):
                e.pack_tokens = pack
                t = time.perf_counter()
                rows = e.embed(texts)
                res[key].append(len(texts) / (time.perf_counter() - t))
            res["tool"].append(tool_rate(tools, env, model, texts, a.threads, a.pack))
            res["tool_full"].append(tool_rate(tools, env, model, texts, a.threads, a.n_batch))
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"model {model.name}  inputs {len(texts)} ({n_tokens} tokens)  width {rows.shape[1]}  threads {a.threads}  "
          f"reps {a.reps}   (inputs/s; llama-embedding with its start-up subtracted)")
    for label, o, r in ((f"{a.pack} tokens per decode", med["ours"], med["tool"]),
                        (f"{a.n_batch} tokens per decode", med["ours_full"], med["tool_full"])):
        print(f"  {label:26s} LlamaEmbedding {o:9.1f}   llama-embedding -b {label.split()[0]:>5s} {r:9.1f}"
              f"   ratio {o / r:.3f}")
    print(f"  LlamaEmbedding defaults vs llama-embedding defaults: ratio {med['ours'] / med['tool_full']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-token Python overhead of ``Llama`` generation.

    python benchmarks/overhead.py [--model M] [--n-gen N] [--threads T]

Three loops generate the same greedy tokens on the same context:
1. ``Llama.create_completion(stream=True)`` (the full API: stop/UTF-8 handling, chunks),
2. ``Llama.generate`` (token ids only),
3. a bare ctypes loop (``llama_decode`` + ``llama_sampler_sample``, nothing else).
llama.cpp's own decode time per token (``llama_perf_context``) is the floor. Prints microseconds
per token for each (best of --reps, as the machine may be shared), and each one's share over
the C time (no assertions). Then the per-token cost of the boundary checks alone (the call
guard's step of a stream and the token-id check of ``token_to_piece``), timed without decoding
since it is below the noise of the loops above. Last, the chat stream parser's cost per token
(llama.cpp's chat layer re-parsing the growing answer at each token, as llama-server does, and the
OpenAI deltas computed from it): a Qwen 3 answer of --n-gen tokens (thinking, text, a tool call)
fed token by token, beside the plain stream's per-token time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generation import default_model, native_tools  # noqa: E402 (a sibling script)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--gemma", action="store_true")
    ap.add_argument("--n-gen", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    native_tools()  # sets LLAMA_CPP_LIB_PATH to the cpu-host build
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as C
    from llama_cpp._internals import LlamaSampler

    model = a.model or default_model(a.gemma)
    n = a.n_gen
    res: dict[str, list[float]] = {"completion": [], "generate": [], "ctypes": [], "c_decode": [], "processor": []}
    with Llama(model, n_ctx=n + 64, n_batch=64, n_ubatch=64, n_threads=a.threads, n_threads_batch=a.threads,
               verbose=False) as llm:
        prompt = llm.tokenize(b"hello there")
        ctx = llm.ctx
        for _ in range(a.reps):
            # timers start at the first token, so the prompt's evaluation is not counted
            llm.reset()
            stream = llm(prompt, max_tokens=n + 1, temperature=0, stream=True)
            next(stream)
            t = time.perf_counter()
            for _ in stream:
                pass
            res["completion"].append((time.perf_counter() - t) / n)

            # the same stream with an identity logits_processor: the NumPy round trip per token
            llm.reset()
            stream = llm(prompt, max_tokens=n + 1, temperature=0, stream=True, logits_processor=lambda ids, s: s)
            next(stream)
            t = time.perf_counter()
            for _ in stream:
                pass
            res["processor"].append((time.perf_counter() - t) / n)

            llm.reset()
            it = llm.generate(prompt, temp=0)
            next(it)
            ctx.perf_reset()
            t = time.perf_counter()
            for i, _ in enumerate(it, start=1):
                if i == n:
                    break
            res["generate"].append((time.perf_counter() - t) / n)
            it.close()
            perf = ctx.perf()
            res["c_decode"].append(perf["t_eval_ms"] / 1000 / max(perf["n_eval"], 1))

            llm.reset()
            with LlamaSampler() as chain:
                chain.add_greedy()
                llm.eval(prompt[:-1])
                one, s = llm.sequence.step.batch, llm.sequence.step.struct
                ctx_p, ch_p = ctx.ptr, chain.ptr
                decode, sample = C.llama_decode, C.llama_sampler_sample
                pos = len(prompt) - 1
                tok = prompt[-1]
                t = time.perf_counter()
                for _ in range(n):
                    one.token_arr[0] = tok
                    one.pos[0] = pos
                    decode(ctx_p, s)
                    tok = sample(ch_p, ctx_p, -1)
                    pos += 1
                res["ctypes"].append((time.perf_counter() - t) / n)
                llm.sequence.tokens.clear()
    med = {k: min(v) * 1e6 for k, v in res.items()}  # best of reps: the machine is shared
    c = med["c_decode"]
    print(f"model {model.name}  threads {a.threads}  tokens {n}  reps {a.reps}   (microseconds per token)")
    print(f"  llama.cpp decode (perf counters)     {c:9.1f}")
    for key, label in (("ctypes", "bare ctypes loop"), ("generate", "Llama.generate"),
                       ("completion", "create_completion(stream=True)")):
        print(f"  {label:36s} {med[key]:9.1f}   overhead {med[key] - c:7.1f} us ({(med[key] - c) / med[key]:5.1%})")
    print(f"  identity logits_processor (stream)   {med['processor']:9.1f}   cost {med['processor'] - med['completion']:7.1f} us"
          " per token over the plain stream")
    print(f"  boundary checks per token            {checks_cost(llm_path=model) * 1e6:9.2f}")
    parser = stream_parser_cost(model, n, a.reps)
    if parser is None:
        print("  chat stream parser                   (libllama-cpp-ext is not in this build)")
    else:
        mean, last = parser
        print(f"  chat stream parser per token         {mean * 1e6:9.1f}   (the last 10% of tokens: {last * 1e6:.1f});"
              f" plain stream {med['completion']:.1f}")
    return 0


QWEN3 = REPO / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"


def stream_parser_cost(llm_path: Path, n: int, reps: int) -> tuple[float, float] | None:
    """Seconds per token of ``ChatStreamParser.feed`` over an ``n``-token Qwen 3 answer, each token's best of
    ``reps`` (mean, and mean over the last tenth of the tokens, where the re-parsed text is longest); None
    without the library."""
    from llama_cpp._chat import native_chat
    from llama_cpp._internals import LlamaModel

    if not native_chat.available() or not QWEN3.is_file():
        return None
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    with native_chat.ChatTemplates(QWEN3.read_text(encoding="utf-8")) as t:
        prompt = t.apply([{"role": "user", "content": "Weather in Paris?"}], tools=[tool])
    words = "the quick brown fox jumps over the lazy dog and then looks at the sky "
    with LlamaModel(llm_path, vocab_only=True) as model:
        def pieces(text: str) -> list[str]:
            toks = model.tokenize(text.encode(), add_special=False, parse_special=True)
            return [model.token_to_piece(tok, True).decode("utf-8", "replace") for tok in toks]

        call = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        third = max(n // 3, 1)
        think = pieces("<think>\n" + words * n)[:third] + pieces("\n</think>\n\n")
        answer = pieces(words * n)[:third]
        out = think + answer + pieces(call)
    best = [float("inf")] * len(out)
    for _ in range(reps):
        stream = native_chat.ChatStreamParser(prompt, id_factory=lambda: "call_0")
        for i, piece in enumerate(out):
            t0 = time.perf_counter()
            stream.feed(piece)
            best[i] = min(best[i], time.perf_counter() - t0)  # per token: a pause of the shared machine is one sample
        stream.finish()
        stream.close()
    tail = best[-max(len(best) // 10, 1):]
    return sum(best) / len(best), sum(tail) / len(tail)


def checks_cost(llm_path: Path, n: int = 200_000) -> float:
    """Seconds per token that the guard and the token-id check add to a stream."""
    from llama_cpp._internals import LlamaModel
    from llama_cpp._safety.call_guard import CallGuard

    guard = CallGuard("benchmark")
    with LlamaModel(llm_path, vocab_only=True) as model:
        tok = model.token_bos()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in iter(range(n)):
                pass
            bare = time.perf_counter() - t
            with guard.call():
                stream = guard.stream(iter(range(n)))
            t = time.perf_counter()
            for _ in stream:
                if not 0 <= tok < model.n_vocab:  # as token_to_piece does
                    raise AssertionError
            best = min(best, (time.perf_counter() - t - bare) / n)
    return max(best, 0.0)


if __name__ == "__main__":
    sys.exit(main())

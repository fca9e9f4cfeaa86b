"""A seeded fuzzer over GGUF headers, saved states, prompt-cache entries, chat templates, GBNF
grammars and JSON schemas (issue 29, part 5).

Every mutant goes through the public API in this process; the only acceptable outcomes are a
result or a :class:`~llama_cpp.LlamaError` (a ``KeyError`` miss for cache lookups), within a
time limit. A signal death kills the run (it is the failure this looks for); a hang trips the
per-mutant limit; a state or cache entry that is accepted must reproduce a fresh run exactly.

    python -m tests.safety.fuzz --seed 1 --count 2000      # the longer run (about 15 min here)

``tests/safety/test_fuzz.py`` runs a bounded, seeded share of it in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from llama_cpp._errors import LlamaError

log = logging.getLogger("fuzz")

#: a mutant's outcome must arrive within this many seconds (GGUF mutants: the child's limit + margin)
MUTANT_LIMIT_S = 10.0
KINDS = ("gguf", "state", "cache", "template", "grammar", "schema")


class FuzzFailure(AssertionError):
    """A mutant had an outcome other than a result or a clean LlamaError."""


@dataclasses.dataclass
class Context:
    """What the mutators share: a model, its saved state and expected continuation."""

    rng: random.Random
    work: Path
    llm: Any = None
    state: Any = None
    prompt: str = "The quick brown fox jumps over"
    expected: str = ""

    def model(self) -> Any:
        if self.llm is None:
            from build_tools.fixtures.cache import fixture_path
            from llama_cpp import Llama

            self.llm = Llama(str(fixture_path("llama_spm")), n_ctx=64, n_batch=64, n_threads=1, verbose=False)
            self.expected = self.greedy(self.prompt)
            self.state = self.llm.save_state()
        return self.llm

    def greedy(self, prompt: str) -> str:
        return self.llm(prompt, max_tokens=3, temperature=0)["choices"][0]["text"]


# -- GGUF ---------------------------------------------------------------------------------------
_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
         "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
         "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size", "general.alignment",
         "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
         "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token", "llama.expert_count",
         "llama.expert_used_count", "tokenizer.ggml.pre", "tokenizer.chat_template"]
_VALUES: list[Any] = [0, 1, 2, 3, 7, 8, 16, 31, 64, 65, 255, 4096, 2**31 - 1, 2**32 - 1, 2**40, -1, 0.0, -1.0,
                      1e-30, float("inf"), float("nan"), True, False, "llama", "gpt2", "bert", "none", "no_vocab",
                      "rwkv", "ugm", "t5", "plamo2", "", "x" * 300, "{{ 'A' * 99999999 }}"]


def _gguf_mutant(ctx: Context, i: int) -> Path:
    from build_tools.fixtures.cache import fixture_path

    from ._rewrite_gguf import DROP, rewrite_gguf

    r = ctx.rng
    base = fixture_path("llama_spm")
    dst = ctx.work / f"m{i}.gguf"
    how = r.random()
    if how < 0.5:
        kv = {r.choice(_KEYS): (DROP if r.random() < 0.15 else r.choice(_VALUES)) for _ in range(r.randint(1, 3))}
        if isinstance(kv.get("general.alignment"), (float, str, bool)) or kv.get("general.alignment") == 0:
            kv.pop("general.alignment")
        try:
            return rewrite_gguf(base, dst, kv=kv)
        except (ValueError, TypeError, OverflowError, struct_error()):
            pass
    if how < 0.7:
        def tokens(t: list[Any]) -> list[Any]:
            for _ in range(r.randint(1, 4)):
                j = r.randrange(len(t))
                t[j] = r.choice(["", t[r.randrange(len(t))], b"\xff\xfe", "<s>", "\u2581", "a" * r.randint(1, 200)])
            return t
        return rewrite_gguf(base, dst, tokens=tokens)
    data = bytearray(base.read_bytes())
    end = min(len(data), 1 << 16)  # the header, metadata and start of the tensor table
    for _ in range(r.randint(1, 8)):
        data[r.randrange(8, end)] = r.randrange(256)
    dst.write_bytes(bytes(data))
    return dst


def struct_error() -> type[Exception]:
    import struct

    return struct.error


def fuzz_gguf(ctx: Context, i: int) -> str:
    from llama_cpp import Llama

    path = _gguf_mutant(ctx, i)
    try:
        with Llama(str(path), n_ctx=64, n_batch=64, n_threads=1, verbose=False, isolate_load=True) as llm:
            llm("hi", max_tokens=2, temperature=0)
            return "loaded"
    except LlamaError as exc:
        why = "child died" if "died with" in str(exc) else "child hung" if "did not finish" in str(exc) else "refused"
        return f"{type(exc).__name__} ({why})"
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


# -- states and cache entries -------------------------------------------------------------------
def _mutated_state(ctx: Context) -> Any:
    r, s = ctx.rng, ctx.state
    how = r.randrange(6)
    if how == 0:
        data = bytearray(s.llama_state)
        for _ in range(r.randint(1, 16)):
            data[r.randrange(len(data))] = r.randrange(256)
        return dataclasses.replace(s, llama_state=bytes(data))
    if how == 1:
        return dataclasses.replace(s, llama_state=bytes(s.llama_state)[: r.randrange(len(s.llama_state))])
    if how == 2:
        return dataclasses.replace(s, n_tokens=r.randint(-2, s.n_tokens + 3))
    if how == 3:
        ids = np.array(s.input_ids, copy=True)
        ids[r.randrange(len(ids))] = r.randrange(ctx.llm.n_vocab())
        return dataclasses.replace(s, input_ids=ids)
    if how == 4:
        return dataclasses.replace(s, digest=None, made_from=None, n_tokens=max(0, s.n_tokens - r.randint(1, 3)))
    return dataclasses.replace(s, seed=s.seed + 1)


def fuzz_state(ctx: Context, i: int) -> str:
    llm = ctx.model()
    mutant = _mutated_state(ctx)
    try:
        llm.load_state(mutant)
    except LlamaError as exc:
        return type(exc).__name__
    # accepted: it must continue exactly as the original state does
    got = llm(ctx.prompt, max_tokens=3, temperature=0)["choices"][0]["text"]
    if got != ctx.expected:
        raise FuzzFailure(f"an accepted mutated state changed the output: {got!r} != {ctx.expected!r}")
    return "accepted"


def fuzz_cache(ctx: Context, i: int) -> str:
    from llama_cpp import LlamaDiskCache

    llm = ctx.model()
    folder = ctx.work / f"cache{i}"
    cache = LlamaDiskCache(folder)
    key = list(ctx.state.input_ids[: ctx.state.n_tokens])
    cache[key] = ctx.state
    (entry,) = [p for p in folder.iterdir() if p.name.endswith(LlamaDiskCache.SUFFIX)]
    r = ctx.rng
    data = bytearray(entry.read_bytes())
    how = r.randrange(4)
    if how == 0:
        for _ in range(r.randint(1, 32)):
            data[r.randrange(len(data))] = r.randrange(256)
        entry.write_bytes(bytes(data))
    elif how == 1:
        entry.write_bytes(bytes(data[: r.randrange(len(data))]))
    elif how == 2:
        with np.load(entry, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        name = r.choice(sorted(arrays))
        arr = np.array(arrays[name], copy=True)
        if arr.size and arr.dtype.kind in "iuf":
            arr.flat[r.randrange(arr.size)] += 1
        arrays[name] = arr
        (np.savez_compressed if r.random() < 0.3 else np.savez)(entry, **arrays)
    else:
        entry.unlink()
        if hasattr(os, "mkfifo"):
            os.mkfifo(entry)
    try:
        state = cache[key]
    except KeyError:
        return "refused"
    llm.load_state(state)
    got = llm(ctx.prompt, max_tokens=3, temperature=0)["choices"][0]["text"]
    if got != ctx.expected:
        raise FuzzFailure(f"an accepted mutated cache entry changed the output: {got!r} != {ctx.expected!r}")
    return "accepted"


# -- templates, grammars, schemas ---------------------------------------------------------------
_BIG = ["1000000000", "99999999", "16000001", "4000000", "300000", "12"]
_TEMPLATE_PARTS = [
    "{{{{ 'A' * {n} }}}}", "{{% set s = 'A' * {n} %}}{{{{ s ~ s ~ s }}}}", "{{{{ ['x'] * {n} | join }}}}",
    "{{{{ 'x'.ljust({n}) }}}}", "{{{{ 'x'.center({n}) }}}}", "{{{{ 'x'.zfill({n}) }}}}", "{{{{ '{{:>{n}}}'.format(1) }}}}",
    "{{{{ '%{n}s' % 'x' }}}}", "{{{{ ('\\t' * 100).expandtabs({n}) }}}}", "{{{{ lipsum(n={n}) }}}}",
    "{{{{ 'ab'.replace('a', 'a' * {n}) }}}}", "{{{{ messages | tojson(indent={n}) }}}}", "{{{{ 10 ** {n} }}}}",
    "{{% for i in range({n}) %}}x{{% endfor %}}", "{{{{ (('x' ~ 'y') * {n})|length }}}}",
    "{{{{ '%*s' % ({n}, 'x') }}}}", "{{{{ 'x' | indent({n}) }}}}", "{{{{ 'x' | center({n}) }}}}",
    "{{% for m in messages %}}{{{{ m.role }}}}: {{{{ m.content }}}}{{% endfor %}}", "{{{{ raise_exception('no') }}}}",
    "{{{{ ''.__class__ }}}}", "{{{{ cycler(1,2).next() }}}}", "{{% macro f(x) %}}{{{{ f(x) }}}}{{% endmacro %}}{{{{ f(1) }}}}",
]


def _template(r: random.Random) -> str:
    parts = [r.choice(_TEMPLATE_PARTS).format(n=r.choice(_BIG)) for _ in range(r.randint(1, 3))]
    depth = r.choice([0, 0, 1, 5, 70, 300])
    body = "".join(parts)
    if r.random() < 0.3:
        body = "(" * depth + body if r.random() < 0.5 else "{{ " + "(" * depth + "1" + ")" * depth + " }}" + body
    else:
        body = "{% if true %}" * depth + body + "{% endif %}" * depth
    if r.random() < 0.2:  # truncate: unbalanced tags
        body = body[: r.randrange(len(body) + 1)]
    return body


def fuzz_template(ctx: Context, i: int) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        Jinja2ChatFormatter(_template(ctx.rng))(messages=[{"role": "user", "content": "hi"}])
        return "rendered"
    except LlamaError as exc:
        return type(exc).__name__


_GBNF = ['root ::= "a" | "b"', "root ::= [a-z]+", 'root ::= item{2,5}\nitem ::= "x"', "root ::= (\"a\" \"b\")*",
         'root ::= obj\nobj ::= "{" ws "}"\nws ::= [ \\t\\n]*']
_NOISE = ["(", ")", "{", "}", "[", "]", "|", "*", "+", "?", "::=", '"', "\\", "{0,1000000000}", "{5,2}", "#", "\n", "x",
          "(" * 300]


def _grammar(r: random.Random) -> str:
    g = list(r.choice(_GBNF))
    for _ in range(r.randint(0, 4)):
        j = r.randrange(len(g) + 1)
        g[j:j] = r.choice(_NOISE)
    return "".join(g)


def fuzz_grammar(ctx: Context, i: int) -> str:
    from llama_cpp._internals import LlamaSampler
    from llama_cpp.llama_grammar import LlamaGrammar

    text = _grammar(ctx.rng)
    try:
        g = LlamaGrammar.from_string(text, verbose=False)
        with contextlib.closing(LlamaSampler()) as s:
            s.add_grammar(ctx.model()._model, g)
        return "parsed"
    except LlamaError as exc:
        return type(exc).__name__


def _schema(r: random.Random, depth: int = 0) -> Any:
    kind = r.choice(["string", "integer", "number", "object", "array", "allOf", "anyOf", "enum", "const", "ref", "deep",
                     "pattern", "bad"])
    if depth > 4 and kind not in ("deep",):
        kind = r.choice(["string", "integer"])
    if kind == "object":
        return {"type": "object", "properties": {f"p{k}": _schema(r, depth + 1) for k in range(r.randint(0, 3))},
                "required": [f"p{k}" for k in range(r.randint(0, 2))]}
    if kind == "array":
        return {"type": "array", "items": _schema(r, depth + 1), "minItems": r.choice([0, 1, 5, 10**9]),
                "maxItems": r.choice([None, 2, 10**9])}
    if kind in ("allOf", "anyOf"):
        return {kind: [_schema(r, depth + 1) for _ in range(r.randint(1, 3))]}
    if kind == "enum":
        return {"enum": r.choice([[], [1, "a", None], "x"])}
    if kind == "const":
        return {"const": r.choice([1, "a", None, [1], {"a": 1}])}
    if kind == "ref":
        return {"$ref": r.choice(["#/$defs/x", "#", "http://example.com/x", "#/nowhere"])}
    if kind == "deep":
        s: Any = {"type": "string"}
        for _ in range(r.choice([10, 70, 500])):
            s = {"type": "array", "items": s}
        return s
    if kind == "pattern":
        return {"type": "string", "pattern": r.choice(["^a+$", "(" * 300 + "a" + ")" * 300, "[", "a{1,99999999}"])}
    if kind == "bad":
        return r.choice([{"type": 5}, {"type": "nope"}, {"minLength": 5, "maxLength": 2, "type": "string"}, [], None])
    return {"type": kind, **({"minimum": r.randint(-10**12, 10**12)} if kind == "integer" and r.random() < 0.5 else {})}


def fuzz_schema(ctx: Context, i: int) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    schema = _schema(ctx.rng)
    try:
        json_schema_to_gbnf(schema) if isinstance(schema, dict) else json_schema_to_gbnf(json.dumps(schema))
        return "converted"
    except LlamaError as exc:
        return type(exc).__name__


FUZZERS: dict[str, Callable[[Context, int], str]] = {
    "gguf": fuzz_gguf, "state": fuzz_state, "cache": fuzz_cache, "template": fuzz_template,
    "grammar": fuzz_grammar, "schema": fuzz_schema,
}


@contextlib.contextmanager
def _isolated_verdicts(work: Path) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in ("LLAMA_CPP_ISOLATE_CACHE", "LLAMA_CPP_ISOLATE_TIMEOUT")}
    os.environ["LLAMA_CPP_ISOLATE_CACHE"] = str(work / "verdicts")
    os.environ.setdefault("LLAMA_CPP_ISOLATE_TIMEOUT", "8")
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(seed: int, counts: dict[str, int], budget_s: float | None = None) -> Counter[str]:
    """Run ``counts[kind]`` mutants of each kind (interleaved, seeded); raises FuzzFailure on the
    first bad outcome. Stops early (returning what ran) once ``budget_s`` is spent."""
    outcomes: Counter[str] = Counter()
    plan = [k for k, n in counts.items() for _ in range(n)]
    random.Random(seed).shuffle(plan)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-fuzz-") as tmp, _isolated_verdicts(Path(tmp)):
        ctx = Context(rng=random.Random(seed), work=Path(tmp))
        try:
            for i, kind in enumerate(plan):
                if budget_s is not None and time.monotonic() - start > budget_s:
                    break
                t0 = time.monotonic()
                try:
                    outcome = FUZZERS[kind](ctx, i)
                except FuzzFailure:
                    raise
                except Exception as exc:  # noqa: BLE001 - anything but LlamaError is the failure sought
                    raise FuzzFailure(f"mutant {i} ({kind}, seed {seed}) raised {type(exc).__name__}: {exc}") from exc
                took = time.monotonic() - t0
                limit = MUTANT_LIMIT_S + (float(os.environ["LLAMA_CPP_ISOLATE_TIMEOUT"]) if kind == "gguf" else 0)
                if took > limit:
                    raise FuzzFailure(f"mutant {i} ({kind}, seed {seed}) took {took:.1f} s (limit {limit:.0f})")
                outcomes[f"{kind}:{outcome}"] += 1
        finally:
            if ctx.llm is not None:
                ctx.llm.close()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=2000, help="mutants in all (GGUF ones are 1 in 6)")
    p.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    args = p.parse_args(argv)
    per = max(1, args.count // len(KINDS))
    counts = {k: per for k in KINDS}
    start = time.monotonic()
    outcomes = run(args.seed, counts, args.budget)
    total = sum(outcomes.values())
    print(f"{total} mutants, no signal death, hang or wrong result in {time.monotonic() - start:.0f} s")
    for k, n in sorted(outcomes.items()):
        print(f"  {k}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

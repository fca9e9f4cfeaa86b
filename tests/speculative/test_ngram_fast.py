"""The fast paths of the n-gram drafters and the verify loop keep their meaning.

``NgramCache`` memoizes its picks per n-gram and looks only at the tail of the history: its
drafts must equal a direct count over the whole history (the algorithm of llama.cpp's
``common/ngram-cache.cpp``, written out here, ties going to the continuation libstdc++'s
``std::unordered_map`` iterates over first) under growth, rewinds and file caches. A decoder
warms up only the target context it created, and leaves it empty.
"""

from __future__ import annotations

import random

import pytest

from llama_cpp.speculative.ngram import NgramCache, stl_order

from .util import CTX, config, plain_generate


def _counts(tokens: list[int], start: int) -> dict[tuple[int, ...], dict[int, int]]:
    """Continuation counts of the 1..4-grams of ``tokens`` that end at ``start..`` (within the chunk)."""
    out: dict[tuple[int, ...], dict[int, int]] = {}
    for k in range(1, 5):
        for i in range(max(start, k), len(tokens)):
            part = out.setdefault(tuple(tokens[i - k:i]), {})
            part[tokens[i]] = part.get(tokens[i], 0) + 1
    return out


def _merge(into: dict, add: dict) -> None:
    for g, part in add.items():
        dst = into.setdefault(g, {})
        for t, c in part.items():
            dst[t] = dst.get(t, 0) + c


def _pick(cache: dict, grams: list, static_part: dict, samples: tuple, percent: tuple) -> int | None:
    for i in range(len(grams) - 1, -1, -1):
        part = cache.get(grams[i]) if grams[i] is not None else None
        if part is None:
            continue
        best = None
        best_p = best_s = total = 0
        for tok in stl_order(list(part)):  # llama.cpp's std::unordered_map order decides ties
            cnt = part[tok]
            cs = 100 * static_part[tok] if tok in static_part else 1
            if cnt * cs > best_p * best_s:
                best, best_p, best_s = tok, cnt, cs
            total += cnt
        if total >= samples[i] and 100 * best_p >= percent[i] * total:
            return best
    return None


class _Reference:
    """llama.cpp's ngram-cache drafting, recounted from the whole input at every draft."""

    def __init__(self, n_draft: int, static: dict, dynamic: dict) -> None:
        self.n_draft, self.static, self.dynamic = n_draft, static, dynamic
        self.context: dict = {}
        self.chunks: list[int] = []  # the history as the chunks it was counted in
        self.size = 0

    def rewind(self) -> None:
        self.context, self.size = {}, 0

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        if self.size < len(prompt) + 1:
            new = prompt[self.size:] + [id_last]
            _merge(self.context, _counts(new, 0))
            self.size = len(prompt) + 1
        seq = prompt + [id_last]
        if len(seq) < 2:
            return []
        out: list[int] = []
        while len(out) < self.n_draft:
            end = len(seq)
            s_gram = tuple(seq[end - 2:end])
            static_part = self.static.get(s_gram, {})
            grams = [tuple(seq[end - k:end]) if end >= k else None for k in range(1, 5)]
            tok = _pick(self.context, grams, static_part, (2, 2, 1, 1), (66, 50, 50, 50))
            if tok is None:
                tok = _pick(self.dynamic, grams, static_part, (4, 3, 2, 2), (75, 66, 66, 66))
            if tok is None:
                part = self.static.get(s_gram)
                if part:
                    best, best_c = max(((t, part[t]) for t in stl_order(list(part))), key=lambda kv: kv[1])
                    if sum(part.values()) >= 2 and 100 * best_c >= 50 * sum(part.values()):
                        tok = best
            if tok is None:
                break
            out.append(tok)
            seq.append(tok)
        return out


def _random_cache(rng: random.Random, vocab: int, n: int) -> dict:
    out: dict = {}
    for _ in range(n):
        gram = tuple(rng.randrange(vocab) for _ in range(rng.choice((2, 2, 3, 4))))
        part = out.setdefault(gram, {})
        for _ in range(rng.randrange(1, 4)):
            t = rng.randrange(vocab)
            part[t] = part.get(t, 0) + rng.randrange(1, 6)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_cache_drafts_equal_a_full_recount(seed):
    rng = random.Random(seed)
    vocab = rng.choice((3, 5, 9))
    static = _random_cache(rng, vocab, 12) if seed % 3 == 1 else {}
    dynamic = _random_cache(rng, vocab, 20) if seed % 3 == 2 else {}
    n_draft = rng.choice((1, 3, 8))
    fast, ref = NgramCache(n_draft, static=static, dynamic=dynamic), _Reference(n_draft, static, dynamic)
    # a repetitive source so that drafts are often accepted, with noise so that they are not always
    cycle = [rng.randrange(vocab) for _ in range(rng.randrange(2, 7))]
    hist = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
    id_last = rng.randrange(vocab)
    drafted = 0
    for step in range(150):
        got = fast.draft(hist, id_last)
        assert got == ref.draft(hist, id_last), (seed, step)
        drafted += len(got)
        n_acc = 0
        while n_acc < len(got) and rng.random() < 0.8:
            n_acc += 1
        emitted = got[:n_acc] + [cycle[step % len(cycle)] if rng.random() < 0.7 else rng.randrange(vocab)]
        for t in emitted:
            hist.append(id_last)
            id_last = t
        if rng.random() < 0.05 and len(hist) > 4:  # the history shrinks: the decoder rewinds its drafters
            del hist[rng.randrange(1, len(hist)):]
            fast.rewind(len(hist))
            ref.rewind()
    assert drafted > 0


def test_decoder_warms_only_its_own_target(targets):
    """A decoder that creates its target context warms it up and hands it over empty; one given a
    context leaves that context's memory alone."""
    from llama_cpp._internals import LlamaBatch, LlamaContext
    from llama_cpp.speculative import build_drafters, make_decoder
    from llama_cpp.speculative.engine import DraftDecoder

    from .util import greedy_sampler

    model = targets["echo"]
    prompt = model.tokenize(b"the cat sat on the mat and the cat sat on the mat and the", add_special=True)
    cfg = config("ngram-mod", 4)
    with make_decoder(model, cfg, ctx_params=dict(CTX)) as dec:
        assert dec.target.seq_pos_max(0) == -1
        perf = dec.target.perf()  # the warm-up decode is not counted
        assert perf["t_eval_ms"] == 0 and perf["t_p_eval_ms"] == 0
        dec.prefill(prompt)
        assert list(dec.generate(greedy_sampler(), 24)) == plain_generate(model, prompt, 24)

    with LlamaContext(model, **CTX) as ctx, LlamaBatch(8, 0, 1) as b:
        for i, t in enumerate(prompt[:5]):
            b.add(t, i, 0, i == 4)
        ctx.decode(b)
        dec = DraftDecoder(model, ctx, cfg, build_drafters(model, cfg, ctx))
        try:
            assert ctx.seq_pos_max(0) == 4
        finally:
            dec.close()


def test_greedy_rows_pick_what_the_sampler_picks(targets):
    """One argmax over a verify batch's rows gives each row's greedy token; only a chain of the
    greedy sampler alone takes that shortcut."""
    import llama_cpp.llama_cpp as C
    from llama_cpp._internals import LlamaContext, LlamaSampler
    from llama_cpp.speculative.batch import GreedyRows, RawBatch, greedy_chain

    from .util import dist_sampler, greedy_sampler

    model = targets["random"]
    with LlamaContext(model, **CTX) as ctx, greedy_sampler() as s:
        raw = RawBatch(ctx)
        try:
            raw.decode(list(range(3, 40)), 0, "none")
            raw.decode([5, 9, 11, 17, 23, 29], 37, "all")
            want = [int(C.llama_sampler_sample(s.ptr, ctx.ptr, i)) for i in range(6)]
            assert GreedyRows(ctx, model.n_vocab).pick(6) == want
            assert GreedyRows(ctx, model.n_vocab).pick(3) == want[:3]
        finally:
            raw.close()
        assert greedy_chain(s)
    with LlamaSampler() as chain:
        chain.add_top_k(5)
        chain.add_greedy()
        assert not greedy_chain(chain)
    with dist_sampler(1) as d:
        assert not greedy_chain(d)
    assert not greedy_chain(lambda ctx, i: 0)


@pytest.mark.parametrize("target", ("bpe", "echo", "random"))
@pytest.mark.parametrize("spec_type", ("ngram-simple", "ngram-map-k4v", "ngram-mod", "ngram-cache"))
def test_generation_through_greedy_rows_equals_plain(targets, references, monkeypatch, target, spec_type):
    """With the argmax shortcut on whatever the vocabulary, the tokens are plain greedy decoding's
    (full, partial and no acceptance; rollbacks by memory removal and by checkpoint) and the
    sampler chain is told every emitted token, as llama_sampler_sample tells it."""
    import llama_cpp.llama_cpp as C
    import llama_cpp.speculative.decoder as decoder
    from llama_cpp.speculative import make_decoder

    from .util import PROMPTS, greedy_sampler

    monkeypatch.setattr(decoder, "GREEDY_ROWS_MIN_VOCAB", 0)
    model = targets[target]
    drafted = 0
    for p in PROMPTS[:2]:
        prompt = model.tokenize(p.encode(), add_special=True)
        want = references[p][1] if target == "echo" else plain_generate(model, prompt, 32)
        with make_decoder(model, config(spec_type, 4), ctx_params=dict(CTX)) as dec, greedy_sampler() as s:
            dec.prefill(prompt)
            got = list(dec.generate(s, 32))
            assert got == want[:len(got)] and len(got) == len(want), (target, spec_type, p)
            assert C.llama_perf_sampler(s.ptr).n_sample == len(got)
            drafted += dec.stats.drafted
    assert drafted > 0


def test_raw_batch_fills_chunks_and_refuses_unknown_output_modes(targets):
    """RawBatch splits an input into n_batch chunks with consecutive positions (the last row is the
    output with "last"), and names a bad output mode before any decode."""
    import llama_cpp.llama_cpp as C
    from llama_cpp._internals import LlamaContext
    from llama_cpp.speculative.batch import RawBatch

    from .util import greedy_sampler

    model = targets["bpe"]
    prompt = model.tokenize(b"the cat sat on the mat and the dog sat on the log", add_special=True)
    params = dict(CTX, n_batch=4, n_ubatch=4)
    with LlamaContext(model, **params) as ctx, greedy_sampler() as s:
        raw = RawBatch(ctx)
        try:
            with pytest.raises(ValueError, match="logits must be"):
                raw.decode(prompt, 0, "some")
            assert ctx.seq_pos_max(0) == -1
            raw.decode(prompt, 0, "last")  # 4 chunks of at most 4 tokens
            assert ctx.seq_pos_max(0) == len(prompt) - 1
            first = int(C.llama_sampler_sample(s.ptr, ctx.ptr, -1))
        finally:
            raw.close()
    assert [first] == plain_generate(model, prompt, 1)


_STL_PROGRAM = r"""
#include <cstdio>
#include <unordered_map>
int main() {
    int n;
    while (std::scanf("%d", &n) == 1) {
        std::unordered_map<int, int> m;
        for (int i = 0; i < n; i++) { int k; std::scanf("%d", &k); m.emplace(k, 1); }
        std::unordered_map<int, int> copy = m;  // llama.cpp's try_draft reads a copy of the part
        for (auto & kv : copy) std::printf("%d ", kv.first);
        std::printf("\n");
    }
}
"""


def test_stl_order_is_libstdcxx_unordered_map_order(tmp_path):
    """llama.cpp breaks ngram-cache ties by its map's iteration order: emulated for libstdc++ (the
    toolchain of the Linux builds), checked against a real one across rehashes."""
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src, exe = tmp_path / "order.cpp", tmp_path / "order"
    src.write_text(_STL_PROGRAM)
    built = subprocess.run([cxx, "-O1", "-o", str(exe), str(src)], check=False, capture_output=True, text=True)
    lib = subprocess.run([cxx, "-print-file-name=libstdc++.so"], check=False, capture_output=True, text=True)
    if built.returncode != 0 or "libstdc++" not in lib.stdout:
        pytest.skip("no libstdc++ toolchain")
    rng = random.Random(5)
    cases = []
    for n in (1, 2, 5, 13, 14, 29, 30, 59, 60, 200, 700, 1200):
        for _ in range(4):
            cases.append(rng.sample(range(max(n, rng.choice((40, 500, 300000)))), n))
    out = subprocess.run([str(exe)], input="".join(f"{len(c)} {' '.join(map(str, c))}\n" for c in cases),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(cases)
    for c, line in zip(cases, out):
        assert stl_order(c) == [int(x) for x in line.split()], len(c)
    assert any(stl_order(c) != c for c in cases)  # not the insertion order

"""Several NextN heads, chained as llama.cpp chains them (step35): draft step ``i`` runs head ``i``.

Fixture ``step35_mtp_heads`` (three heads unless said): ``echo`` (every head right), ``broken``
(head ``broken_head`` always wrong, the heads before it always right) and ``noisy`` (heads that
attend over their own KV: partial acceptance, compared draft for draft with llama.cpp's driver).
"""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError

from .util import CTX, dist_sampler, greedy_sampler, plain_generate

HEADS = 3
FORMS = ("echo", "broken", "noisy")
PROMPTS = ("Hello world, this is a test", "Once upon a time there was", "The quick brown fox")
N_GEN = 32
DRAFTS = (1, 2, 3, 4, 8)


def _path(form: str, **kw):
    return fixture_path("step35_mtp_heads", form=form, **kw)


@pytest.fixture(scope="module")
def models():
    """Loaded models with their NextN layers, by (form, broken_head, heads)."""
    from llama_cpp.speculative import load_mtp_model

    made: dict = {}

    def get(form: str, broken_head: int = 1, heads: int = HEADS):
        key = (form, broken_head, heads)
        if key not in made:
            made[key] = load_mtp_model(_path(form, broken_head=broken_head, heads=heads))
        return made[key]

    yield get
    for m in made.values():
        m.close()


@pytest.fixture(scope="module")
def refs(models):
    """(prompt tokens, plain greedy continuation) per (form, prompt)."""
    out: dict = {}

    def get(form: str, p: str, **kw):
        key = (form, p, tuple(sorted(kw.items())))
        if key not in out:
            m = models(form, **kw)
            toks = m.tokenize(p.encode(), add_special=True)
            out[key] = (toks, plain_generate(m, toks, N_GEN))
        return out[key]

    return get


def _decoder(model, **cfg):
    from llama_cpp.speculative import MTPDecoder, SpecConfig

    return MTPDecoder(model, dict(CTX), SpecConfig("draft-mtp", **cfg))


def _generate(model, prompt, n=N_GEN, sampler=None, **cfg):
    with _decoder(model, **cfg) as dec:
        dec.prefill(prompt)
        return list(dec.generate(sampler or greedy_sampler(), n)), dec.stats


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("draft_n_max", DRAFTS)
def test_greedy_equals_plain(models, refs, form, draft_n_max):
    m = models(form)
    for p in PROMPTS:
        prompt, ref = refs(form, p)
        got, st = _generate(m, prompt, draft_n_max=draft_n_max)
        assert got == ref, (form, draft_n_max, p)
        assert st.generated == len(ref)
        assert len(st.drafted_at) == min(draft_n_max, HEADS)


@pytest.mark.parametrize("draft_n_max", (1, 2, 3, 8))
def test_every_head_right_on_echo(models, refs, draft_n_max):
    m = models("echo")
    for p in PROMPTS:
        got, st = _generate(m, refs("echo", p)[0], draft_n_max=draft_n_max)
        assert st.drafted > 0 and st.accepted == st.drafted, str(st)
        assert st.accepted_at == st.drafted_at
        # a full draft has one token per head (only the last steps are cut by the budget)
        assert st.drafted_at[-1] >= st.draft_steps - 2


@pytest.mark.parametrize("broken_head", (0, 1, 2))
def test_acceptance_stops_at_the_broken_head(models, refs, broken_head):
    """Head ``b`` always wrong, heads before it always right: exactly ``b`` accepted per full draft."""
    m = models("broken", broken_head=broken_head)
    for p in PROMPTS:
        prompt, ref = refs("broken", p, broken_head=broken_head)
        got, st = _generate(m, prompt, draft_n_max=HEADS)
        assert got == ref
        assert st.drafted_at[0] > 0 and len(st.drafted_at) == HEADS
        want = [d if j < broken_head else 0 for j, d in enumerate(st.drafted_at)]
        assert st.accepted_at == want, (broken_head, p, str(st))


def test_draft_n_max_capped_at_the_heads(models, refs):
    """As in llama.cpp (``n_max = min(n_max, n_mtp_layers)``): a longer draft_n_max drafts as
    ``draft_n_max = heads`` does, token for token and draft for draft."""
    for heads in (2, 3):
        m = models("noisy", heads=heads)
        prompt, ref = refs("noisy", PROMPTS[0], heads=heads)
        with _decoder(m, draft_n_max=heads) as dec:
            assert (dec.n_heads, dec.draft_n_max) == (heads, heads)
        base = _generate(m, prompt, draft_n_max=heads)
        assert base[0] == ref
        for dn in (heads + 1, 8, 64):
            with _decoder(m, draft_n_max=dn) as dec:
                assert (dec.n_heads, dec.draft_n_max) == (heads, heads)
            got, st = _generate(m, prompt, draft_n_max=dn)
            assert got == ref
            assert (st.drafted_at, st.accepted_at) == (base[1].drafted_at, base[1].accepted_at), (heads, dn)


@pytest.mark.parametrize("form", ("echo", "noisy"))
def test_seeded_sampling_equals_plain(models, form):
    m = models(form)
    prompt = m.tokenize(PROMPTS[1].encode(), add_special=True)
    for seed in (1, 7):
        ref = plain_generate(m, prompt, N_GEN, dist_sampler(seed))
        for dn in (2, 3):
            got, _ = _generate(m, prompt, sampler=dist_sampler(seed), draft_n_max=dn)
            assert got == ref, (seed, dn)


def test_reused_prefix_drafts_as_a_fresh_decoder(models, refs):
    """A second prefill that keeps a common prefix (each head's KV below it kept, the rest
    rebuilt under every head) drafts exactly as a decoder that starts from nothing."""
    m = models("noisy")
    first, _ = refs("noisy", PROMPTS[0])
    second = first[:4] + m.tokenize(b" and then a dog", add_special=False)
    fresh = _generate(m, second, draft_n_max=HEADS)
    with _decoder(m, draft_n_max=HEADS) as dec:
        dec.prefill(first)
        list(dec.generate(greedy_sampler(), 8))
        dec.prefill(second)
        dec.stats.reset()
        got = list(dec.generate(greedy_sampler(), N_GEN))
        assert got == fresh[0] == plain_generate(m, second, N_GEN)
        assert (dec.stats.drafted_at, dec.stats.accepted_at) == (fresh[1].drafted_at, fresh[1].accepted_at)


def test_state_round_trip(models, refs):
    m = models("noisy")
    prompt, ref = refs("noisy", PROMPTS[1])
    with _decoder(m, draft_n_max=HEADS) as dec:
        dec.prefill(prompt)
        head = list(dec.generate(greedy_sampler(), 5))
        state = dec.save_state()
        dec.stats.reset()
        tail = list(dec.generate(greedy_sampler(), N_GEN - len(head)))
        first = (dec.stats.drafted_at, dec.stats.accepted_at)
        dec.load_state(state)
        dec.stats.reset()
        again = list(dec.generate(greedy_sampler(), N_GEN - len(head)))
        assert head + tail == head + again == ref
        assert (dec.stats.drafted_at, dec.stats.accepted_at) == first


def _drive_like_tool(dec, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Generate as ``llama-speculative-simple -n n`` does: each draft cut to ``n - done - 1``
    (no cut at 0 or less), stopping after the step that passes ``n``; returns the tokens and the
    acceptance per draft position as the tool reports it."""
    dec.prefill(prompt)
    st = dec.stats
    while st.generated <= n:
        budget = n - st.generated - 1
        gen = dec.generate(greedy_sampler(), budget + 1 if budget > 0 else 10 * n)
        next(gen)
        gen.close()
    rates = [round(a / st.draft_steps, 3) for a in st.accepted_at if a] if st.draft_steps else []
    return dec.history[len(prompt):], rates


@pytest.mark.parametrize("form", FORMS)
def test_matches_llama_speculative_simple(models, run_tool, form):
    """Same text as ``llama-speculative-simple --spec-type draft-mtp``, and the same drafts: as many,
    as many tokens accepted, the same acceptance per position (so each head saw the KV llama.cpp's did)."""
    from ._tool import tool_stats

    m = models(form)
    for p in PROMPTS[:2]:
        prompt = m.tokenize(p.encode(), add_special=True, parse_special=True)
        for dn in (1, 2, 3, 5):
            with _decoder(m, draft_n_max=dn) as dec:
                got, rates = _drive_like_tool(dec, prompt, N_GEN)
                st = dec.stats
            mine = m.detokenize(got[:N_GEN]).decode("utf-8", errors="replace")
            proc = run_tool("llama-speculative-simple", "-m", _path(form), "--spec-type", "draft-mtp",
                            "--spec-draft-n-max", dn, "-lv", 4, "--temp", "0", "-p", p, "-n", N_GEN,
                            "-c", CTX["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                            complete=lambda out, k=len(p) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
            text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
            assert text.startswith(p) and text[len(p):].startswith(mine), (form, dn, text[:200], mine[:200])
            n_drafts, n_acc, tool_rates = tool_stats(proc.stderr, "draft-mtp")
            assert (st.draft_steps, st.accepted) == (n_drafts, n_acc), (form, dn, p, str(st))
            assert rates == [r for r in tool_rates if r], (form, dn, p)


@pytest.fixture(scope="module")
def llamas():
    """(plain, speculative with draft_n_max=8) ``Llama`` per form, created on demand."""
    from llama_cpp.llama import Llama
    from llama_cpp.speculative import SpecConfig

    kw = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
    made: dict = {}

    def get(form: str):
        if form not in made:
            path = _path(form)
            made[form] = (Llama(path, **kw), Llama(path, speculative=SpecConfig("draft-mtp", draft_n_max=8), **kw))
        return made[form]

    yield get
    for pair in made.values():
        for obj in pair:
            obj.close()


def test_llama_completion_and_streaming(llamas):
    plain, spec = llamas("broken")
    for p in PROMPTS[:2]:
        ref = plain.create_completion(p, max_tokens=24, temperature=0)
        got = spec.create_completion(p, max_tokens=24, temperature=0)
        assert got["choices"][0]["text"] == ref["choices"][0]["text"]
        st = spec.last_speculative_stats
        # draft_n_max 8 drafts one token per head; only the first head (before the broken one) is right
        assert len(st.drafted_at) == HEADS and st.accepted == st.accepted_at[0] == st.drafted_at[0] > 0
        chunks = list(spec.create_completion(p, max_tokens=24, temperature=0, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == ref["choices"][0]["text"]


def test_llama_chat_grammar_and_sampling(llamas):
    plain, spec = llamas("noisy")
    msgs = [{"role": "user", "content": "Tell me a story"}]
    for _turn in range(2):
        ref = plain.create_chat_completion(msgs, max_tokens=16, temperature=0)
        got = spec.create_chat_completion(msgs, max_tokens=16, temperature=0)
        assert got["choices"][0]["message"] == ref["choices"][0]["message"]
        msgs = msgs + [ref["choices"][0]["message"], {"role": "user", "content": "And then what"}]
    grammar = 'root ::= (" the" | " cat" | " sat" | " on" | " mat")+'
    for temp, seed in ((0.0, 1), (0.9, 3)):
        ref = plain.create_completion(PROMPTS[0], max_tokens=20, temperature=temp, seed=seed, grammar=grammar)
        got = spec.create_completion(PROMPTS[0], max_tokens=20, temperature=temp, seed=seed, grammar=grammar)
        assert got["choices"][0]["text"] == ref["choices"][0]["text"], (temp, seed)
    ref = plain.create_completion(PROMPTS[1], max_tokens=24, temperature=0.8, seed=5)
    got = spec.create_completion(PROMPTS[1], max_tokens=24, temperature=0.8, seed=5)
    assert got["choices"][0]["text"] == ref["choices"][0]["text"]


# -- models llama.cpp cannot chain ---------------------------------------------------------------

def _header_only(path, arch: str, n_nextn: int):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 2 + n_nextn)
    w.add_uint32(f"{arch}.nextn_predict_layers", n_nextn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ("qwen35", "glm4moe", "deepseek2"))
def test_several_heads_where_the_graph_runs_one(tmp_path, arch):
    """Their MTP graphs assert a single NextN block (the process would abort): refused from the header."""
    from llama_cpp.speculative import SpecConfig, check_model_file, load_mtp_model

    path = _header_only(tmp_path / f"{arch}.gguf", arch, 2)
    with pytest.raises(SpeculativeError, match=r"declares 2 NextN .* runs exactly one"):
        check_model_file(path, SpecConfig("draft-mtp"))
    with pytest.raises(SpeculativeError, match="runs exactly one"):
        load_mtp_model(path)
    check_model_file(_header_only(tmp_path / "one.gguf", arch, 1), SpecConfig("draft-mtp"))  # one head is fine

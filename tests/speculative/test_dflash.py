"""``draft-dflash`` on the ``qwen35_mtp`` echo target: the same tokens as plain decoding, acceptance
where the draft's construction puts it, the same drafts as llama.cpp's own driver, and clear
errors before loading."""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.speculative import SpecConfig

from .util import CTX, N_GEN, PROMPTS, config, dist_sampler, plain_generate, spec_generate

FORMS = ("first", "noisy", "feature", "constant")
DRAFTS = (1, 3, 8)
NOISE = {"feature": 0.1}  # the attention weight that leaves about half the first tokens right


def _draft(form: str = "first", **kw) -> str:
    if form in NOISE:
        kw.setdefault("noise", NOISE[form])
    return str(fixture_path("dflash_draft", form=form, **kw))


def _cfg(form: str, n: int, **kw) -> SpecConfig:
    return SpecConfig("draft-dflash", draft_model_path=_draft(form), draft_n_max=n, **kw)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("n", DRAFTS)
def test_greedy_equals_plain(echo, references, form, n):
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, _cfg(form, n))
        assert got == ref, (form, n, p)
        assert st.generated == len(ref) and st.drafted > 0
        assert set(st.drafted_by) == {"draft-dflash"} and len(st.drafted_at) <= n


@pytest.mark.parametrize("mrope", (False, True))
@pytest.mark.parametrize("n", (1, 4, 15))
def test_first_token_always_right_later_never_and_constant_never(echo, references, n, mrope):
    """Every mask row proposes next(id_last): right for the first drafted token only (also for a
    draft with M-RoPE sections, whose feature rows take four positions)."""
    cfg = SpecConfig("draft-dflash", draft_model_path=_draft("first", mrope=mrope), draft_n_max=n)
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, cfg)
        assert got == ref
        assert st.drafted_at[0] > 0 and st.accepted_at[0] == st.drafted_at[0], (n, p, str(st))
        assert sum(st.accepted_at[1:]) == 0, (n, p, str(st))
        if n == 1:
            assert st.accepted == st.drafted
        _, st = spec_generate(echo, prompt, N_GEN, _cfg("constant", n))
        assert st.drafted >= N_GEN // 2 and st.accepted == 0, (n, p, str(st))


def test_draft_n_max_is_cut_to_the_block():
    """dflash.block_size 16 leaves 15 masks: a longer draft_n_max drafts 15."""
    import llama_cpp.speculative as spec

    from .util import CTX as ctx

    with spec.make_decoder(_model_for_cut(), _cfg("first", 30), ctx_params=dict(ctx, n_batch=64, n_ubatch=64)) as dec:
        assert dec.drafters[0].n_max == 15


def _model_for_cut():
    from llama_cpp._internals import LlamaModel

    return LlamaModel(str(fixture_path("qwen35_mtp", form="echo")))


@pytest.mark.parametrize("form", ("noisy", "feature"))
def test_noisy_and_feature_drafts_accept_part(echo, references, form):
    drafted = accepted = 0
    for p in PROMPTS:
        prompt, _ = references[p]
        _, st = spec_generate(echo, prompt, N_GEN, _cfg(form, 1))
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    assert 0.1 * drafted < accepted < 0.9 * drafted, (form, accepted, drafted)


@pytest.mark.parametrize("form", ("first", "feature"))
def test_seeded_sampling_equals_plain(echo, form):
    prompt = echo.tokenize(PROMPTS[1].encode(), add_special=True)
    for seed in (1, 7):
        ref = plain_generate(echo, prompt, N_GEN, dist_sampler(seed))
        got, _ = spec_generate(echo, prompt, N_GEN, _cfg(form, 4), dist_sampler(seed))
        assert got == ref, (form, seed)


@pytest.mark.parametrize("n_rs_seq", (0, 1, 8))
def test_rollback_by_checkpoint_or_snapshots(echo, references, n_rs_seq):
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, _cfg("feature", 4, n_rs_seq=n_rs_seq))
        assert got == ref, (n_rs_seq, p)
        if n_rs_seq == 0:
            assert st.rollbacks_partial == 0 and st.rollbacks_checkpoint > 0
        if n_rs_seq == 8:
            assert st.rollbacks_checkpoint == 0


def test_prompt_longer_than_a_batch_drafts_as_one_batch(echo):
    """Prefill in n_batch chunks writes every chunk's features: the drafts are those of one batch."""
    prompt = echo.tokenize((" ".join([PROMPTS[0], PROMPTS[1]] * 3)).encode(), add_special=True)
    small = dict(CTX, n_batch=16, n_ubatch=16)
    assert len(prompt) > 2 * small["n_batch"]
    ref = plain_generate(echo, prompt, N_GEN)
    got, st = spec_generate(echo, prompt, N_GEN, _cfg("feature", 4), ctx=small)
    whole, st_whole = spec_generate(echo, prompt, N_GEN, _cfg("feature", 4))
    assert got == ref == whole
    assert (st.drafted, st.accepted) == (st_whole.drafted, st_whole.accepted)


def test_continuing_and_rewinding_the_history(echo, references):
    from llama_cpp.speculative import make_decoder

    from .util import greedy_sampler

    prompt, ref = references[PROMPTS[0]]
    other, ref_other = references[PROMPTS[2]]
    with make_decoder(echo, _cfg("first", 1), ctx_params=dict(CTX)) as dec:
        dec.prefill(prompt)
        first = list(dec.generate(greedy_sampler(), 9))
        dec.prefill(prompt + first)
        rest = list(dec.generate(greedy_sampler(), N_GEN - 9))
        assert first + rest == ref
        dec.prefill(other)
        assert list(dec.generate(greedy_sampler(), N_GEN)) == ref_other
        dec.prefill(prompt[:-2])
        assert list(dec.generate(greedy_sampler(), 12)) == plain_generate(echo, prompt[:-2], 12)
        assert dec.stats.accepted == dec.stats.drafted


def test_combined_with_ngram_types(echo, references):
    for p in PROMPTS:
        prompt, ref = references[p]
        cfg = config(["ngram-simple", "draft-dflash"], 4, draft_model_path=_draft("noisy"))
        got, st = spec_generate(echo, prompt, N_GEN, cfg)
        assert got == ref
        assert set(st.drafted_by) <= {"ngram-simple", "draft-dflash"} and "draft-dflash" in st.drafted_by


# -- DFlash2: the selector lattice ----------------------------------------------------------------

SELECTORS = {"selector": {"selector": True}, "selector-noisy": {"selector": True, "selector_noise": 2.0}}


def _cfg2(name: str, n: int, **kw) -> SpecConfig:
    path = str(fixture_path("dflash_draft", form="first", **SELECTORS[name]))
    return SpecConfig("draft-dflash", draft_model_path=path, draft_n_max=n, **kw)


@pytest.mark.parametrize("name", SELECTORS)
@pytest.mark.parametrize("n", (1, 4, 15))
def test_dflash2_greedy_equals_plain_and_acceptance(echo, references, name, n):
    """With no transition scores the walk takes each row's top candidate (the first token only is
    right, as in DFlash); weighted scores move the walk off it (partial)."""
    drafted = accepted = 0
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, _cfg2(name, n))
        assert got == ref, (name, n, p)
        assert st.drafted > 0 and len(st.drafted_at) <= n
        if name == "selector":
            assert st.accepted_at[0] == st.drafted_at[0] and sum(st.accepted_at[1:]) == 0, str(st)
        drafted, accepted = drafted + st.drafted_at[0], accepted + st.accepted_at[0]
    if name == "selector-noisy":
        assert 0.1 * drafted < accepted < 0.9 * drafted


@pytest.mark.parametrize("n", (1, 4, 15))
def test_dflash2_first_token_always_right_and_constant_never(echo, references, n):
    """The v1 constructions through the selector lattice (no transition scores: each row's top
    candidate): ``first`` is always right at position 0 and never after it (100 % with n=1);
    ``constant`` (a byte token the target never emits tops every row) is never right."""
    first = SpecConfig("draft-dflash", draft_model_path=str(fixture_path("dflash_draft", form="first", selector=True)),
                       draft_n_max=n)
    never = SpecConfig("draft-dflash", draft_model_path=str(fixture_path("dflash_draft", form="constant",
                                                                           selector=True)), draft_n_max=n)
    from llama_cpp.speculative import make_decoder

    for cfg in (first, never):
        with make_decoder(echo, cfg, ctx_params=dict(CTX)) as dec:
            assert dec.drafters[0]._top_k > 0  # the DFlash2 lattice runs
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, first)
        assert got == ref
        assert st.drafted_at[0] > 0 and st.accepted_at[0] == st.drafted_at[0], (n, p, str(st))
        assert sum(st.accepted_at[1:]) == 0 and (n > 1 or st.accepted == st.drafted), (n, p, str(st))
        got, st = spec_generate(echo, prompt, N_GEN, never)
        assert got == ref
        assert st.drafted >= N_GEN // 2 and st.accepted == 0, (n, p, str(st))


def test_dflash2_seeded_sampling_equals_plain(echo):
    prompt = echo.tokenize(PROMPTS[1].encode(), add_special=True)
    ref = plain_generate(echo, prompt, N_GEN, dist_sampler(3))
    got, _ = spec_generate(echo, prompt, N_GEN, _cfg2("selector-noisy", 4), dist_sampler(3))
    assert got == ref


@pytest.mark.parametrize("name", SELECTORS)
@pytest.mark.parametrize("m", (2, 4))
def test_dflash2_matches_llama_speculative_simple(echo, target_path, run_tool, name, m):
    from llama_cpp.speculative import make_decoder

    from ._tool import drive_like_tool, tool_drafted_tokens, tool_stats

    n = 32
    cfg = _cfg2(name, m, n_rs_seq=m)
    for p in ("Once upon a time there was", "the cat sat on the mat and the dog sat on the"):
        prompt = echo.tokenize(p.encode(), add_special=True, parse_special=True)
        with make_decoder(echo, cfg, ctx_params=dict(CTX)) as dec:
            got, my_rates = drive_like_tool(dec, prompt, n)
            st = dec.stats
        mine = echo.detokenize(got[:n]).decode("utf-8", errors="replace")
        proc = run_tool("llama-speculative-simple", "-m", target_path("echo"), "-md", cfg.draft_model_path,
                        "--spec-type", "draft-dflash", "--spec-draft-n-max", m, "-lv", 4, "--temp", "0", "-p", p,
                        "-n", n, "-c", CTX["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                        complete=lambda out, k=len(p) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
        text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
        assert text.startswith(p) and text[len(p):].startswith(mine), (name, m, text[:200], mine[:200])
        n_drafts, n_acc, rates = tool_stats(proc.stderr, "draft-dflash")
        assert st.drafted == tool_drafted_tokens(proc.stderr, "draft-dflash"), str(st)
        assert (st.drafted_at[0], st.accepted) == (n_drafts, n_acc), (name, m, p, str(st))
        assert my_rates == [r for r in rates if r], (name, m, p)


# -- errors before any native call -------------------------------------------------------------

Llama = pytest.importorskip("llama_cpp.llama").Llama
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}


def test_config_errors():
    with pytest.raises(SpeculativeError, match="needs a draft model"):
        SpecConfig("draft-dflash")
    with pytest.raises(SpeculativeError, match="cannot be combined: llama.cpp runs every draft-"):
        SpecConfig(["draft-dflash", "draft-mtp"], draft_model_path="x.gguf")
    with pytest.raises(SpeculativeError, match="at most one"):
        SpecConfig(["draft-eagle3", "draft-dflash"], draft_model_path="x.gguf")


@pytest.mark.parametrize(("draft", "match"), [
    (lambda tmp: str(tmp / "missing.gguf"), "not a file"),
    (lambda tmp: str(fixture_path("eagle3_draft")), "needs a draft whose general.architecture is 'dflash'"),
    (lambda tmp: _draft(n_embd=32), "32 wide"),
    (lambda tmp: _draft(target_layers="0,2"), "out of range"),
])
def test_drafts_that_do_not_fit_fail_before_loading(tmp_path, monkeypatch, draft, match):
    import llama_cpp._internals as internals

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the check")

    path = draft(tmp_path)
    target = fixture_path("qwen35_mtp", form="echo")
    monkeypatch.setattr(internals.LlamaModel, "__init__", no_load)
    with pytest.raises(SpeculativeError, match=match):
        Llama(target, speculative=SpecConfig("draft-dflash", draft_model_path=path), **KW)


def test_a_dflash_file_as_draft_simple_names_the_type():
    target = fixture_path("qwen35_mtp", form="echo")
    with pytest.raises(SpeculativeError, match="spec_type='draft-dflash'"):
        Llama(target, speculative=SpecConfig(draft_model_path=_draft()), **KW)


# -- through Llama ---------------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say the cat sat on the mat, the cat sat on the mat"}]
PROMPT = "the cat sat on the mat and the dog sat on the log and the cat sat on the"


@pytest.fixture(scope="module")
def llamas():
    path = fixture_path("qwen35_mtp", form="echo")
    made = {"plain": Llama(path, **KW), "first": Llama(path, speculative=_cfg("first", 1), **KW),
            "feature": Llama(path, speculative=_cfg("feature", 3), **KW)}
    yield made
    for obj in made.values():
        obj.close()


def _text(resp) -> str:
    return resp["choices"][0]["text"]


@pytest.mark.parametrize("form", ("first", "feature"))
def test_llama_completion_stream_chat_and_grammar_equal_plain(llamas, form):
    plain, spec = llamas["plain"], llamas[form]
    for p in (PROMPT, "Once upon a time"):
        ref = plain.create_completion(p, max_tokens=24, temperature=0)
        got = spec.create_completion(p, max_tokens=24, temperature=0)
        assert _text(got) == _text(ref) and got["usage"] == ref["usage"]
        st = spec.last_speculative_stats
        assert st.drafted > 0 and set(st.drafted_by) == {"draft-dflash"}
        if form == "first":
            assert st.accepted == st.drafted
        chunks = list(spec.create_completion(p, max_tokens=24, temperature=0, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == _text(ref)
    kw = {"max_tokens": 20, "temperature": 0.8, "seed": 5, "repeat_penalty": 1.1}
    assert _text(spec.create_completion(PROMPT, **kw)) == _text(plain.create_completion(PROMPT, **kw))
    msgs = list(MESSAGES)
    for _turn in range(2):
        ref = plain.create_chat_completion(msgs, max_tokens=16, temperature=0)
        got = spec.create_chat_completion(msgs, max_tokens=16, temperature=0)
        assert got["choices"][0]["message"] == ref["choices"][0]["message"]
        streamed = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in spec.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
        assert streamed == ref["choices"][0]["message"]["content"]
        msgs = msgs + [ref["choices"][0]["message"], {"role": "user", "content": "Again, the cat sat on the mat"}]
    grammar = 'root ::= (" the" | " cat" | " sat" | " on" | " mat")+'
    for temp, seed in ((0, None), (0.9, 3)):
        ref = plain.create_completion(PROMPT, max_tokens=20, temperature=temp, seed=seed, grammar=grammar)
        got = spec.create_completion(PROMPT, max_tokens=20, temperature=temp, seed=seed, grammar=grammar)
        assert _text(got) == _text(ref)


@pytest.mark.parametrize("form", ("first", "feature"))
def test_llama_state_save_load(llamas, form):
    """After a restored state the draft memory is rebuilt from the target (first keeps accepting all)."""
    spec = llamas[form]
    spec.create_completion(PROMPT, max_tokens=11, temperature=0)
    state = spec.save_state()
    follow = PROMPT + " cat"
    a = spec.create_completion(follow, max_tokens=20, temperature=0)
    spec.create_completion("something unrelated", max_tokens=5, temperature=0)
    spec.load_state(state)
    b = spec.create_completion(follow, max_tokens=20, temperature=0)
    assert _text(a) == _text(b)
    st = spec.last_speculative_stats
    assert st.drafted > 0 and (form != "first" or st.accepted == st.drafted), str(st)


# -- llama.cpp's own driver ----------------------------------------------------------------------


@pytest.mark.parametrize("form", ("first", "noisy", "feature"))
@pytest.mark.parametrize("m", (2, 4))
def test_matches_llama_speculative_simple(echo, target_path, run_tool, form, m):
    """The same text as ``llama-speculative-simple --spec-type draft-dflash --temp 0`` and, driven as
    the tool drives it (``n_rs_seq`` snapshots, drafts cut to the budget, one step past ``-n``), the
    same drafts: as many, as many accepted, the same acceptance at every draft position."""
    from llama_cpp.speculative import make_decoder

    from ._tool import drive_like_tool, tool_drafted_tokens, tool_stats

    n = 32
    draft = _draft(form)
    for p in ("Once upon a time there was", "the cat sat on the mat and the dog sat on the"):
        prompt = echo.tokenize(p.encode(), add_special=True, parse_special=True)
        with make_decoder(echo, _cfg(form, m, n_rs_seq=m), ctx_params=dict(CTX)) as dec:
            got, my_rates = drive_like_tool(dec, prompt, n)
            st = dec.stats
        mine = echo.detokenize(got[:n]).decode("utf-8", errors="replace")
        proc = run_tool("llama-speculative-simple", "-m", target_path("echo"), "-md", draft,
                        "--spec-type", "draft-dflash", "--spec-draft-n-max", m, "-lv", 4, "--temp", "0", "-p", p,
                        "-n", n, "-c", CTX["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                        complete=lambda out, k=len(p) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
        text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
        assert text.startswith(p) and text[len(p):].startswith(mine), (form, m, text[:200], mine[:200])
        n_drafts, n_acc, rates = tool_stats(proc.stderr, "draft-dflash")
        assert st.drafted == tool_drafted_tokens(proc.stderr, "draft-dflash"), str(st)
        assert (st.drafted_at[0], st.accepted) == (n_drafts, n_acc), (form, m, p, str(st))
        assert my_rates == [r for r in rates if r], (form, m, p)


@pytest.mark.parametrize("kind, form", [("draft-dflash", "first"), ("draft-eagle3", "echo")])
def test_generation_runs_to_the_end_of_the_context(echo, kind, form):
    # Near n_ctx the DFlash block (n_max + 1 entries) no longer fits the draft memory: no draft
    # there, as llama.cpp, instead of a failed decode ending the generation.
    from tests.speculative.mtp.util import plain_generate as plain_in

    ctx = {**CTX, "n_ctx": 256}
    prompt = echo.tokenize(PROMPTS[0].encode(), add_special=True)
    n = 256 - len(prompt)
    ref = plain_in(echo, prompt, n, None, ctx_params=ctx)
    path = _draft(form) if kind == "draft-dflash" else str(fixture_path("eagle3_draft", form=form))
    got, _st = spec_generate(echo, prompt, n, SpecConfig(kind, draft_model_path=path, draft_n_max=8), ctx=ctx)
    assert got == ref and len(got) >= n - 1

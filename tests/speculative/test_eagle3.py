"""``draft-eagle3`` on the ``qwen35_mtp`` echo target (hybrid: rollbacks go through checkpoints or
``n_rs_seq`` snapshots): the same tokens as plain decoding, acceptance where the draft's
construction puts it, the target features it reads, and clear errors before loading."""

from __future__ import annotations

import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.speculative import SpecConfig

from .util import CTX, N_GEN, PROMPTS, check_grammar_completions, config, dist_sampler, plain_generate, spec_generate

FORMS = ("echo", "noisy", "feature", "constant")
DRAFTS = (1, 3, 8)


def _draft(form: str = "echo", **kw) -> str:
    return str(fixture_path("eagle3_draft", form=form, **kw))


def _cfg(form: str, n: int, **kw) -> SpecConfig:
    return SpecConfig("draft-eagle3", draft_model_path=_draft(form), draft_n_max=n, **kw)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("n", DRAFTS)
def test_greedy_equals_plain(echo, references, form, n):
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, _cfg(form, n))
        assert got == ref, (form, n, p)
        assert st.generated == len(ref) and st.drafted > 0
        assert set(st.drafted_by) == {"draft-eagle3"} and len(st.drafted_at) <= n


@pytest.mark.parametrize("n", (1, 4, 8))
def test_echo_accepts_everything_and_constant_nothing(echo, references, n):
    for p in PROMPTS:
        prompt, _ = references[p]
        _, st = spec_generate(echo, prompt, N_GEN, _cfg("echo", n))
        assert st.drafted > 0 and st.accepted == st.drafted, (n, p, str(st))
        assert st.steps <= -(-N_GEN // (min(n, N_GEN) + 1)) + 1  # n + 1 tokens per verify
        _, st = spec_generate(echo, prompt, N_GEN, _cfg("constant", n))
        assert st.drafted >= N_GEN // 2 and st.accepted == 0, (n, p, str(st))


@pytest.mark.parametrize("form", ("noisy", "feature"))
def test_noisy_and_feature_drafts_accept_part(echo, references, form):
    drafted = accepted = 0
    for p in PROMPTS:
        prompt, _ = references[p]
        _, st = spec_generate(echo, prompt, N_GEN, _cfg(form, 4))
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    assert 0.05 * drafted < accepted < 0.9 * drafted, (form, accepted, drafted)


def test_feature_acceptance_falls_with_the_weight_of_g(echo, references):
    """In the ``feature`` form the target features enter with weight ``noise``: 0 is the echo draft."""
    rates = []
    for noise in (0.0, 0.05, 1.0):
        d = a = 0
        for p in PROMPTS:
            cfg = SpecConfig("draft-eagle3", draft_model_path=_draft("feature", noise=noise), draft_n_max=4)
            _, st = spec_generate(echo, references[p][0], N_GEN, cfg)
            d, a = d + st.drafted, a + st.accepted
        rates.append(a / d)
    assert rates[0] == 1.0 and rates[0] > rates[1] > rates[2], rates


def _tensor(path, name: str) -> np.ndarray:
    import gguf

    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    return np.array(t.data, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))


@pytest.mark.parametrize("layers", ("0,1,1", "1,0,1"))
def test_g_rows_are_the_encoded_target_layer_inputs(echo, layers):
    """Each block of the echo target passes its input through, so every layer's input at ``p`` is
    ``embd(t_p)``: the drafter's ``g_p`` must be ``fc @ [embd(t_p)] * 3``, position by position,
    across prefill chunks and verify batches."""
    from llama_cpp.speculative import make_decoder

    from .util import greedy_sampler

    draft = _draft("feature", target_layers=layers)
    embd = _tensor(fixture_path("qwen35_mtp", form="echo"), "token_embd.weight")
    fc = _tensor(draft, "fc.weight")
    prompt = echo.tokenize((PROMPTS[0] + " " + PROMPTS[1]).encode(), add_special=True)
    small = dict(CTX, n_batch=8, n_ubatch=8)
    cfg = SpecConfig("draft-eagle3", draft_model_path=draft, draft_n_max=4)
    with make_decoder(echo, cfg, ctx_params=small) as dec:
        dec.prefill(prompt)
        list(dec.generate(greedy_sampler(), 20))
        drafter = dec.drafters[0]
        hist = dec.kv_tokens
        want = np.concatenate([embd[hist]] * 3, axis=1) @ fc.T
        assert drafter._rows.first_miss(hist, 0, len(hist)) is None
        got = drafter._rows.get(0, len(hist))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers", ("0,1,1", "1,0,1", "1,1,0"))
def test_features_are_the_listed_layers_in_order(targets, layers):
    """On the random target only layer 0's input is ``embd(t_p)``: it must sit in the third of the
    feature row that ``target_layers`` gives it; the output equals plain decoding there too."""
    from llama_cpp.speculative import make_decoder

    from .util import greedy_sampler

    model = targets["random"]
    embd = _tensor(fixture_path("qwen35_mtp", form="random"), "token_embd.weight")
    prompt = model.tokenize(PROMPTS[0].encode(), add_special=True)
    ref = plain_generate(model, prompt, 16)
    cfg = SpecConfig("draft-eagle3", draft_model_path=_draft("feature", target_layers=layers), draft_n_max=3)
    with make_decoder(model, cfg, ctx_params=dict(CTX)) as dec:
        dec.prefill(prompt)
        feats = dec.drafters[0]._tl.rows(len(prompt) - 1)  # the prefill was the last target decode
        k = layers.split(",").index("0")
        np.testing.assert_allclose(feats[:, 64 * k:64 * (k + 1)], embd[prompt[:-1]], rtol=1e-5, atol=1e-5)
        others = [j for j in range(3) if j != k]
        assert not np.allclose(feats[:, 64 * others[0]:64 * (others[0] + 1)], embd[prompt[:-1]], atol=1e-2)
        assert list(dec.generate(greedy_sampler(), 16)) == ref


@pytest.mark.parametrize("form", ("echo", "feature"))
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
    """Prefill in n_batch chunks feeds the drafter every chunk: the drafts are those of one batch."""
    prompt = echo.tokenize((" ".join([PROMPTS[0], PROMPTS[1]] * 3)).encode(), add_special=True)
    small = dict(CTX, n_batch=16, n_ubatch=16)
    assert len(prompt) > 2 * small["n_batch"]
    ref = plain_generate(echo, prompt, N_GEN)
    got, st = spec_generate(echo, prompt, N_GEN, _cfg("feature", 4), ctx=small)
    whole, st_whole = spec_generate(echo, prompt, N_GEN, _cfg("feature", 4))
    assert got == ref == whole
    assert (st.drafted, st.accepted) == (st_whole.drafted, st_whole.accepted)


def test_continuing_and_rewinding_the_history(echo, references):
    """Prefills that extend, cut back or replace the history re-pair the draft memory."""
    from llama_cpp.speculative import make_decoder

    from .util import greedy_sampler

    prompt, ref = references[PROMPTS[0]]
    other, ref_other = references[PROMPTS[2]]
    with make_decoder(echo, _cfg("echo", 4), ctx_params=dict(CTX)) as dec:
        dec.prefill(prompt)
        first = list(dec.generate(greedy_sampler(), 9))
        dec.prefill(prompt + first)
        rest = list(dec.generate(greedy_sampler(), N_GEN - 9))
        assert first + rest == ref
        dec.prefill(other)
        assert list(dec.generate(greedy_sampler(), N_GEN)) == ref_other
        dec.prefill(prompt[:-2])  # a cut inside the old prompt
        cut = list(dec.generate(greedy_sampler(), 12))
        assert cut == plain_generate(echo, prompt[:-2], 12)
        assert dec.stats.accepted == dec.stats.drafted


def test_combined_with_ngram_types(echo, references):
    for p in PROMPTS:
        prompt, ref = references[p]
        cfg = config(["ngram-simple", "draft-eagle3"], 4, draft_model_path=_draft("noisy"))
        got, st = spec_generate(echo, prompt, N_GEN, cfg)
        assert got == ref
        assert set(st.drafted_by) <= {"ngram-simple", "draft-eagle3"} and "draft-eagle3" in st.drafted_by


def test_an_adopted_target_stays_usable_after_close(echo):
    """Closing the decoder turns the target's layer outputs off and leaves the context open and right."""
    from llama_cpp._internals import LlamaBatch, LlamaContext
    from llama_cpp.speculative import make_decoder

    prompt = echo.tokenize(PROMPTS[0].encode(), add_special=True)
    ref = plain_generate(echo, prompt, 8)
    with LlamaContext(echo, **CTX) as target:
        dec = make_decoder(echo, _cfg("echo", 3), target=target)
        dec.prefill(prompt)
        list(dec.generate(dist_sampler(3), 8))
        dec.close()
        assert target.ctx is not None  # not the decoder's to close
        target.memory_clear(True)
        out = []
        with LlamaBatch(CTX["n_batch"], 0, 1) as b:
            toks = list(prompt)
            for i in range(8):
                b.clear()
                start = 0 if i == 0 else len(toks) - 1
                b.add_sequence(np.asarray(toks[start:], dtype=np.int32), 0, start, logits="last")
                target.decode(b)
                t = int(np.argmax(target.logits_ith(-1)))
                out.append(t)
                toks.append(t)
        assert out == ref


# -- errors before any native call -------------------------------------------------------------


def test_config_errors():
    with pytest.raises(SpeculativeError, match="needs a draft model"):
        SpecConfig("draft-eagle3")
    with pytest.raises(SpeculativeError, match="cannot be combined: llama.cpp runs every draft-"):
        SpecConfig(["draft-eagle3", "draft-mtp"], draft_model_path="x.gguf")
    with pytest.raises(SpeculativeError, match="at most one"):
        SpecConfig(["draft-simple", "draft-eagle3"], draft_model_path="x.gguf")
    with pytest.raises(SpeculativeError, match="draft_n_max"):
        SpecConfig("draft-eagle3", draft_model_path="x.gguf", draft_n_max=0)
    with pytest.raises(SpeculativeError, match="draft_p_min"):
        SpecConfig("draft-eagle3", draft_model_path="x.gguf", draft_p_min=1.5)


Llama = pytest.importorskip("llama_cpp.llama").Llama
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}


@pytest.mark.parametrize(("draft", "match"), [
    (lambda tmp: str(tmp / "missing.gguf"), "not a file"),
    (lambda tmp: str(fixture_path("draft_model")), "needs a draft whose general.architecture is 'eagle3'"),
    (lambda tmp: _draft(target_hidden_size=32), "hidden size 32"),
    (lambda tmp: _draft(target_layers="0,1,3"), "out of range"),
    (lambda tmp: _draft(target_layers="0,1"), "must list 3"),
])
def test_drafts_that_do_not_fit_fail_before_loading(tmp_path, monkeypatch, draft, match):
    import llama_cpp._internals as internals

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the check")

    path = draft(tmp_path)
    target = fixture_path("qwen35_mtp", form="echo")
    monkeypatch.setattr(internals.LlamaModel, "__init__", no_load)
    with pytest.raises(SpeculativeError, match=match):
        Llama(target, speculative=SpecConfig("draft-eagle3", draft_model_path=path), **KW)


def test_other_errors(echo, tmp_path):
    target = fixture_path("qwen35_mtp", form="echo")
    with pytest.raises(SpeculativeError, match="token .* is"):
        Llama(target, speculative=SpecConfig("draft-eagle3", draft_model_path=_draft(vocab="renamed")), **KW)
    with pytest.raises(SpeculativeError, match="spec_type='draft-eagle3'"):
        Llama(target, speculative=SpecConfig(draft_model_path=_draft()), **KW)
    with pytest.raises(SpeculativeError, match="n_batch=2 cannot hold"):
        Llama(target, speculative=_cfg("echo", 4), **dict(KW, n_batch=2, n_ubatch=2))
    from llama_cpp.speculative.eagle3 import check_draft_header

    with pytest.raises(SpeculativeError, match="'bert' graph does not export"):
        check_draft_header(_draft(), target_arch="bert")


# -- extended batches take the encoder width ---------------------------------------------------


def test_extended_batch_accepts_the_input_and_encoder_widths(echo):
    from llama_cpp._internals import LlamaContext, LlamaModel
    from llama_cpp.llama_batch import LlamaBatchExt

    with LlamaContext(echo, **CTX) as target, LlamaModel(_draft("feature")) as dm, \
            LlamaContext(dm, ctx_other=target, **CTX) as dctx, LlamaBatchExt(dctx) as b:
        assert (b.n_embd, b.n_embd_enc) == (64, 192)
        row = np.ones(64, dtype=np.float32)
        enc = np.ones(192, dtype=np.float32)
        with pytest.raises(ValueError, match="rows of 64 or 192"):
            b.add_embd(np.ones(100, dtype=np.float32), 0, 0)
        b.add_embd(enc, 0, 0, output=True)
        with pytest.raises(ValueError, match="differs from the batch's 192"):
            b.add_embd(row, 0, 1)
        b.add_embd(enc, 0, 1, output=True)
        dctx.process(b, encode=True)
        b.clear()
        idx = b.add_token(5, 0, 0, output=True)
        b.set_embd_token(idx, row)
        with pytest.raises(ValueError, match="differs"):
            b.add_token(6, 0, 1)
            b.set_embd_token(1, enc)
    with LlamaContext(echo, **CTX) as plain, LlamaBatchExt(plain) as b:
        assert b.n_embd == b.n_embd_enc == 64
        with pytest.raises(ValueError, match=r"takes rows of 64$"):
            b.add_embd(np.ones(192, dtype=np.float32), 0, 0)


# -- llama.cpp's own driver ----------------------------------------------------------------------


@pytest.mark.parametrize("form", ("echo", "noisy", "feature"))
@pytest.mark.parametrize("m", (2, 4))
def test_matches_llama_speculative_simple(echo, target_path, run_tool, form, m):
    """The same text as ``llama-speculative-simple --spec-type draft-eagle3 --temp 0``, and, driven as
    the tool drives it (``n_rs_seq`` snapshots, drafts cut to the budget, one step past ``-n``), the
    same drafts: as many, as many accepted, and the same acceptance at every draft position."""
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
                        "--spec-type", "draft-eagle3", "--spec-draft-n-max", m, "-lv", 4, "--temp", "0", "-p", p, "-n", n,
                        "-c", CTX["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                        complete=lambda out, k=len(p) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
        text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
        assert text.startswith(p) and text[len(p):].startswith(mine), (form, m, text[:200], mine[:200])
        n_drafts, n_acc, rates = tool_stats(proc.stderr, "draft-eagle3")
        assert st.drafted == tool_drafted_tokens(proc.stderr, "draft-eagle3"), str(st)
        assert (st.drafted_at[0], st.accepted) == (n_drafts, n_acc), (form, m, p, str(st))
        assert my_rates == [r for r in rates if r], (form, m, p)
        if form == "echo":
            assert st.accepted == st.drafted


# -- through Llama ---------------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say the cat sat on the mat, the cat sat on the mat"}]
PROMPT = "the cat sat on the mat and the dog sat on the log and the cat sat on the"


@pytest.fixture(scope="module")
def llamas():
    path = fixture_path("qwen35_mtp", form="echo")
    made = {"plain": Llama(path, **KW)}
    for form in ("echo", "feature"):
        made[form] = Llama(path, speculative=_cfg(form, 3), **KW)
    yield made
    for obj in made.values():
        obj.close()


def _text(resp) -> str:
    return resp["choices"][0]["text"]


@pytest.mark.parametrize("form", ("echo", "feature"))
def test_llama_completion_stream_and_sampling_equal_plain(llamas, form):
    plain, spec = llamas["plain"], llamas[form]
    for p in (PROMPT, "Once upon a time"):
        ref = plain.create_completion(p, max_tokens=24, temperature=0)
        got = spec.create_completion(p, max_tokens=24, temperature=0)
        assert _text(got) == _text(ref) and got["usage"] == ref["usage"]
        st = spec.last_speculative_stats
        assert st is not None and st.generated == got["usage"]["completion_tokens"] and st.drafted > 0
        assert set(st.drafted_by) == {"draft-eagle3"}
        if form == "echo":
            assert st.accepted == st.drafted
        chunks = list(spec.create_completion(p, max_tokens=24, temperature=0, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == _text(ref)
    kw = {"max_tokens": 20, "temperature": 0.8, "seed": 5, "repeat_penalty": 1.1, "logprobs": 2}
    ref, got = plain.create_completion(PROMPT, **kw), spec.create_completion(PROMPT, **kw)
    assert _text(got) == _text(ref)
    assert got["choices"][0]["logprobs"]["tokens"] == ref["choices"][0]["logprobs"]["tokens"]


@pytest.mark.parametrize("form", ("echo", "feature"))
def test_llama_chat_equals_plain(llamas, form):
    plain, spec = llamas["plain"], llamas[form]
    msgs = list(MESSAGES)
    for _turn in range(2):
        ref = plain.create_chat_completion(msgs, max_tokens=16, temperature=0)
        got = spec.create_chat_completion(msgs, max_tokens=16, temperature=0)
        assert got["choices"][0]["message"] == ref["choices"][0]["message"]
        streamed = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in spec.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
        assert streamed == ref["choices"][0]["message"]["content"]
        msgs = msgs + [ref["choices"][0]["message"], {"role": "user", "content": "Again, the cat sat on the mat"}]


@pytest.mark.parametrize("form", ("echo", "feature"))
def test_llama_grammar_constrained_equals_plain(llamas, form):
    """Drafts the grammar forbids are rejected; the grammar sees only emitted tokens."""
    plain, spec = llamas["plain"], llamas[form]
    check_grammar_completions(plain, spec, PROMPT)


@pytest.mark.parametrize("form", ("echo", "feature"))
def test_llama_state_save_load(llamas, form):
    """After a restored state the drafter gets the features of the restored positions back (the
    echo draft keeps accepting everything)."""
    spec = llamas[form]
    spec.create_completion(PROMPT, max_tokens=11, temperature=0)
    state = spec.save_state()
    assert state.speculative is not None
    follow = PROMPT + " cat"
    a = spec.create_completion(follow, max_tokens=20, temperature=0)
    spec.create_completion("something unrelated", max_tokens=5, temperature=0)
    spec.load_state(state)
    b = spec.create_completion(follow, max_tokens=20, temperature=0)
    assert _text(a) == _text(b)
    st = spec.last_speculative_stats
    assert st.drafted > 0 and (form != "echo" or st.accepted == st.drafted), str(st)


def test_row_store_keeps_what_pairing_needs():
    from llama_cpp.speculative.features import RowStore

    st = RowStore(2, margin=4)
    st.put(0, np.arange(12, dtype=np.float32).reshape(6, 2), [10, 11, 12, 13, 14, 15])
    assert st.first_miss([10, 11, 12, 13, 14, 15], 0, 6) is None
    assert st.first_miss([10, 11, 99, 13], 0, 4) == 2
    assert st.first_miss([10, 11, 12, 13, 14, 15, 16], 0, 7) == 6  # never stored
    st.put(3, np.ones((1, 2), dtype=np.float32), [7])  # a decode at 3 drops 4 and 5
    assert st.n == 4 and st.first_miss([10, 11, 12, 7, 14], 0, 5) == 4
    st.put(6, np.zeros((1, 2), dtype=np.float32), [8])  # a gap at 4, 5
    assert st.first_miss([10, 11, 12, 7, 14, 15, 8], 3, 7) == 4
    assert st.first_miss([10, 11, 12, 7, 14, 15, 8], 6, 7) is None
    st.forget(7)  # keeps 3.. (margin 4): shifts once half the rows are behind
    assert st.base == 3 and st.first_miss([10, 11, 12, 7], 2, 4) == 2
    np.testing.assert_array_equal(st.get(3, 4), np.ones((1, 2)))


def test_a_rewind_deeper_than_the_kept_rows_decodes_the_target_again(echo):
    """With 8 rows kept, cutting a long history far back re-derives the features: the drafts are
    those of a fresh decoder on the same prompt."""
    from llama_cpp.speculative import make_decoder

    from .util import greedy_sampler

    prompt = echo.tokenize((" ".join([PROMPTS[0], PROMPTS[1]] * 2)).encode(), add_special=True)
    cut = prompt[:12]
    cfg = _cfg("feature", 4)
    with make_decoder(echo, cfg, ctx_params=dict(CTX)) as fresh:
        fresh.prefill(cut)
        want = list(fresh.generate(greedy_sampler(), N_GEN))
        want_counts = (fresh.stats.drafted, fresh.stats.accepted)
    with make_decoder(echo, cfg, ctx_params=dict(CTX)) as dec:
        dec.drafters[0]._rows.margin = 8
        dec.prefill(prompt)
        list(dec.generate(greedy_sampler(), 40))
        assert dec.drafters[0]._rows.base > len(cut)  # the rows the cut needs were let go
        dec.prefill(cut)
        before = (dec.stats.drafted, dec.stats.accepted)
        assert list(dec.generate(greedy_sampler(), N_GEN)) == want
        assert (dec.stats.drafted - before[0], dec.stats.accepted - before[1]) == want_counts


@pytest.mark.parametrize("m", (2, 4))
def test_layer_n_layer_is_the_targets_output_state(echo, target_path, run_tool, m):
    """A draft may name layer ``n_layer`` (here 2): the target's final hidden state, read as llama.cpp
    reads it (its NextN output). Same text and drafts as the tool; greedy output equals plain."""
    from llama_cpp.speculative import make_decoder

    from ._tool import drive_like_tool, tool_drafted_tokens, tool_stats

    assert echo.n_layer() == 2
    n, draft = 32, _draft("feature", target_layers="0,1,2")
    p = "Once upon a time there was"
    prompt = echo.tokenize(p.encode(), add_special=True, parse_special=True)
    cfg = SpecConfig("draft-eagle3", draft_model_path=draft, draft_n_max=m, n_rs_seq=m)
    with make_decoder(echo, cfg, ctx_params=dict(CTX)) as dec:
        got, my_rates = drive_like_tool(dec, prompt, n)
        st = dec.stats
    assert got[:n] == plain_generate(echo, prompt, n)
    mine = echo.detokenize(got[:n]).decode("utf-8", errors="replace")
    proc = run_tool("llama-speculative-simple", "-m", target_path("echo"), "-md", draft,
                    "--spec-type", "draft-eagle3", "--spec-draft-n-max", m, "-lv", 4, "--temp", "0", "-p", p, "-n", n,
                    "-c", CTX["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                    complete=lambda out, k=len(p) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
    text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
    assert text.startswith(p) and text[len(p):].startswith(mine), (m, text[:200], mine[:200])
    n_drafts, n_acc, rates = tool_stats(proc.stderr, "draft-eagle3")
    assert st.drafted == tool_drafted_tokens(proc.stderr, "draft-eagle3"), str(st)
    assert (st.drafted_at[0], st.accepted) == (n_drafts, n_acc), (m, str(st))
    assert my_rates == [r for r in rates if r]


def test_a_failed_prefill_leaves_the_decoder_usable(echo, monkeypatch):
    """A drafter's observer failing after the target decoded a prefill chunk: the next prefill starts
    from a clear target memory instead of decoding over positions it already holds."""
    from llama_cpp.speculative import make_decoder
    from llama_cpp.speculative.eagle3 import Eagle3Drafter

    from .util import greedy_sampler

    real, fail = Eagle3Drafter.observe, {"now": True}

    def observe(self, tokens, pos0):
        if fail["now"]:
            fail["now"] = False
            raise RuntimeError("observer failed")
        return real(self, tokens, pos0)

    monkeypatch.setattr(Eagle3Drafter, "observe", observe)
    prompt = echo.tokenize(PROMPTS[1].encode(), add_special=True)
    with make_decoder(echo, _cfg("echo", 3), ctx_params=dict(CTX)) as dec:
        with pytest.raises(RuntimeError, match="observer failed"):
            dec.prefill(prompt)
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), N_GEN))
    assert got == plain_generate(echo, prompt, N_GEN)

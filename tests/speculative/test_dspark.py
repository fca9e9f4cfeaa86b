"""``draft-dspark`` (DFlash with a Markov head, anchor-first blocks) on the ``qwen35_mtp`` echo
target: plain decoding's tokens, acceptance where the construction puts it, llama.cpp's drafts."""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.speculative import SpecConfig

from .util import CTX, N_GEN, PROMPTS, dist_sampler, plain_generate, spec_generate

#: name -> fixture parameters: the successor chain (always), blurred (partial), no bias (the first
#: token only), a head that only names a byte token (never)
DRAFTS = {"chain": {"markov": "chain"}, "blurred": {"markov": "chain", "markov_noise": 0.3},
          "first": {"markov": "zero"}, "constant": {"form": "constant", "markov": "zero"}}
#: the chain with a confidence head (draft_p_min 0.5 stops on it): always above, always below, varying
CONFIDENT = {"high": {"markov": "chain", "confidence": "high"}, "low": {"markov": "chain", "confidence": "low"},
             "mixed": {"markov": "chain", "confidence": "mixed"}}


def _draft(name: str) -> str:
    kw = dict(DRAFTS.get(name) or CONFIDENT[name])
    return str(fixture_path("dflash_draft", form=kw.pop("form", "first"), **kw))


def _cfg(name: str, n: int, **kw) -> SpecConfig:
    return SpecConfig("draft-dspark", draft_model_path=_draft(name), draft_n_max=n, **kw)


@pytest.mark.parametrize("name", DRAFTS)
@pytest.mark.parametrize("n", (1, 4, 16))
def test_greedy_equals_plain_and_acceptance_lands_where_built(echo, references, name, n):
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, _cfg(name, n))
        assert got == ref, (name, n, p)
        assert set(st.drafted_by) == {"draft-dspark"} and st.drafted > 0 and len(st.drafted_at) <= n
        if name == "chain":
            assert st.accepted == st.drafted, str(st)
        elif name == "first":
            assert st.accepted_at[0] == st.drafted_at[0] and sum(st.accepted_at[1:]) == 0, str(st)
        elif name == "constant":
            assert st.accepted == 0, str(st)
        elif n > 1:
            assert 0 < st.accepted < st.drafted, str(st)


def test_anchor_first_drafts_a_whole_block(echo, references):
    """With the anchor row drafting, block_size 16 allows 16 draft tokens (DFlash: 15)."""
    from llama_cpp.speculative import make_decoder

    prompt, ref = references[PROMPTS[0]]
    with make_decoder(echo, _cfg("chain", 40), ctx_params=dict(CTX)) as dec:
        assert dec.drafters[0].n_max == 16
        dec.prefill(prompt)
        from .util import greedy_sampler

        assert list(dec.generate(greedy_sampler(), N_GEN)) == ref
        assert dec.stats.drafted_at[15] > 0 and dec.stats.accepted == dec.stats.drafted


@pytest.mark.parametrize("n_rs_seq", (0, 4))
def test_seeded_sampling_and_rollbacks_equal_plain(echo, references, n_rs_seq):
    prompt = references[PROMPTS[1]][0]
    for seed in (1, 7):
        ref = plain_generate(echo, prompt, N_GEN, dist_sampler(seed))
        got, _ = spec_generate(echo, prompt, N_GEN, _cfg("blurred", 4, n_rs_seq=n_rs_seq), dist_sampler(seed))
        assert got == ref, (seed, n_rs_seq)


Llama = pytest.importorskip("llama_cpp.llama").Llama
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}


def test_llama_completion_stream_and_chat_equal_plain():
    path = fixture_path("qwen35_mtp", form="echo")
    msgs = [{"role": "user", "content": "Say the cat sat on the mat"}]
    with Llama(path, **KW) as plain, Llama(path, speculative=_cfg("chain", 4), **KW) as spec:
        for p in ("the cat sat on the mat and the dog", "Once upon a time"):
            ref = plain.create_completion(p, max_tokens=24, temperature=0)["choices"][0]["text"]
            assert spec.create_completion(p, max_tokens=24, temperature=0)["choices"][0]["text"] == ref
            st = spec.last_speculative_stats
            assert st.drafted > 0 and st.accepted == st.drafted
            assert "".join(c["choices"][0]["text"]
                           for c in spec.create_completion(p, max_tokens=24, temperature=0, stream=True)) == ref
        ref = plain.create_chat_completion(msgs, max_tokens=16, temperature=0)["choices"][0]["message"]
        assert spec.create_chat_completion(msgs, max_tokens=16, temperature=0)["choices"][0]["message"] == ref


def test_errors_before_loading(monkeypatch):
    import llama_cpp._internals as internals

    target = fixture_path("qwen35_mtp", form="echo")
    dflash = str(fixture_path("dflash_draft"))
    with pytest.raises(SpeculativeError, match="needs a draft model"):
        SpecConfig("draft-dspark")
    with pytest.raises(SpeculativeError, match="without a Markov head.*spec_type='draft-dflash'"):
        Llama(target, speculative=SpecConfig("draft-dspark", draft_model_path=dflash), **KW)
    with pytest.raises(SpeculativeError, match="is a DSpark draft.*spec_type='draft-dspark'"):
        Llama(target, speculative=SpecConfig("draft-dflash", draft_model_path=_draft("chain")), **KW)

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the check")

    monkeypatch.setattr(internals.LlamaModel, "__init__", no_load)
    with pytest.raises(SpeculativeError, match="Markov head"):
        Llama(target, speculative=SpecConfig("draft-dspark", draft_model_path=dflash), **KW)


@pytest.mark.parametrize("name", CONFIDENT)
def test_p_min_stops_on_the_confidence_head(echo, references, name):
    for p in PROMPTS:
        prompt, ref = references[p]
        got, st = spec_generate(echo, prompt, N_GEN, _cfg(name, 4, draft_p_min=0.5))
        assert got == ref, (name, p)
        if name == "high":  # as without a threshold
            _, st0 = spec_generate(echo, prompt, N_GEN, _cfg("chain", 4))
            assert (st.drafted, st.accepted) == (st0.drafted, st0.accepted) and st.accepted == st.drafted
        elif name == "low":
            assert st.drafted == 0
        else:
            assert 0 < st.drafted < 4 * st.steps and st.accepted == st.drafted, str(st)


def test_p_min_needs_a_confidence_head(echo):
    from llama_cpp.speculative import make_decoder

    with pytest.raises(SpeculativeError, match="no confidence head"):
        make_decoder(echo, _cfg("chain", 4, draft_p_min=0.5), ctx_params=dict(CTX))


@pytest.mark.parametrize("name", ("chain", "blurred", "first", "mixed"))
@pytest.mark.parametrize("m", (2, 4))
def test_matches_llama_speculative_simple(echo, target_path, run_tool, name, m):
    """The tool's text and, driven as the tool drives it, the same drafts and acceptance per position."""
    from llama_cpp.speculative import make_decoder

    from ._tool import drive_like_tool, tool_drafted_tokens, tool_stats

    n = 32
    draft = _draft(name)
    for p in ("Once upon a time there was", "the cat sat on the mat and the dog sat on the"):
        prompt = echo.tokenize(p.encode(), add_special=True, parse_special=True)
        p_min = 0.5 if name in CONFIDENT else 0.0
        with make_decoder(echo, _cfg(name, m, n_rs_seq=m, draft_p_min=p_min), ctx_params=dict(CTX)) as dec:
            got, my_rates = drive_like_tool(dec, prompt, n)
            st = dec.stats
        mine = echo.detokenize(got[:n]).decode("utf-8", errors="replace")
        proc = run_tool("llama-speculative-simple", "-m", target_path("echo"), "-md", draft,
                        "--spec-type", "draft-dspark", "--spec-draft-n-max", m, "--spec-draft-p-min", p_min,
                        "-lv", 4, "--temp", "0", "-p", p,
                        "-n", n, "-c", CTX["n_ctx"], "-t", 1, "-tb", 1, "--seed", 1,
                        complete=lambda out, k=len(p) + len(mine.strip()): len(out.decode(errors="replace").strip()) >= k)
        text = proc.stdout.decode("utf-8", errors="replace").lstrip("\n")
        assert text.startswith(p) and text[len(p):].startswith(mine), (name, m, text[:200], mine[:200])
        n_drafts, n_acc, rates = tool_stats(proc.stderr, "draft-dspark")
        assert st.drafted == tool_drafted_tokens(proc.stderr, "draft-dspark"), str(st)
        assert (st.drafted_at[0], st.accepted) == (n_drafts, n_acc), (name, m, p, str(st))
        assert my_rates == [r for r in rates if r], (name, m, p)


@pytest.mark.parametrize("name", ("chain", "blurred"))
def test_llama_grammar_constrained_equals_plain(name):
    """draft-dspark under a grammar: drafts the grammar forbids are rejected, the output is plain
    decoding's (greedy and seeded)."""
    path = fixture_path("qwen35_mtp", form="echo")
    grammar = 'root ::= (" the" | " cat" | " sat" | " on" | " mat")+'
    prompt = "the cat sat on the mat and the dog sat on the log and the cat sat on the"
    with Llama(path, **KW) as plain, Llama(path, speculative=_cfg(name, 4), **KW) as spec:
        for temp, seed in ((0, None), (0.9, 3)):
            ref = plain.create_completion(prompt, max_tokens=20, temperature=temp, seed=seed, grammar=grammar)
            got = spec.create_completion(prompt, max_tokens=20, temperature=temp, seed=seed, grammar=grammar)
            assert got["choices"][0]["text"] == ref["choices"][0]["text"]
            words = got["choices"][0]["text"].split()
            assert words and set(words[:-1]) <= {"the", "cat", "sat", "on", "mat"}
            st = spec.last_speculative_stats
            assert st.drafted > 0 and set(st.drafted_by) == {"draft-dspark"}

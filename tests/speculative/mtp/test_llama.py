"""``Llama(model_path, speculative=SpecConfig(...))``: completion and chat, streaming too, unchanged."""

from __future__ import annotations

import inspect

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.speculative import SpecConfig, SpeculativeStats

from .util import GRAMMAR, PROMPTS, check_grammar_completions

llama_mod = pytest.importorskip("llama_cpp.llama")
Llama = llama_mod.Llama
if "speculative" not in inspect.signature(Llama.__init__).parameters:
    pytest.skip("Llama has no speculative= parameter yet (integration pending)", allow_module_level=True)

KW = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def pair():
    """(plain, speculative) Llama per form, created on demand."""
    made: dict = {}

    def get(form: str, draft_n_max: int = 4, **cfg):
        key = (form, draft_n_max, tuple(sorted(cfg.items())))
        if key not in made:
            path = fixture_path("qwen35_mtp", form=form)
            plain = made.get((form, "plain")) or Llama(path, **KW)
            made[form, "plain"] = plain
            made[key] = Llama(path, speculative=SpecConfig(draft_n_max=draft_n_max, **cfg), **KW)
        return made[form, "plain"], made[key]

    yield get
    for obj in made.values():
        obj.close()


def _text(resp) -> str:
    return resp["choices"][0]["text"]


@pytest.mark.parametrize("form", ("echo", "noisy", "random"))
def test_completion_equals_plain(pair, form):
    plain, spec = pair(form)
    for p in PROMPTS:
        ref = plain.create_completion(p, max_tokens=24, temperature=0)
        got = spec.create_completion(p, max_tokens=24, temperature=0)
        assert _text(got) == _text(ref)
        assert got["usage"] == ref["usage"]
        st = spec.last_speculative_stats
        assert isinstance(st, SpeculativeStats) and st.generated == got["usage"]["completion_tokens"]
        assert 0 <= st.accepted <= st.drafted
        if form == "echo":
            assert st.acceptance_rate == 1.0
        if form == "random":
            assert st.acceptance_rate < 0.05
        chunks = list(spec.create_completion(p, max_tokens=24, temperature=0, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == _text(ref)


@pytest.mark.parametrize("form", ("echo", "noisy"))
def test_chat_and_continuation_equal_plain(pair, form):
    plain, spec = pair(form, draft_n_max=3)
    msgs = list(MESSAGES)
    for _turn in range(2):
        ref = plain.create_chat_completion(msgs, max_tokens=16, temperature=0)
        got = spec.create_chat_completion(msgs, max_tokens=16, temperature=0)
        assert got["choices"][0]["message"] == ref["choices"][0]["message"]
        streamed = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in spec.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
        assert streamed == ref["choices"][0]["message"]["content"]
        msgs = msgs + [ref["choices"][0]["message"], {"role": "user", "content": "And then what"}]


def test_sampling_logprobs_and_penalties_equal_plain(pair):
    plain, spec = pair("noisy")
    kw = {"max_tokens": 20, "temperature": 0.8, "seed": 5, "repeat_penalty": 1.1, "logprobs": 2}
    ref = plain.create_completion(PROMPTS[0], **kw)
    got = spec.create_completion(PROMPTS[0], **kw)
    assert _text(got) == _text(ref)
    assert got["choices"][0]["logprobs"]["tokens"] == ref["choices"][0]["logprobs"]["tokens"]
    assert got["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        ref["choices"][0]["logprobs"]["token_logprobs"], abs=1e-4)


def test_state_save_load_with_mtp(pair):
    _, spec = pair("noisy", draft_n_max=4, n_rs_seq=1)
    spec.create_completion(PROMPTS[1], max_tokens=11, temperature=0)
    state = spec.save_state()
    assert state.speculative is not None
    follow = PROMPTS[1] + " and more"
    a = spec.create_completion(follow, max_tokens=20, temperature=0)
    spec.create_completion("something unrelated", max_tokens=5, temperature=0)
    spec.load_state(state)
    b = spec.create_completion(follow, max_tokens=20, temperature=0)
    assert _text(a) == _text(b)


def test_eval_then_generate_stays_correct(pair):
    plain, spec = pair("noisy")
    toks = spec.tokenize(PROMPTS[2].encode())
    spec.reset()
    spec.eval(toks[:3])  # decoded outside the MTP decoder: it must start over
    got = list(zip(range(12), spec.generate(toks, temp=0)))
    ref = list(zip(range(12), plain.generate(toks, temp=0)))
    assert got == ref


def test_errors_before_loading():
    spm = fixture_path("llama_spm")
    with pytest.raises(SpeculativeError, match="no NextN"):
        Llama(spm, speculative=SpecConfig(), **KW)
    mtp = fixture_path("qwen35_mtp", form="echo")
    with pytest.raises(SpeculativeError, match="n_batch"):
        Llama(mtp, speculative=SpecConfig(draft_n_max=8), **dict(KW, n_batch=4, n_ubatch=4))
    with pytest.raises(SpeculativeError, match="embeddings"):
        Llama(mtp, speculative=SpecConfig(), embedding=True, **KW)
    with pytest.raises(TypeError, match="SpecConfig"):
        Llama(mtp, speculative={"draft_n_max": 2}, **KW)
    with Llama(mtp, speculative=SpecConfig("none", draft_n_max=0), **KW) as off:  # disabled: plain
        assert off.create_completion(PROMPTS[0], max_tokens=4, temperature=0)["usage"]["completion_tokens"] == 4
        assert off.last_speculative_stats is None


@pytest.mark.parametrize("form", ("echo", "noisy"))
def test_grammar_constrained_equals_plain(pair, form):
    """Single-head draft-mtp under a grammar: drafts the grammar forbids are rejected (the grammar
    sees emitted tokens only); greedy and seeded output are plain decoding's."""
    plain, spec = pair(form)
    assert spec.sequence.spec.n_heads == 1
    prompt = "the cat sat on the mat and the dog sat on the log and the cat sat on the"

    def drafted_by_mtp_and_streamed(temp, seed, text) -> None:
        st = spec.last_speculative_stats
        assert st.drafted > 0 and set(st.drafted_by) == {"draft-mtp"}
        streamed = "".join(c["choices"][0]["text"] for c in spec.create_completion(
            prompt, max_tokens=20, temperature=temp, seed=seed, grammar=GRAMMAR, stream=True))
        assert streamed == text

    check_grammar_completions(plain, spec, prompt, drafted_by_mtp_and_streamed)

"""``Llama(path, speculative=SpecConfig(<n-gram type or draft model>))``: completion, chat,
streaming, grammar-constrained sampling and state, with the same output as plain decoding."""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.speculative import SpecConfig

from .util import NGRAM_TYPES, SMALL, check_grammar_completions

Llama = pytest.importorskip("llama_cpp.llama").Llama

KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say the cat sat on the mat, the cat sat on the mat"}]
PROMPT = "the cat sat on the mat and the dog sat on the log and the cat sat on the"
TARGETS = {"bpe": ("llama_bpe", {}), "echo": ("qwen35_mtp", {"form": "echo"})}


def _cfg(kind: str) -> SpecConfig:
    if kind == "draft-simple":
        return SpecConfig(draft_model_path=str(fixture_path("draft_model", form="noisy")), draft_n_max=3)
    if kind == "combined":
        return SpecConfig(["ngram-simple", "ngram-cache", "draft-simple"], draft_n_max=3,
                          draft_model_path=str(fixture_path("draft_model", form="echo")), **SMALL)
    return SpecConfig(kind, **SMALL)


KINDS = NGRAM_TYPES + ("draft-simple", "combined")


@pytest.fixture(scope="module")
def pair():
    made: dict = {}

    def get(target: str, kind: str):
        name, kw = TARGETS[target]
        path = fixture_path(name, **kw)
        if (target, "plain") not in made:
            made[target, "plain"] = Llama(path, **KW)
        if (target, kind) not in made:
            made[target, kind] = Llama(path, speculative=_cfg(kind), **KW)
        return made[target, "plain"], made[target, kind]

    yield get
    for obj in made.values():
        obj.close()


def _text(resp) -> str:
    return resp["choices"][0]["text"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", KINDS)
def test_completion_and_stream_equal_plain(pair, target, kind):
    plain, spec = pair(target, kind)
    for p in (PROMPT, "Once upon a time"):
        ref = plain.create_completion(p, max_tokens=24, temperature=0)
        got = spec.create_completion(p, max_tokens=24, temperature=0)
        assert _text(got) == _text(ref) and got["usage"] == ref["usage"]
        st = spec.last_speculative_stats
        assert st is not None and st.generated == got["usage"]["completion_tokens"]
        chunks = list(spec.create_completion(p, max_tokens=24, temperature=0, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == _text(ref)
    kw = {"max_tokens": 20, "temperature": 0.8, "seed": 5, "repeat_penalty": 1.1, "logprobs": 2}
    ref, got = plain.create_completion(PROMPT, **kw), spec.create_completion(PROMPT, **kw)
    assert _text(got) == _text(ref)
    assert got["choices"][0]["logprobs"]["tokens"] == ref["choices"][0]["logprobs"]["tokens"]


@pytest.mark.parametrize("kind", NGRAM_TYPES + ("draft-simple", "combined"))
def test_chat_equals_plain(pair, kind):
    plain, spec = pair("echo", kind)
    msgs = list(MESSAGES)
    for _turn in range(2):
        ref = plain.create_chat_completion(msgs, max_tokens=16, temperature=0)
        got = spec.create_chat_completion(msgs, max_tokens=16, temperature=0)
        assert got["choices"][0]["message"] == ref["choices"][0]["message"]
        streamed = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in spec.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
        assert streamed == ref["choices"][0]["message"]["content"]
        st = spec.last_speculative_stats  # the chat ran through the speculative decoder
        assert st is not None and st.generated == got["usage"]["completion_tokens"]
        assert set(st.drafted_by) <= {t.value for t in spec.speculative.types}
        msgs = msgs + [ref["choices"][0]["message"], {"role": "user", "content": "Again, the cat sat on the mat"}]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ("ngram-simple", "ngram-mod", "draft-simple"))
def test_grammar_constrained_equals_plain(pair, target, kind):
    """Drafts of tokens the grammar forbids are rejected; the grammar sees only emitted tokens."""
    plain, spec = pair(target, kind)
    check_grammar_completions(plain, spec, PROMPT)


@pytest.mark.parametrize("kind", ("ngram-map-k", "draft-simple"))
def test_state_save_load(pair, kind):
    _, spec = pair("echo", kind)
    spec.create_completion(PROMPT, max_tokens=11, temperature=0)
    state = spec.save_state()
    assert state.speculative is not None
    follow = PROMPT + " cat"
    a = spec.create_completion(follow, max_tokens=20, temperature=0)
    spec.create_completion("something unrelated", max_tokens=5, temperature=0)
    spec.load_state(state)
    b = spec.create_completion(follow, max_tokens=20, temperature=0)
    assert _text(a) == _text(b)


def test_eval_then_generate_stays_correct(pair):
    plain, spec = pair("echo", "ngram-simple")
    toks = spec.tokenize(PROMPT.encode())
    spec.reset()
    spec.eval(toks[:3])
    got = list(zip(range(12), spec.generate(toks, temp=0)))
    ref = list(zip(range(12), plain.generate(toks, temp=0)))
    assert got == ref


@pytest.mark.parametrize("form", ("echo", "noisy"))
def test_ngram_with_mtp_through_llama(form):
    """A combined list with draft-mtp loads the NextN layers; n-gram drafts go first."""
    path = fixture_path("qwen35_mtp", form=form)
    with Llama(path, **KW) as plain, \
            Llama(path, speculative=SpecConfig(["ngram-simple", "draft-mtp"], draft_n_max=3, **SMALL), **KW) as spec:
        for p in (PROMPT, "Once upon a time"):
            ref = plain.create_completion(p, max_tokens=24, temperature=0)
            got = spec.create_completion(p, max_tokens=24, temperature=0)
            assert _text(got) == _text(ref)
            st = spec.last_speculative_stats
            assert set(st.drafted_by) <= {"ngram-simple", "draft-mtp"} and st.drafted > 0
            if form == "echo" and "draft-mtp" in st.drafted_by:  # the echo MTP head is always right
                assert st.accepted_by["draft-mtp"] == st.drafted_by["draft-mtp"]


def test_errors_before_loading(tmp_path):
    bpe = fixture_path("llama_bpe")
    with pytest.raises(SpeculativeError, match="not a file"):
        Llama(bpe, speculative=SpecConfig(draft_model_path=str(tmp_path / "none.gguf")), **KW)
    with pytest.raises(SpeculativeError, match="needs a draft model"):
        Llama(bpe, speculative=SpecConfig("draft-dspark"), **KW)
    with pytest.raises(SpeculativeError, match="BOS"):
        Llama(bpe, speculative=SpecConfig(draft_model_path=str(fixture_path("draft_model", vocab="bos"))), **KW)
    with pytest.raises(SpeculativeError, match="no NextN"):
        Llama(bpe, speculative=SpecConfig("ngram-simple,draft-mtp"), **KW)

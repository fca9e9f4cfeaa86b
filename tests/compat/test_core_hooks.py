"""``logits_processor`` and ``stopping_criteria`` as upstream passes them: NumPy arrays, per token,
in completion, streaming, ``generate`` and chat; a misbehaving hook is a clear error."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from llama_cpp import Llama, LogitsProcessorList, MinTokensLogitsProcessor, StoppingCriteriaList
from llama_cpp._errors import CallbackError

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(spm_model):
    with Llama(spm_model, n_ctx=128, n_threads=1, verbose=False) as m:
        yield m


def force(token: int):
    def processor(input_ids, scores):
        scores[:] = -np.inf
        scores[token] = 0.0
        return scores
    return processor


def text_of(r):
    return r["choices"][0]["text"]


def test_processor_sees_numpy_history_and_scores(llm):
    seen = []

    def spy(input_ids, scores):
        seen.append((input_ids.dtype, input_ids.copy(), scores.dtype, scores.shape))
        return scores

    prompt = llm.tokenize(PROMPT.encode())
    r = llm.create_completion(prompt, max_tokens=5, temperature=0, logits_processor=LogitsProcessorList([spy]))
    assert len(seen) == r["usage"]["completion_tokens"] + (r["choices"][0]["finish_reason"] == "stop")
    assert all(d == np.intc and sd == np.single and shape == (llm.n_vocab(),) for d, _, sd, shape in seen)
    assert seen[0][1].tolist() == prompt
    for i in range(1, len(seen)):  # the history grows by the token just picked
        assert seen[i][1][:-1].tolist() == seen[i - 1][1].tolist()


def test_identity_processor_changes_nothing(llm):
    plain = text_of(llm(PROMPT, max_tokens=12, temperature=0))
    assert text_of(llm(PROMPT, max_tokens=12, temperature=0, logits_processor=lambda ids, s: s)) == plain


def test_forcing_processor_everywhere(llm):
    tok = llm.tokenize(b" fox", add_bos=False)[-1]
    piece = llm.detokenize([tok]).decode()
    lp = LogitsProcessorList([force(tok)])
    assert text_of(llm(PROMPT, max_tokens=3, temperature=0.8, logits_processor=lp)) == piece * 3
    streamed = "".join(text_of(c) for c in llm(PROMPT, max_tokens=3, stream=True, logits_processor=lp))
    assert streamed == piece * 3
    gen = list(itertools.islice(llm.generate(llm.tokenize(PROMPT.encode()), logits_processor=lp), 3))
    assert gen == [tok] * 3
    chat = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=3, logits_processor=lp)
    assert chat["choices"][0]["message"]["content"] == piece * 3
    chunks = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=3, logits_processor=lp,
                                        stream=True)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == piece * 3


def test_processor_runs_before_the_grammar(llm):
    with_a = np.array([b"a" in llm.detokenize([t]) for t in range(llm.n_vocab())])

    def no_a(input_ids, scores):
        scores[with_a] = -np.inf
        return scores

    r = llm(PROMPT, max_tokens=4, temperature=0, grammar='root ::= "a" | "b"', logits_processor=no_a)
    assert text_of(r) == "b"


def test_processor_leaving_the_grammar_nothing_is_an_error(llm):
    from llama_cpp._errors import GrammarError

    with pytest.raises(GrammarError, match="grammar allows"):  # not an abort inside llama.cpp
        llm(PROMPT, max_tokens=4, grammar='root ::= "a" | "b"', logits_processor=force(llm.token_eos()))
    with pytest.raises(GrammarError, match="grammar allows"):
        bias = {t: float("-inf") for t in range(llm.n_vocab()) if llm.detokenize([t]) in (b"a", b"b")}
        llm(PROMPT, max_tokens=4, grammar='root ::= "a" | "b"', logit_bias=bias)


def test_min_tokens_processor(llm):
    eos = llm.token_eos()

    def prefer_eos(input_ids, scores):
        scores[eos] = scores.max() + 100.0
        return scores

    r = llm(PROMPT, max_tokens=6, temperature=0,
            logits_processor=LogitsProcessorList([prefer_eos, MinTokensLogitsProcessor(3, eos)]))
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "stop"


def test_stopping_criteria_stop_before_the_token(llm):
    prompt = llm.tokenize(PROMPT.encode())
    free = llm.create_completion(prompt, max_tokens=10, temperature=0)
    seen = []

    def after_three(input_ids, logits):
        seen.append((input_ids.dtype, len(input_ids), logits.dtype, logits.shape))
        return len(input_ids) >= len(prompt) + 4  # true when the 4th new token arrives

    r = llm.create_completion(prompt, max_tokens=10, temperature=0, stopping_criteria=StoppingCriteriaList([after_three]))
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 3
    assert free["choices"][0]["text"].startswith(r["choices"][0]["text"])
    assert [n for _, n, _, _ in seen] == [len(prompt) + i for i in range(1, 5)]
    assert all(d == np.intc and ld == np.single and shape == (llm.n_vocab(),) for d, _, ld, shape in seen)
    gen = list(llm.generate(prompt, temp=0, stopping_criteria=StoppingCriteriaList([after_three])))
    assert len(gen) == 3
    streamed = list(llm(prompt, max_tokens=10, temperature=0, stream=True, stopping_criteria=after_three))
    assert streamed[-1]["choices"][0]["finish_reason"] == "stop"


def test_criterion_in_chat(llm):
    chat = llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=6, temperature=0,
                                      stopping_criteria=[lambda ids, logits: True])
    assert chat["choices"][0]["message"]["content"] == "" and chat["usage"]["completion_tokens"] == 0
    assert chat["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(("hook", "message"), [
    (lambda ids, s: 1 / 0, "raised ZeroDivisionError"),
    (lambda ids, s: None, "returned None"),
    (lambda ids, s: s[:10], "shape"),
    (lambda ids, s: "nope", "not an array"),
])
def test_bad_processor_is_a_clear_error(llm, hook, message):
    with pytest.raises(CallbackError, match=message) as info:
        llm(PROMPT, max_tokens=3, logits_processor=hook)
    assert "logits_processor" in str(info.value)
    if "raised" in message:
        assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert text_of(llm(PROMPT, max_tokens=2, temperature=0))  # the object is usable afterwards


@pytest.mark.parametrize("result", [None, 1, "yes", np.array([True])])
def test_non_bool_criterion_is_a_clear_error(llm, result):
    with pytest.raises(CallbackError, match="must return a bool"):
        llm(PROMPT, max_tokens=3, stopping_criteria=lambda ids, logits: result)


def test_processor_ruling_out_every_token_is_an_error(llm):
    with pytest.raises(CallbackError, match="every token at -inf"):
        llm(PROMPT, max_tokens=2, logits_processor=lambda ids, s: np.full_like(s, -np.inf))


def test_numpy_bool_criterion_is_fine(llm):
    r = llm(PROMPT, max_tokens=3, temperature=0, stopping_criteria=lambda ids, logits: np.bool_(False))
    assert r["choices"][0]["finish_reason"] == "length"


def test_not_callable_hook_is_type_error(llm):
    with pytest.raises(TypeError, match="logits_processor must be a callable"):
        llm(PROMPT, max_tokens=1, logits_processor=[42])
    with pytest.raises(TypeError, match="stopping_criteria must be a callable"):
        llm(PROMPT, max_tokens=1, stopping_criteria="stop")


def test_sample_with_processor(llm):
    toks = llm.tokenize(PROMPT.encode())
    llm.reset()
    llm.eval(toks)
    assert llm.sample(temp=0, logits_processor=force(7)) == 7


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300, "big"])
def test_logit_bias_that_c_cannot_take_is_refused(llm, value):
    from llama_cpp._errors import ParameterError

    with pytest.raises(ParameterError, match=r"logit_bias\[15\]"):
        llm.create_completion(PROMPT, max_tokens=2, temperature=0.8, logit_bias={15: value})


def test_logit_bias_minus_inf_bans_the_token(llm):
    llm.reset()
    first = int(next(iter(llm.generate(llm.tokenize(PROMPT.encode()), temp=0.0))))
    llm.reset()
    greedy = text_of(llm.create_completion(PROMPT, max_tokens=1, temperature=0))
    assert greedy == llm.detokenize([first]).decode()
    banned = text_of(llm.create_completion(PROMPT, max_tokens=1, temperature=0, logit_bias={first: float("-inf")}))
    assert banned != greedy


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_processor_returning_nan_or_plus_inf_is_an_error(llm, bad):
    def poison(input_ids, scores):
        scores[3] = bad
        return scores

    with pytest.raises(CallbackError, match="NaN or \\+inf"):
        llm.create_completion(PROMPT, max_tokens=2, temperature=0.8, logits_processor=poison)

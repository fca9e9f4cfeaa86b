"""Completion: greedy equals llama-completion token for token, streaming equals non-streaming, limits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llama_cpp import ContextOverflowError, Llama, TokenizationError
from llama_cpp.llama_grammar import LlamaGrammar

PROMPTS = ["hello there", "The capital of", "a"]
N = 24


def reference_completion(run_tool, model, prompt: str, n: int, fa: str = "off", threads: int = 1) -> str:
    out = run_tool("llama-completion", "-m", model, "-p", prompt, "-n", n, "--temp", 0, "-no-cnv", "-t", threads,
                   "--no-display-prompt", "-fa", fa, "-c", 512, "-b", 512, "-ub", 512, "--seed", 1,
                   "--no-warmup", complete=lambda b: b.endswith(b"\n\n")).stdout
    assert out.endswith(b"\n\n"), out[-40:]
    out = out[:-2]
    out = out.removesuffix(b" [end of text]\n")
    return out.decode("utf-8")


@pytest.fixture(scope="module", params=["spm", "bpe"])
def llm(request, spm_model, bpe_model):
    path = spm_model if request.param == "spm" else bpe_model
    # one thread: the reference runs stay quick on a busy 2-core machine (numerics do not depend on it)
    with Llama(path, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1,
               flash_attn=False, verbose=False) as m:
        yield m


def test_greedy_matches_llama_completion(llm, run_tool):
    for prompt in PROMPTS:
        llm.reset()
        ours = llm(prompt, max_tokens=N, temperature=0)
        ref = reference_completion(run_tool, llm.model_path, prompt, N)
        assert ours["choices"][0]["text"] == ref, prompt
        assert ours["usage"]["completion_tokens"] == N
        assert ours["choices"][0]["finish_reason"] == "length"


def test_greedy_matches_with_flash_attention(spm_model, run_tool):
    with Llama(spm_model, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1, n_threads_batch=1,
               flash_attn=True, verbose=False) as llm:
        ours = llm(PROMPTS[0], max_tokens=N, temperature=0)["choices"][0]["text"]
    assert ours == reference_completion(run_tool, spm_model, PROMPTS[0], N, fa="on")


def test_greedy_tokens_match_generate(llm):
    """generate() (token ids) and create_completion (text) run the same native chain."""
    llm.reset()
    toks = llm.tokenize(b"hello there", special=True)
    out = []
    for t in llm.generate(toks, temp=0):
        out.append(t)
        if len(out) == 10:
            break
    text = llm(toks, max_tokens=10, temperature=0)["choices"][0]["text"]
    assert llm.detokenize(out, prev_tokens=toks).decode() == text


def _take(gen, n):
    out = []
    for t in gen:
        out.append(t)
        if len(out) == n:
            break
    return out


def test_generate_send_appends_tokens_as_upstream(llm):
    """send(tokens) continues as if the prompt had been prompt + yielded + sent (greedy)."""
    toks = llm.tokenize(b"hello there", special=True)
    extra = llm.tokenize(b" the capital of", add_bos=False)
    gen = llm.generate(toks, temp=0, repeat_penalty=1.1)
    first = next(gen)
    after = [gen.send(extra)] + _take(gen, 5)
    gen.close()
    llm.reset()
    ref = _take(llm.generate(toks + [first] + extra, temp=0, repeat_penalty=1.1), 6)
    assert after == ref
    # an empty send is next()
    gen = llm.generate(toks, temp=0)
    got = [next(gen), gen.send([]), gen.send(None)]
    gen.close()
    assert got == _take(llm.generate(toks, temp=0), 3)
    gen = llm.generate(toks, temp=0)
    next(gen)
    with pytest.raises(ValueError, match="sent token"):
        gen.send([llm.n_vocab() + 5])
    with pytest.raises(StopIteration):  # the failed stream is closed; the model is free again
        next(gen)
    gen = llm.generate(toks, temp=0)
    next(gen)
    with pytest.raises(ContextOverflowError):
        gen.send(extra * 200)
    assert len(llm("hello", max_tokens=2, temperature=0)["choices"][0]["text"]) > 0


def test_stream_equals_non_stream(llm):
    for kwargs in ({"temperature": 0}, {"temperature": 0.9, "seed": 7}, {"temperature": 0, "stop": ["e"]}):
        llm.reset()
        full = llm("hello there", max_tokens=20, **kwargs)
        llm.reset()
        chunks = list(llm("hello there", max_tokens=20, stream=True, **kwargs))
        assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_prefix_reuse_gives_same_result(llm):
    llm.reset()
    a = llm("hello there", max_tokens=12, temperature=0)["choices"][0]["text"]
    b = llm("hello there", max_tokens=12, temperature=0)["choices"][0]["text"]  # cached prefix
    llm.reset()
    c = llm("hello there", max_tokens=12, temperature=0)["choices"][0]["text"]
    assert a == b == c


def test_seeded_sampling_is_reproducible(llm):
    outs = {llm("The", max_tokens=16, temperature=1.0, seed=s)["choices"][0]["text"] for s in (1, 1)}
    assert len(outs) == 1
    other = llm("The", max_tokens=16, temperature=1.0, seed=2)["choices"][0]["text"]
    assert isinstance(other, str)


def test_stop_sequence_cuts_text(llm):
    llm.reset()
    full = llm("hello there", max_tokens=N, temperature=0)["choices"][0]["text"]
    stop = full[5:8]
    cut = llm("hello there", max_tokens=N, temperature=0, stop=[stop])
    assert cut["choices"][0]["text"] == full[: full.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_logprobs_offsets_count_from_the_end_of_the_prompt(llm):
    prompt = "hello there"
    r = llm(prompt, max_tokens=6, temperature=0, logprobs=3)
    c = r["choices"][0]
    lp = c["logprobs"]
    assert len(lp["tokens"]) == 6 and "".join(lp["tokens"]) == c["text"]
    # as OpenAI and upstream: character offsets into prompt + completion
    assert lp["text_offset"] == [len(prompt) + len("".join(lp["tokens"][:i])) for i in range(6)]
    for val, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert val <= 0 and val == pytest.approx(max(top.values()))  # greedy picks the most likely token


def test_echo_logprobs_score_the_prompt(llm, request):
    prompt = "hello there, the capital of"
    plain = llm(prompt, max_tokens=5, temperature=0, logprobs=2)["choices"][0]
    r = llm(prompt, max_tokens=5, temperature=0, echo=True, logprobs=2)["choices"][0]
    assert r["text"] == prompt + plain["text"]
    lp = r["logprobs"]
    toks = llm.tokenize(prompt.encode())
    body = toks[1:] if toks[0] == llm.token_bos() else toks
    n = len(body)
    assert len(lp["tokens"]) == n + 5
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for i, (piece, off) in enumerate(zip(lp["tokens"], lp["text_offset"])):
        assert r["text"][off:].startswith(piece.lstrip() if i == 0 else piece), (i, piece, off)
    # the completion's entries are the non-echo ones, offsets moved by nothing (both count the prompt)
    assert lp["tokens"][n:] == plain["logprobs"]["tokens"]
    assert lp["text_offset"][n:] == plain["logprobs"]["text_offset"]
    assert lp["token_logprobs"][n:] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-4)
    # the prompt's entries against an independent full evaluation with every position's logits
    with Llama(llm.model_path, n_ctx=512, n_batch=512, n_threads=1, logits_all=True, flash_attn=False,
               verbose=False) as ref:
        ref.eval(toks)
        rows = ref.scores.astype(np.float64)
    rows = rows - rows.max(axis=1, keepdims=True)
    logsm = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    first = len(toks) - n
    for k in range(1, n):
        pos = first + k
        assert lp["token_logprobs"][k] == pytest.approx(logsm[pos - 1, toks[pos]], abs=2e-3), k
        assert len(lp["top_logprobs"][k]) >= 1
    # streaming carries the same entries, the prompt's in the first chunk
    streamed: dict[str, list] = {"tokens": [], "text_offset": [], "token_logprobs": []}
    chunks = list(llm(prompt, max_tokens=5, temperature=0, echo=True, logprobs=2, stream=True))
    assert chunks[0]["choices"][0]["logprobs"]["tokens"][:n] == lp["tokens"][:n]
    for ch in chunks:
        block = ch["choices"][0]["logprobs"]
        if block:
            for key in streamed:
                streamed[key] += block[key]
    assert streamed["tokens"] == lp["tokens"] and streamed["text_offset"] == lp["text_offset"]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == r["text"]


def test_logit_bias_forces_token(llm):
    target = llm.tokenize(b" house", add_bos=False)[-1]
    r = llm("hello", max_tokens=3, temperature=0, logit_bias={target: 100.0})
    assert r["choices"][0]["text"] == (llm.model.token_to_piece(target) * 3).decode()


def test_grammar_constrains_output(llm):
    g = LlamaGrammar.from_string('root ::= ("yes" | "no") " " [0-9]{2}')
    r = llm("hello", max_tokens=10, temperature=0.8, seed=3, grammar=g)
    text = r["choices"][0]["text"]
    assert text.split(" ")[0] in ("yes", "no") and text[-2:].isdigit() and len(text) in (5, 6), text


def test_json_schema_grammar_gives_valid_json(llm):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    g = LlamaGrammar.from_json_schema(schema)
    r = llm("hello", max_tokens=60, temperature=0.7, seed=5, grammar=g)
    if r["choices"][0]["finish_reason"] == "stop":
        obj = json.loads(r["choices"][0]["text"])
        assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


def test_bad_grammar_is_a_python_error(llm):
    with pytest.raises(Exception, match="grammar"):
        llm("hello", max_tokens=2, grammar="root ::= (")


def test_prompt_longer_than_context(spm_model):
    with Llama(spm_model, n_ctx=32, n_batch=32, n_ubatch=32, n_threads=1, n_threads_batch=1, verbose=False) as llm:
        n_ctx = llm.n_ctx()  # llama.cpp may round the size up
        with pytest.raises(ContextOverflowError, match=f"n_ctx={n_ctx}"):
            llm([5] * (n_ctx + 3), max_tokens=4)
        # a prompt that fits leaves max_tokens clipped to the room left
        r = llm([5] * (n_ctx - 6), max_tokens=100, temperature=0)
        assert r["usage"]["completion_tokens"] == 6
        assert r["choices"][0]["finish_reason"] == "length"


def test_token_ids_out_of_range(llm):
    with pytest.raises(TokenizationError, match="index 1"):
        llm([1, llm.n_vocab(), 3], max_tokens=2)
    with pytest.raises(TokenizationError, match="-5"):
        llm([-5], max_tokens=2)
    with pytest.raises(TokenizationError):
        llm.detokenize([10 ** 6])


def test_save_and_load_state(llm):
    llm.reset()
    llm.eval(llm.tokenize(b"hello there"))
    state = llm.save_state()
    a = llm.sample(temp=0)
    llm.eval(llm.tokenize(b" other words", add_bos=False))
    llm.load_state(state)
    assert llm.n_tokens == state.n_tokens
    np.testing.assert_allclose(llm.ctx.logits_ith(-1), state.scores[0], atol=1e-3)
    assert llm.sample(temp=0) == a
    assert np.array_equal(llm.input_ids, state.input_ids)


def test_unknown_keyword_rejected(spm_model):
    with pytest.raises(TypeError, match="n_ctxx"):
        Llama(spm_model, n_ctxx=5)

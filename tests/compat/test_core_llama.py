"""``Llama``'s constructor, attributes, tokenizer spacing, seeds and pickling as upstream 0.3.36."""

from __future__ import annotations

import itertools
import pickle
import warnings

import numpy as np
import pytest

import llama_cpp
from llama_cpp import Llama
from llama_cpp._errors import ContextError


@pytest.fixture(scope="module")
def llm(spm_model):
    with Llama(spm_model, n_ctx=128, n_threads=1, verbose=False, seed=11) as m:
        yield m


def test_obsolete_keywords_warn_and_are_ignored(spm_model):
    with pytest.warns(DeprecationWarning, match="obsolete keyword argument.s. f16_kv, n_parts"):
        m = Llama(spm_model, n_ctx=64, n_threads=1, verbose=False, f16_kv=True, n_parts=-1)
    with m:
        assert m("Hi", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    with pytest.warns(UserWarning, match="unknown keyword argument.s. my_wrapper_option"):
        Llama(spm_model, vocab_only=True, verbose=False, my_wrapper_option=1).close()
    with pytest.raises(TypeError, match="did you mean 'n_ctx'"):
        Llama(spm_model, vocab_only=True, n_ctxx=5)


def test_upstream_constructor_keywords(spm_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these is unknown
        m = Llama(spm_model, n_ctx=64, n_batch=32, n_threads=1, verbose=False, attention_type=-1, draft_model=None,
                  tokenizer=None, numa=False, lora_base=None, type_k=None, type_v=None, spm_infill=False)
    with m:
        assert m.n_batch == 32
        assert m.context_params.n_ctx == m.n_ctx() and m.context_params.n_batch == 32
        assert m.model_params.vocab_only is False
        assert m._is_recurrent is False and m._is_hybrid is False
        assert m.draft_model is None and m.cache is None
    with pytest.raises(TypeError, match="tokenizer must be a BaseLlamaTokenizer"):
        Llama(spm_model, vocab_only=True, tokenizer=object())


def test_hybrid_flags(hybrid_model):
    with Llama(hybrid_model, n_ctx=64, n_threads=1, verbose=False) as m:
        assert m._is_hybrid is True and m._is_recurrent is False


def test_vocab_only_has_a_context_object(spm_model):
    with Llama(spm_model, vocab_only=True, verbose=False) as m:
        assert m._ctx is not None and m._ctx.ctx is not None
        assert m.n_ctx() > 0
        assert m.model_params.vocab_only is True
        with pytest.raises(ContextError, match="vocab_only"):
            m("Hello", max_tokens=1)


def test_detokenize_keeps_the_space_without_bos(spm_model):
    with Llama(spm_model, vocab_only=True, verbose=False) as m:
        toks = m.tokenize(b"Hello World")
        assert toks[0] == m.token_bos()
        assert m.detokenize(toks) == b"Hello World"
        assert m.detokenize(toks[1:]) == b" Hello World"  # not the start of the text: the space stays
        per_token = b"".join(m.detokenize([t]) for t in toks[1:])
        assert per_token == b" Hello World"  # streaming piece by piece does not glue words
        streamed = b"".join(m.detokenize([t], prev_tokens=toks[:i + 1]) for i, t in enumerate(toks[1:]))
        assert streamed == b"Hello World"
        assert m.detokenize([]) == b""


def test_generate_detokenize_streaming_has_spaces(llm):
    toks = llm.tokenize(b"the quick brown")
    out = list(itertools.islice(llm.generate(toks, temp=0), 8))
    pieces = b"".join(llm.detokenize([t]) for t in out)
    assert pieces == llm.detokenize(out)
    assert pieces == llm.detokenize(toks + out)[len(llm.detokenize(toks)):]


def test_attributes_follow_evaluation(llm):
    llm.reset()
    assert llm.scores.shape == (0, llm.n_vocab())
    toks = llm.tokenize(b"Hello world")
    llm.eval(toks)
    assert llm.n_tokens == len(toks)
    assert llm.input_ids.dtype == np.intc and llm.input_ids.tolist() == toks
    assert list(llm.eval_tokens) == toks
    assert llm.scores.dtype == np.single and llm.scores.shape == (1, llm.n_vocab())
    assert len(llm.eval_logits) == 1
    assert llm.sample(temp=0, idx=len(toks) - 1) == int(np.argmax(llm.scores[-1]))
    with pytest.raises(IndexError, match="logits_all"):
        llm.sample(temp=0, idx=0)


def test_unseeded_calls_advance_the_seed(spm_model):
    with Llama(spm_model, n_ctx=128, n_threads=1, verbose=False, seed=1234) as m:
        kw = {"max_tokens": 12, "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        a = [m("The", **kw)["choices"][0]["text"] for _ in range(3)]
        assert len(set(a)) > 1  # each call samples with the next seed
        m.set_seed(1234)
        b = [m("The", **kw)["choices"][0]["text"] for _ in range(3)]
        assert a == b  # and the sequence is the seed's
        x = m("The", seed=99, **kw)["choices"][0]["text"]
        y = m("The", seed=99, **kw)["choices"][0]["text"]
        assert x == y  # an explicit seed is reproducible


def test_save_load_state_replays_the_seed_sequence(spm_model):
    with Llama(spm_model, n_ctx=128, n_threads=1, verbose=False, seed=5) as m:
        kw = {"max_tokens": 10, "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        m.set_seed(1337)
        state = m.save_state()
        first = m("Pick", **kw)["choices"][0]["text"]
        second = m("Pick", **kw)["choices"][0]["text"]
        m.load_state(state)
        assert m("Pick", **kw)["choices"][0]["text"] == first
        assert first != second


def test_pickle_recreates_from_the_constructor_arguments(spm_model):
    with Llama(spm_model, n_ctx=96, n_threads=1, verbose=False, seed=3, last_n_tokens_size=32) as m:
        expect = m("Hello", max_tokens=8, temperature=0)["choices"][0]["text"]
        clone = pickle.loads(pickle.dumps(m))
    with clone:
        assert clone.model_path == str(spm_model) and clone.last_n_tokens_size == 32
        assert clone._seed == m._seed
        assert clone("Hello", max_tokens=8, temperature=0)["choices"][0]["text"] == expect


def test_custom_tokenizer_is_used(spm_model):
    calls = []

    class Recording(llama_cpp.LlamaTokenizer):
        def tokenize(self, text, add_bos=True, special=True):
            calls.append(text)
            return super().tokenize(text, add_bos, special)

    tok = Recording.from_ggml_file(spm_model)
    with Llama(spm_model, n_ctx=64, n_threads=1, verbose=False, tokenizer=tok) as m:
        assert m.tokenizer() is tok
        m.tokenize(b"abc")
        m("Hello there", max_tokens=1, temperature=0)
        assert calls == [b"abc", b"Hello there"]


def test_default_tokenizer_methods(spm_model):
    with Llama(spm_model, vocab_only=True, verbose=False) as m:
        t = m.tokenizer()
        assert isinstance(t, llama_cpp.LlamaTokenizer)
        ids = t.encode("Hello World")
        assert t.decode(ids) == "Hello World"
        other = llama_cpp.LlamaTokenizer.from_ggml_file(m.model_path)
        assert other.tokenize(b"Hello World") == m.tokenize(b"Hello World", special=True)
        assert llama_cpp.LlamaTokenizer(m).tokenize(b"Hello World") == other.tokenize(b"Hello World")  # upstream's form
    with pytest.raises(TypeError, match="takes a Llama or a LlamaModel, not object"):
        llama_cpp.LlamaTokenizer(object())


def test_hf_tokenizer_wrapper():
    class Fake:
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text] + ([0] if add_special_tokens else [])

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i or not skip_special_tokens)

    t = llama_cpp.LlamaHFTokenizer(Fake())
    assert t.tokenize(b"ab") == [97, 98, 0]
    assert t.detokenize([99], prev_tokens=[97, 98]) == b"c"
    assert t.detokenize([97, 0], special=False) == b"a"


def test_hf_tokenizer_needs_transformers(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    with pytest.raises(ImportError, match="pip install transformers"):
        llama_cpp.LlamaHFTokenizer.from_pretrained("some/model")


def test_openai_v1_needs_openai(llm, monkeypatch):
    import sys

    # hide openai and any of its submodules another test imported (they would be found directly)
    for name in [n for n in sys.modules if n == "openai" or n.startswith("openai.")] + ["openai"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="pip install openai"):
        llm.create_chat_completion_openai_v1(messages=[{"role": "user", "content": "hi"}])


def test_n_tokens_rewinds(llm):
    toks = llm.tokenize(b"one two three four")
    llm.reset()
    llm.eval(toks)
    llm.n_tokens = 2
    assert llm.input_ids.tolist() == toks[:2]
    llm.eval(toks[2:])  # continues at position 2
    assert llm.input_ids.tolist() == toks
    with pytest.raises(ValueError, match="n_tokens must be"):
        llm.n_tokens = len(toks) + 1
    llm.n_tokens = 0
    assert llm.n_tokens == 0
    assert llm._n_ctx == llm.n_ctx() and llm._token_eos == llm.token_eos()


def test_recurrent_flags_and_prefix_edits(recurrent_model):
    with Llama(recurrent_model, n_ctx=64, n_threads=1, verbose=False) as m:
        assert m._is_recurrent is True and m._is_hybrid is False
        a = m("The quick brown fox", max_tokens=4, temperature=0)["choices"][0]["text"]
        m("The slow brown fox", max_tokens=4, temperature=0)  # an edit inside the history: memory rebuilt
        assert m("The quick brown fox", max_tokens=4, temperature=0)["choices"][0]["text"] == a


def test_logits_all_keeps_every_row(spm_model):
    with Llama(spm_model, n_ctx=64, n_threads=1, verbose=False, logits_all=True) as m:
        toks = m.tokenize(b"one two three")
        m.eval(toks)
        assert m.scores.shape == (len(toks), m.n_vocab())
        assert len(m.eval_logits) == len(toks)
        assert m.sample(temp=0, idx=0) == int(np.argmax(m.scores[0]))
        # generation decodes one token a batch: the last batch's one row
        m.create_completion("one two three", max_tokens=3, temperature=0)
        assert m.scores.shape == (1, m.n_vocab()) and len(m.eval_logits) == 1

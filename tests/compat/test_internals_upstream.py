"""llama-cpp-python 0.3.36's low-level ``_internals`` forms on this package's wrappers.

Upstream's ``test_real_model`` builds ``LlamaModel(path_model=, params=)`` and
``LlamaContext(model=, params=)`` from the default structs; these tests run that flow on the tiny
fixture and check that a caller's struct goes through the same boundary checks as the keywords.
"""

from __future__ import annotations

import numpy as np
import pytest

import llama_cpp
from llama_cpp import _internals as internals
from llama_cpp._errors import ClosedError, ParameterError


@pytest.fixture(scope="module")
def model_path():
    from build_tools.fixtures import fixture_path

    return str(fixture_path("llama_spm"))


def _model(path: str) -> internals.LlamaModel:
    params = llama_cpp.llama_model_default_params()
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
    params.check_tensors = False
    return internals.LlamaModel(path_model=path, params=params)


def _cparams(n_ctx: int = 64, **fields) -> object:
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
    cp.n_threads = cp.n_threads_batch = 1
    for k, v in fields.items():
        setattr(cp, k, v)
    return cp


def test_upstream_real_model_flow(model_path) -> None:
    model = _model(model_path)
    cparams = _cparams()
    cparams.logits_all = False  # a field upstream's test still sets; ctypes keeps it as a plain attribute
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    context = internals.LlamaContext(model=model, params=cparams)
    assert context.n_ctx() >= 64  # llama.cpp pads the context size

    tokens = model.tokenize(b"Hello, world!", add_bos=True, special=True)
    assert tokens[0] == model.token_bos()
    assert tokens == model.tokenize(b"Hello, world!", True, True)
    assert model.detokenize(tokens) == b"Hello, world!"

    batch = internals.LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=1)
    sampler = internals.LlamaSampler()
    sampler.add_top_k(50)
    sampler.add_top_p(0.9, 1)
    sampler.add_temp(0.8)
    sampler.add_dist(1337)
    assert sampler.get_seed() == 1337

    result, n_eval = list(tokens), 0
    for _ in range(4):
        batch.set_batch(tokens, n_past=n_eval, logits_all=False)
        assert batch.output_indices() == [len(tokens) - 1]
        context.decode(batch)
        n_eval += len(tokens)
        tokens = [sampler.sample(context, -1)]
        result += tokens
    output = result[-4:]
    assert all(0 <= t < model.n_vocab for t in output)
    assert model.detokenize(output, special=True)

    assert context.ctx is not None and model.model is not None
    model.close()
    assert model.model is None
    assert context.ctx is None, "a context made with params= closes with its model, as upstream's"
    with pytest.raises(ClosedError):
        context.decode(batch)


def test_keyword_contexts_still_keep_their_model_alive(model_path) -> None:
    model = internals.LlamaModel(model_path)
    context = internals.LlamaContext(model, n_ctx=32, n_batch=32, n_ubatch=32, n_threads=1, n_threads_batch=1)
    model.close()
    assert context.ctx is not None
    batch = internals.LlamaBatch(8)
    batch.add_sequence([1, 5, 6])
    context.decode(batch)
    context.close()
    assert context.ctx is None


def test_set_batch_gives_the_keyword_path_logits(model_path) -> None:
    model = _model(model_path)
    ids = model.tokenize(b"the quick brown fox", add_bos=True, special=False)
    up = internals.LlamaContext(model=model, params=_cparams())
    kw = internals.LlamaContext(model, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
    b1 = internals.LlamaBatch(n_tokens=len(ids), embd=0, n_seq_max=1)
    b1.set_batch(ids, n_past=0, logits_all=True)
    b2 = internals.LlamaBatch(len(ids))
    b2.add_sequence(ids, seq_id=0, start_pos=0, logits=True)
    up.decode(b1)
    kw.decode(b2)
    for i in range(len(ids)):
        np.testing.assert_array_equal(up.logits_ith(i), kw.logits_ith(i))
    model.close()


def test_add_sequence_upstream_positional_form(model_path) -> None:
    batch = internals.LlamaBatch(n_tokens=8, embd=0, n_seq_max=2)
    batch.add_sequence([3, 4, 5], 1, False)  # upstream: (tokens, seq_id, logits_all)
    assert batch.n_tokens == 3
    assert batch.pos[:3].tolist() == [0, 1, 2]
    assert batch.seq_ids[:3, 0].tolist() == [1, 1, 1]
    assert batch.output_indices() == [2]
    batch.reset()
    batch.add_sequence([3, 4], seq_id=0, logits_all=True)
    assert batch.output_indices() == [0, 1]
    assert batch.batch.n_tokens == 2


def test_caller_struct_is_copied_not_changed(model_path) -> None:
    model = _model(model_path)
    cparams = _cparams(n_ctx=64)
    cparams.n_batch, cparams.n_ubatch = 8, 32
    context = internals.LlamaContext(model=model, params=cparams)
    assert context.n_ubatch() == 8  # clamped to n_batch on the private copy
    assert cparams.n_ubatch == 32
    model.close()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("flash_attn_type", 42, "flash_attn_type"),
    ("pooling_type", 77, "pooling_type"),
    ("type_k", 999, "type_k"),
    ("n_threads", 100_000, "n_threads"),
    ("rope_freq_base", float("nan"), "rope_freq_base"),
])
def test_context_struct_fields_are_checked(model_path, field, value, message) -> None:
    model = _model(model_path)
    with pytest.raises(ParameterError, match=message):
        internals.LlamaContext(model=model, params=_cparams(**{field: value}))
    model.close()


def test_model_struct_fields_are_checked(model_path) -> None:
    params = llama_cpp.llama_model_default_params()
    params.split_mode = 99
    with pytest.raises(ParameterError, match="split_mode"):
        internals.LlamaModel(path_model=model_path, params=params)
    params = llama_cpp.llama_model_default_params()
    params.load_mode = 1234
    with pytest.raises(ParameterError, match="load_mode"):
        internals.LlamaModel(path_model=model_path, params=params)


def test_forms_do_not_mix(model_path) -> None:
    params = llama_cpp.llama_model_default_params()
    with pytest.raises(TypeError, match="either params= or the keyword fields"):
        internals.LlamaModel(path_model=model_path, params=params, n_gpu_layers=3)
    with pytest.raises(TypeError, match="as path or as path_model"):
        internals.LlamaModel(model_path, path_model=model_path)
    with pytest.raises(TypeError, match="llama_model_params"):
        internals.LlamaModel(path_model=model_path, params=llama_cpp.llama_context_default_params())
    model = _model(model_path)
    with pytest.raises(TypeError, match="either params= or the keyword fields"):
        internals.LlamaContext(model=model, params=_cparams(), n_ctx=32)
    with pytest.raises(TypeError, match="llama_context_params"):
        internals.LlamaContext(model=model, params=llama_cpp.llama_model_default_params())
    model.close()


def test_missing_model_file_in_upstream_form(tmp_path) -> None:
    for kind in (FileNotFoundError, ValueError):  # ours, and upstream's
        with pytest.raises(kind, match="model file not found"):
            internals.LlamaModel(path_model=str(tmp_path / "nope.gguf"),
                                 params=llama_cpp.llama_model_default_params())


def test_add_grammar_takes_a_llama_grammar(model_path) -> None:
    model = _model(model_path)
    context = internals.LlamaContext(model=model, params=_cparams())
    grammar = llama_cpp.LlamaGrammar.from_string('root ::= "yes" | "no"')
    sampler = internals.LlamaSampler()
    sampler.add_grammar(model, grammar)
    sampler.add_greedy()
    ids = model.tokenize(b"Answer:", add_bos=True, special=False)
    batch = internals.LlamaBatch(n_tokens=len(ids), embd=0, n_seq_max=1)
    batch.set_batch(ids, n_past=0, logits_all=False)
    out, n_past = [], len(ids)
    context.decode(batch)
    for _ in range(8):
        tok = sampler.sample(context, -1)
        if model.is_eog(tok):
            break
        out.append(tok)
        batch.set_batch([tok], n_past=n_past, logits_all=False)
        context.decode(batch)
        n_past += 1
    assert model.detokenize(out).decode() in {"yes", "no"}
    with pytest.raises(TypeError, match="GBNF text or a LlamaGrammar"):
        sampler.add_grammar(model, 42)
    model.close()


def test_upstream_vocab_helpers(model_path) -> None:
    model = _model(model_path)
    assert model.vocab_type() == llama_cpp.LLAMA_VOCAB_TYPE_SPM
    tok = model.tokenize(b"hello", add_bos=False, special=False)[0]
    assert model.token_get_text(tok) == model.token_text(tok)
    assert isinstance(model.token_get_score(tok), float)
    assert isinstance(model.token_get_attr(tok), int)
    assert model.add_bos_token() == model.add_bos()
    assert model.token_cls() == model.token_bos()
    assert isinstance(internals.LlamaModel.default_params(), llama_cpp.llama_model_params)
    assert isinstance(internals.LlamaContext.default_params(), llama_cpp.llama_context_params)
    model.close()


def test_token_data_array_and_normalize_embedding(model_path) -> None:
    arr = internals.LlamaTokenDataArray(n_vocab=8)
    logits = np.arange(8, dtype=np.float32)[::-1].copy()
    arr.copy_logits(logits)
    assert arr.candidates.size == 8 and not arr.candidates.sorted
    assert arr.candidates_data["logit"].tolist() == logits.tolist()
    assert arr.candidates_data["id"].tolist() == list(range(8))
    with pytest.raises(ValueError, match="shape"):
        arr.copy_logits(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="n_vocab"):
        internals.LlamaTokenDataArray(n_vocab=0)
    out = internals.normalize_embedding([3.0, 4.0])
    assert out == pytest.approx([0.6, 0.8])
    assert internals.normalize_embedding([0.0, 0.0]) == [0.0, 0.0]


def test_sampler_clone_dry_infill_softmax(model_path) -> None:
    model = _model(model_path)
    context = internals.LlamaContext(model=model, params=_cparams())
    ids = model.tokenize(b"the quick brown", add_bos=True, special=False)
    batch = internals.LlamaBatch(n_tokens=len(ids), embd=0, n_seq_max=1)
    batch.set_batch(ids, n_past=0, logits_all=False)
    context.decode(batch)
    chain = internals.LlamaSampler()
    chain.add_dry(model, 0.8, 1.75, 2, -1, ["\n", ":", '"', "*"])
    chain.add_top_k(40)
    chain.add_temp(1.5)
    chain.add_dist(7)
    twin = chain.clone()
    assert twin.names == chain.names and len(twin) == len(chain)
    first = chain.sample(context, -1)
    chain.close()
    assert twin.sample(context, -1) == first  # same seed state, independent of the closed original
    with pytest.raises(ValueError, match="seq_breakers"):
        internals.LlamaSampler().add_dry(model, 0.8, 1.75, 2, -1, [""])
    with pytest.raises(ParameterError, match="dry_base"):
        internals.LlamaSampler().add_dry(model, 0.8, float("inf"), 2, -1, [])
    infill = internals.LlamaSampler()
    infill.add_top_k(10)
    infill.add_infill(model)
    infill.add_greedy()
    assert 0 <= infill.sample(context, -1) < model.n_vocab
    with pytest.warns(DeprecationWarning, match="add_softmax"):
        assert internals.LlamaSampler().add_softmax().names == []
    model.close()


def test_n_vocab_and_metadata_in_both_forms(model_path) -> None:
    model = _model(model_path)
    assert model.n_vocab() == model.n_vocab == int(model.n_vocab) > 0
    assert model.n_vocab - 1 == int(model.n_vocab) - 1
    md = model.metadata
    assert md["general.architecture"] == model.metadata()["general.architecture"] == "llama"
    assert type(model.metadata()) is dict
    model.close()

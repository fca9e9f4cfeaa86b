"""A draft whose vocabulary llama.cpp refuses is refused from the GGUF headers, before any model loads.

llama.cpp's rule (``common_speculative_are_compatible``): the same vocabulary type, the same BOS and
EOS handling (add flag, and the id when added), sizes within 128 tokens, and equal token texts from
id 5 on. The header check must give the verdict the native check gives on the loaded vocabularies.
"""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp._safety.gguf_guard import VocabHeader
from llama_cpp.speculative import SpecConfig, make_decoder

from .util import CTX

Llama = pytest.importorskip("llama_cpp.llama").Llama
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
MISMATCHES = [
    (lambda: fixture_path("draft_model", form="echo", vocab="renamed"), "token .* is '<|im_begin|>'"),
    (lambda: fixture_path("draft_model", form="echo", vocab="bos"), "BOS"),
    (lambda: fixture_path("draft_model", form="echo", vocab="extended"), "at most 128"),
    (lambda: fixture_path("llama_spm"), "vocabulary type"),
]


def _no_load(monkeypatch):
    import llama_cpp._internals as internals

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the vocabulary check")

    monkeypatch.setattr(internals.LlamaModel, "__init__", no_load)


@pytest.mark.parametrize("target", ("llama_bpe", "qwen35_mtp"))
@pytest.mark.parametrize(("draft", "match"), MISMATCHES)
@pytest.mark.parametrize("spec_type", ("draft-simple", ("ngram-mod", "draft-simple")))
def test_another_vocabulary_fails_before_loading(monkeypatch, target, draft, match, spec_type):
    path = fixture_path(target, **({"form": "echo"} if target == "qwen35_mtp" else {}))
    d = str(draft())
    _no_load(monkeypatch)
    with pytest.raises(SpeculativeError, match=match):
        Llama(path, speculative=SpecConfig(spec_type, draft_model_path=d), **KW)


def _count_vocab_loads(monkeypatch) -> list[bool]:
    import llama_cpp._internals as internals

    seen: list[bool] = []
    init = internals.LlamaModel.__init__

    def counting(self, *a, **kw):
        seen.append(bool(kw.get("vocab_only")))
        init(self, *a, **kw)

    monkeypatch.setattr(internals.LlamaModel, "__init__", counting)
    return seen


def test_a_fitting_draft_needs_no_vocab_only_load(targets, draft_path, monkeypatch):
    """The headers decide this pair: the draft loads once (no vocab-only load before it)."""
    seen = _count_vocab_loads(monkeypatch)
    with make_decoder(targets["bpe"], SpecConfig(draft_model_path=str(draft_path("echo"))), ctx_params=dict(CTX)):
        pass
    assert seen == [False]


@pytest.mark.parametrize(("draft", "match"), MISMATCHES)
def test_decoder_refuses_from_the_header(targets, monkeypatch, draft, match):
    """``make_decoder`` on a loaded target (no Llama in front): the draft is refused unloaded too."""
    d = str(draft())
    model = targets["echo"]
    _no_load(monkeypatch)
    with pytest.raises(SpeculativeError, match=match):
        make_decoder(model, SpecConfig(draft_model_path=d), ctx_params=dict(CTX))


@pytest.mark.parametrize("target", ("llama_bpe", "llama_spm", "qwen35_mtp"))
@pytest.mark.parametrize("draft", [m[0] for m in MISMATCHES] + [lambda: fixture_path("draft_model", form="echo"),
                                                                 lambda: fixture_path("llama_bpe")])
def test_header_verdict_equals_the_native_one(target, draft):
    """Header verdict == the verdict (and message) of llama.cpp's rule on the loaded vocabularies."""
    from llama_cpp._internals import LlamaModel
    from llama_cpp.speculative.draft import check_vocab_compatible, check_vocab_files

    t = str(fixture_path(target, **({"form": "echo"} if target == "qwen35_mtp" else {})))
    d = str(draft())

    def verdict(fn):
        try:
            return fn()
        except SpeculativeError as e:
            return str(e)

    header = verdict(lambda: check_vocab_files(t, d))
    with LlamaModel(t, vocab_only=True) as vt, LlamaModel(d, vocab_only=True) as vd:
        native = verdict(lambda: check_vocab_compatible(vt, vd, d))
    assert header == (True if native is None else native)


def _verdict(monkeypatch, t: VocabHeader, d: VocabHeader):
    import llama_cpp.speculative.draft as sd

    monkeypatch.setattr(sd, "_vocab_header", lambda p: t if p == "t" else d)
    try:
        return sd.check_vocab_files("t", "d")
    except SpeculativeError as e:
        return str(e)


TOKS = [b"<unk>", b"<s>", b"</s>"] + [f"w{i}".encode() for i in range(20)]


@pytest.mark.parametrize(("t", "d", "want"), [
    # BPE without add_bos: the default depends on the pre-tokenizer; the same one decides, another does not
    ({"pre": "qwen35"}, {"pre": "qwen35"}, True),
    ({"pre": "llama3"}, {"pre": "qwen35"}, False),
    # ... and with the flag given in both, the header decides whatever the pre-tokenizers
    ({"pre": "llama3", "add_bos": True, "bos_id": 1}, {"pre": "qwen35", "add_bos": True, "bos_id": 1}, True),
    ({"pre": "llama3", "add_bos": True, "bos_id": 1}, {"pre": "qwen35", "add_bos": True, "bos_id": 2}, "BOS"),
    # a BOS that is not added may differ
    ({"add_bos": False, "bos_id": 1}, {"add_bos": False, "bos_id": 2}, True),
    # an explicit id the vocabulary lacks falls back to the default: undecided against an explicit one
    ({"add_bos": True, "bos_id": 1}, {"add_bos": True, "bos_id": 999}, False),
    # EOS: added by default only by UGM (t5) vocabularies
    ({"model": "t5", "eos_id": 2}, {"model": "t5", "eos_id": 1}, "EOS"),
    ({"model": "t5", "eos_id": 2}, {"model": "t5", "eos_id": 2, "add_eos": False}, "EOS"),
    ({"eos_id": 2}, {"eos_id": 1}, True),
    # Gemma 4's pre-tokenizer forces add_bos on
    ({"pre": "gemma4", "add_bos": False, "bos_id": 1}, {"pre": "gemma4", "add_bos": True, "bos_id": 1}, True),
    # SPM adds BOS by default: ids must match
    ({"model": "llama", "bos_id": 1}, {"model": "llama", "bos_id": 2}, "BOS"),
    ({"model": "mystery"}, {"model": "mystery"}, False),
    ({"model": "gpt2"}, {"model": "llama"}, "vocabulary type 1, the target 2"),
])
def test_header_rule(monkeypatch, t, d, want):
    base = {"model": "gpt2", "pre": "qwen35", "tokens": TOKS}
    got = _verdict(monkeypatch, VocabHeader(**{**base, **t}), VocabHeader(**{**base, **d}))
    if isinstance(want, str):
        assert isinstance(got, str) and want in got, got
    else:
        assert got is want


def test_token_texts_compare_from_id_5_as_strcmp_does(monkeypatch):
    early = VocabHeader(model="gpt2", pre="x", tokens=[b"a"] + TOKS[1:])
    assert _verdict(monkeypatch, VocabHeader(model="gpt2", pre="x", tokens=TOKS), early) is True
    nul = VocabHeader(model="gpt2", pre="x", tokens=TOKS[:7] + [TOKS[7] + b"\0tail"] + TOKS[8:])
    assert _verdict(monkeypatch, VocabHeader(model="gpt2", pre="x", tokens=TOKS), nul) is True
    other = VocabHeader(model="gpt2", pre="x", tokens=TOKS[:7] + [b"zz"] + TOKS[8:])
    assert "token 7 is 'zz'" in _verdict(monkeypatch, VocabHeader(model="gpt2", pre="x", tokens=TOKS), other)


def test_tokenizer_overrides_decide_on_the_loaded_vocabulary(monkeypatch):
    """``kv_overrides`` of tokenizer keys change what llama.cpp loads, so the header check steps aside:
    the draft that adds a BOS token fits a target told to add one too, and a fitting draft is refused
    once the target is told to add one."""
    target = fixture_path("qwen35_mtp", form="echo")
    bos_draft = str(fixture_path("draft_model", form="echo", vocab="bos"))
    same_draft = str(fixture_path("draft_model", form="echo"))
    add_bos = {"tokenizer.ggml.add_bos_token": True}
    with Llama(target, speculative=SpecConfig(draft_model_path=bos_draft), kv_overrides=add_bos, **KW) as llm:
        out = llm("hello there", max_tokens=6, temperature=0)
        assert llm.last_speculative_stats.drafted > 0 and out["choices"][0]["text"]
    with pytest.raises(SpeculativeError, match="BOS"):
        Llama(target, speculative=SpecConfig(draft_model_path=same_draft), kv_overrides=add_bos, **KW)
    # an override of another key leaves the header check in charge (nothing loads before it refuses)
    _no_load(monkeypatch)
    with pytest.raises(SpeculativeError, match="BOS"):
        Llama(target, speculative=SpecConfig(draft_model_path=bos_draft), kv_overrides={"general.name": "x"}, **KW)

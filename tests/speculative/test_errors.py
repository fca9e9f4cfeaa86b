"""Clear errors before any native call (or before any decode) for misconfigured speculation."""

from __future__ import annotations

import struct

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.speculative import (
    NgramCacheParams,
    NgramMapParams,
    NgramModParams,
    SpecConfig,
    SpeculativeType,
    check_model_file,
    make_decoder,
)

from .util import CTX


@pytest.mark.parametrize("kw, match", [
    ({"ngram_simple": {"size_n": 0}}, "size_n"),
    ({"ngram_simple": {"size_m": 1025}}, "size_m"),
    ({"ngram_map_k4v": {"min_hits": 0}}, "min_hits"),
    ({"ngram_map_k": {"size_n": 2.5}}, "size_n"),
    ({"ngram_map_k": {"bogus": 1}}, "bogus"),
    ({"ngram_mod": {"n_match": 0}}, "n_match"),
    ({"ngram_mod": {"n_max": 4, "n_min": 8}}, "n_min"),
    ({"ngram_cache": {"n_draft": 0}}, "n_draft"),
    ({"ngram_cache": {"lookup_cache_static": 3}}, "lookup_cache_static"),
    ({"ngram_mod": 5}, "ngram_mod"),
])
def test_ngram_params_out_of_range(kw, match):
    with pytest.raises(SpeculativeError, match=match):
        SpecConfig("ngram-simple", **kw)


def test_param_classes_validate_themselves():
    for make in (lambda: NgramMapParams(size_n=0), lambda: NgramModParams(n_match=2000),
                 lambda: NgramCacheParams(n_draft=-1)):
        with pytest.raises(SpeculativeError):
            make()


@pytest.mark.parametrize("spec_type, match", [
    ("ngram-simple,bogus", "unknown spec_type"),
    ([], "empty"),
    (["ngram-mod", 7], "unknown spec_type"),
    ("draft-simple", "draft_model_path"),
])
def test_bad_types(spec_type, match):
    with pytest.raises(SpeculativeError, match=match):
        SpecConfig(spec_type)


def test_type_lists_and_names():
    c = SpecConfig("ngram-mod, ngram_simple")
    assert c.types == (SpeculativeType.NGRAM_MOD, SpeculativeType.NGRAM_SIMPLE)
    assert c.spec_type is SpeculativeType.NGRAM_MOD and not c.needs_nextn
    assert SpecConfig(["ngram-simple", "none"]).types == (SpeculativeType.NONE,)
    assert SpecConfig(draft_model_path="d.gguf").spec_type is SpeculativeType.DRAFT_SIMPLE
    assert SpecConfig().spec_type is SpeculativeType.DRAFT_MTP
    assert SpecConfig(types=("ngram-cache", "draft-mtp")).needs_nextn
    c = SpecConfig("ngram-simple,ngram-mod", ngram_mod={"n_max": 20, "n_min": 2})
    assert c.n_max == 48 and c.rollback_snapshots == 0 and SpecConfig(types=c.types, n_rs_seq=4).rollback_snapshots == 4
    import dataclasses
    assert dataclasses.replace(c, draft_n_max=5).types == c.types  # replace keeps the whole list


@pytest.mark.parametrize("name", ("draft-eagle3", "draft-dflash", "draft-dspark"))
def test_hidden_state_drafts_need_a_draft_file_before_loading(name, tmp_path):
    with pytest.raises(SpeculativeError, match="needs a draft model"):
        check_model_file(tmp_path / "absent.gguf", SpecConfig(name))
    with pytest.raises(SpeculativeError, match="not a file"):
        check_model_file(tmp_path / "absent.gguf", SpecConfig(name, draft_model_path=str(tmp_path / "none.gguf")))


def test_missing_files_fail_before_loading(tmp_path):
    with pytest.raises(SpeculativeError, match="not a file"):
        check_model_file(fixture_path("llama_bpe"), SpecConfig(draft_model_path=str(tmp_path / "none.gguf")))
    with pytest.raises(SpeculativeError, match="lookup_cache_static"):
        check_model_file(fixture_path("llama_bpe"), SpecConfig(
            "ngram-cache", ngram_cache={"lookup_cache_static": str(tmp_path / "none.bin")}))


@pytest.mark.parametrize("vocab, match", [
    ("renamed", "token .* is '<|im_begin|>'"),
    ("bos", "BOS"),
    ("extended", "at most 128"),
])
def test_draft_with_another_vocabulary(targets, draft_path, vocab, match):
    for target in ("bpe", "echo"):
        with pytest.raises(SpeculativeError, match=match):
            make_decoder(targets[target], SpecConfig(draft_model_path=str(draft_path("echo", vocab=vocab))),
                         ctx_params=dict(CTX))


def test_draft_with_another_tokenizer_type(targets):
    with pytest.raises(SpeculativeError, match="vocabulary type"):
        make_decoder(targets["bpe"], SpecConfig(draft_model_path=str(fixture_path("llama_spm"))),
                     ctx_params=dict(CTX))


def test_mtp_on_a_model_without_nextn(targets):
    with pytest.raises(SpeculativeError, match="NextN|load_mtp"):
        make_decoder(targets["bpe"], SpecConfig("draft-mtp"), ctx_params=dict(CTX))
    with pytest.raises(SpeculativeError, match="no NextN"):
        check_model_file(fixture_path("llama_bpe"), SpecConfig(["ngram-simple", "draft-mtp"]))


def test_context_params(targets):
    with pytest.raises(SpeculativeError, match="n_seq_max"):
        make_decoder(targets["bpe"], SpecConfig("ngram-simple"), ctx_params=dict(CTX, n_seq_max=2))
    with pytest.raises(SpeculativeError, match="embeddings"):
        make_decoder(targets["bpe"], SpecConfig("ngram-simple"), ctx_params=dict(CTX, embeddings=True))
    with pytest.raises(SpeculativeError, match="n_batch=4"):
        make_decoder(targets["bpe"], SpecConfig(draft_model_path="x.gguf", draft_n_max=8),
                     ctx_params=dict(CTX, n_batch=4))


def test_corrupt_ngram_cache_file(targets, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(struct.pack("<4ii", 1, 2, -1, -1, 3) + b"\x01")  # 3 entries announced, 1 byte given
    with pytest.raises(SpeculativeError, match="corrupt"):
        make_decoder(targets["bpe"], SpecConfig("ngram-cache", ngram_cache={"lookup_cache_static": str(bad)}),
                     ctx_params=dict(CTX))
    neg = tmp_path / "neg.bin"
    neg.write_bytes(struct.pack("<4ii", 1, 2, -1, -1, 1) + struct.pack("<ii", 5, 0))
    with pytest.raises(SpeculativeError, match="invalid token count"):
        make_decoder(targets["bpe"], SpecConfig("ngram-cache", ngram_cache={"lookup_cache_dynamic": str(neg)}),
                     ctx_params=dict(CTX))


def test_misuse_of_a_decoder(targets):
    dec = make_decoder(targets["bpe"], SpecConfig("ngram-simple"), ctx_params=dict(CTX))
    from tests.speculative.mtp.util import greedy_sampler

    with pytest.raises(SpeculativeError, match="prefill"):
        next(dec.generate(greedy_sampler(), 4))
    with pytest.raises(ValueError, match="at least one token"):
        dec.prefill([])
    with pytest.raises(Exception, match="vocabulary"):
        dec.prefill([10 ** 6])
    dec.prefill([1, 2, 3])
    with pytest.raises(TypeError, match="sampler"):
        next(dec.generate(42, 4))
    with pytest.raises(TypeError, match="DraftState"):
        dec.load_state(b"junk")
    dec.close()
    from llama_cpp._errors import ClosedError

    with pytest.raises(ClosedError):
        dec.prefill([1, 2])

"""Bad requests fail with a clear SpeculativeError before any native call."""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import ClosedError, SpeculativeError
from llama_cpp.speculative import (
    DRAFT_N_MAX_LIMIT,
    MTPDecoder,
    SpecConfig,
    SpeculativeType,
    check_model_file,
    gguf_nextn_layers,
    load_mtp_model,
)

from .util import CTX, greedy_sampler, make_decoder


class NoNativeModel:
    """Stands in for a model: any use (i.e. any native call) fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"model.{name} was used before the configuration was validated")


@pytest.mark.parametrize("value", [0, -1, DRAFT_N_MAX_LIMIT + 1, 1000, True, 2.5, "4", None])
def test_draft_n_max_out_of_range(value):
    with pytest.raises(SpeculativeError, match="draft_n_max"):
        SpecConfig(draft_n_max=value)


@pytest.mark.parametrize("kw, match", [
    ({"draft_n_max": 2, "draft_n_min": 3}, "draft_n_min"),
    ({"draft_n_min": -1}, "draft_n_min"),
    ({"draft_p_min": 1.5}, "draft_p_min"),
    ({"draft_p_min": -0.1}, "draft_p_min"),
    ({"draft_p_min": float("nan")}, "draft_p_min"),
    ({"n_rs_seq": -1}, "n_rs_seq"),
    ({"spec_type": "eagle"}, "unknown spec_type"),
])
def test_bad_config(kw, match):
    with pytest.raises(SpeculativeError, match=match):
        SpecConfig(**kw)


def test_config_names():
    assert SpecConfig("draft-mtp").spec_type is SpeculativeType.DRAFT_MTP
    assert SpecConfig("DRAFT_MTP").spec_type is SpeculativeType.DRAFT_MTP
    assert SpecConfig(SpeculativeType.NONE, draft_n_max=0).enabled is False
    c = SpecConfig(draft_n_max=5)
    assert c.rollback_snapshots == 5 and SpecConfig(draft_n_max=5, n_rs_seq=2).rollback_snapshots == 2


@pytest.mark.parametrize("params, match", [
    ({"n_batch": 4}, "n_batch=4"),
    ({"n_ubatch": 8}, "n_ubatch=8"),
    ({"n_ctx": 9}, "n_ctx=9"),
    ({"n_seq_max": 2}, "n_seq_max"),
    ({"embeddings": True}, "embeddings"),
])
def test_context_too_small_for_the_verify_batch(params, match):
    with pytest.raises(SpeculativeError, match=match):
        MTPDecoder(NoNativeModel(), dict(CTX, **params), SpecConfig(draft_n_max=8))


def test_draft_types_need_their_file_and_the_right_engine():
    with pytest.raises(SpeculativeError, match="needs a draft model"):
        SpecConfig("draft-eagle3")
    with pytest.raises(SpeculativeError, match="draft-mtp"):
        MTPDecoder(NoNativeModel(), dict(CTX), SpecConfig("draft-eagle3", draft_model_path="d.gguf"))
    with pytest.raises(SpeculativeError, match="draft-mtp"):
        MTPDecoder(NoNativeModel(), dict(CTX), SpecConfig("draft-simple", draft_model_path="d.gguf"))
    with pytest.raises(SpeculativeError, match="draft-mtp"):
        MTPDecoder(NoNativeModel(), dict(CTX), SpecConfig("ngram-simple"))
    with pytest.raises(SpeculativeError, match="SpecConfig"):
        MTPDecoder(NoNativeModel(), dict(CTX), {"draft_n_max": 3})


def test_model_without_nextn_layers_file_check(tmp_path):
    spm = fixture_path("llama_spm")
    assert gguf_nextn_layers(spm) == 0
    assert gguf_nextn_layers(fixture_path("qwen35_mtp", form="echo")) == 1
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    assert gguf_nextn_layers(junk) is None
    with pytest.raises(SpeculativeError, match="no NextN"):
        check_model_file(spm, SpecConfig())
    check_model_file(spm, SpecConfig("none", draft_n_max=0))  # nothing asked, nothing checked
    with pytest.raises(SpeculativeError, match="no NextN"):
        load_mtp_model(spm)


def test_model_without_nextn_layers_engine_check():
    from llama_cpp._internals import LlamaModel

    with LlamaModel(fixture_path("llama_spm")) as m:
        m.load_mtp = True  # even claiming it was loaded with MTP: the model has no NextN layers
        with pytest.raises(SpeculativeError, match="no NextN"):
            MTPDecoder(m, dict(CTX), SpecConfig())


def test_model_loaded_without_its_mtp_layers():
    """llama.cpp aborts on an MTP context over skipped NextN tensors: refuse it in Python."""
    from llama_cpp._internals import LlamaModel

    with LlamaModel(fixture_path("qwen35_mtp", form="echo")) as m, \
            pytest.raises(SpeculativeError, match="load_mtp"):  # load_mtp defaults to False
        MTPDecoder(m, dict(CTX), SpecConfig())


def test_misuse_of_a_decoder(mtp_models):
    m = mtp_models["echo"]
    dec = make_decoder(m, draft_n_max=2)
    with pytest.raises(SpeculativeError, match="prefill"):
        next(dec.generate(greedy_sampler(), 4))
    with pytest.raises(ValueError, match="at least one token"):
        dec.prefill([])
    with pytest.raises(Exception, match="vocabulary"):
        dec.prefill([m.n_vocab + 5])
    with pytest.raises(TypeError, match="sampler"):
        dec.prefill([1, 2, 3])
        next(dec.generate(42, 4))
    state = dec.save_state()
    bad = type(state)(**{**state.__dict__, "pending_h": b"\0" * 8})
    with pytest.raises(SpeculativeError, match="hidden row"):
        dec.load_state(bad)
    dec.close()
    dec.close()  # idempotent
    with pytest.raises(ClosedError):
        dec.prefill([1, 2, 3])

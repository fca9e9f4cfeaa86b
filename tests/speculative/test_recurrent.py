"""A pure recurrent target (the compat stand-in Mamba, no attention): every rejected suffix is
rolled back from ``n_rs_seq`` snapshots or a checkpoint, and a recurrent draft model rolls back
its own memory the same way."""

from __future__ import annotations

import pytest

from .util import N_GEN, NGRAM_TYPES, config, dist_sampler, plain_generate, spec_generate

PROMPT = "the cat sat on the mat and the dog sat on the log and the cat sat on the"


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    from build_tools.compat.standins import tiny_mamba
    from llama_cpp._internals import LlamaModel

    path = tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")
    model = LlamaModel(path)
    assert model.is_recurrent()
    yield path, model
    model.close()


@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
@pytest.mark.parametrize("n_rs_seq", (0, 4, None))
def test_ngram_on_a_recurrent_target(mamba, spec_type, n_rs_seq):
    _, model = mamba
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    ref = plain_generate(model, prompt, N_GEN)
    got, st = spec_generate(model, prompt, N_GEN, config(spec_type, 4, n_rs_seq=n_rs_seq))
    assert got == ref, (spec_type, n_rs_seq)
    assert st.rollbacks_checkpoint <= st.checkpoints
    seeded = plain_generate(model, prompt, N_GEN, dist_sampler(2))
    got, _ = spec_generate(model, prompt, N_GEN, config(spec_type, 4, n_rs_seq=n_rs_seq), dist_sampler(2))
    assert got == seeded


@pytest.mark.parametrize("n", (1, 4))
def test_recurrent_model_as_its_own_draft(mamba, n):
    """The draft context is recurrent too: it rolls back its drafted suffix every step."""
    path, model = mamba
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    ref = plain_generate(model, prompt, N_GEN)
    got, st = spec_generate(model, prompt, N_GEN, config("draft-simple", draft_model_path=str(path), draft_n_max=n))
    assert got == ref
    assert st.drafted > 0 and st.acceptance_rate == 1.0


def test_attention_draft_for_a_recurrent_target(mamba):
    from build_tools.fixtures import fixture_path

    _, model = mamba
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    ref = plain_generate(model, prompt, N_GEN)
    got, st = spec_generate(model, prompt, N_GEN, config("draft-simple", draft_model_path=str(fixture_path("llama_spm")),
                                                         draft_n_max=3))
    assert got == ref and st.drafted > 0


def test_recurrent_draft_rolls_back_from_a_checkpoint(mamba, tmp_path):
    """A recurrent draft without n_rs_seq snapshots restores its checkpoint of the history
    instead of re-decoding the whole history after each rejection."""
    from build_tools.compat.standins import tiny_mamba
    from llama_cpp.speculative import make_decoder

    from .util import CTX, greedy_sampler

    _, model = mamba
    other = tiny_mamba(tmp_path / "other-mamba.gguf", seed=1)  # same vocabulary, other weights
    prompt = model.tokenize(PROMPT.encode(), add_special=True)
    ref = plain_generate(model, prompt, N_GEN)
    with make_decoder(model, config("draft-simple", draft_model_path=str(other), draft_n_max=4),
                      ctx_params=dict(CTX)) as dec:
        drafter = dec.drafters[0]
        clears = []
        real_clear = drafter.ctx.memory_clear
        drafter.ctx.memory_clear = lambda data=True: (clears.append(1), real_clear(data))[1]
        dec.prefill(prompt)
        got = list(dec.generate(greedy_sampler(), N_GEN))
        st = dec.stats
    assert got == ref
    assert st.drafted > st.accepted  # rejections happened
    assert clears == []

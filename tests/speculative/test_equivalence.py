"""Every n-gram type, draft-simple and their combinations: the same tokens as plain decoding,
greedy and seeded, on pure-attention and hybrid (recurrent + attention) targets."""

from __future__ import annotations

import pytest

from .conftest import TARGETS, fixture_path  # noqa: F401
from .util import N_GEN, NGRAM_TYPES, PROMPTS, config, dist_sampler, plain_generate, spec_generate

DRAFTS = (1, 3, 8)


@pytest.fixture(scope="module")
def references(targets) -> dict:
    out = {}
    for name, m in targets.items():
        for p in PROMPTS:
            toks = m.tokenize(p.encode(), add_special=True)
            out[name, p] = (toks, plain_generate(m, toks, N_GEN))
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
@pytest.mark.parametrize("m", DRAFTS)
def test_ngram_greedy_equals_plain(targets, references, target, spec_type, m):
    model = targets[target]
    for p in PROMPTS:
        prompt, ref = references[target, p]
        got, st = spec_generate(model, prompt, N_GEN, config(spec_type, m))
        assert got == ref, (target, spec_type, m, p)
        assert st.generated == len(ref) and 0 <= st.accepted <= st.drafted
        assert len(st.drafted_at) <= m


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("form", ("echo", "noisy", "constant"))
@pytest.mark.parametrize("n", DRAFTS)
def test_draft_model_greedy_equals_plain(targets, references, draft_path, target, form, n):
    model = targets[target]
    cfg = config("draft-simple", draft_model_path=str(draft_path(form)), draft_n_max=n)
    for p in PROMPTS:
        prompt, ref = references[target, p]
        got, st = spec_generate(model, prompt, N_GEN, cfg)
        assert got == ref, (target, form, n, p)
        assert len(st.drafted_at) <= n


@pytest.mark.parametrize("target", ("bpe", "echo"))
@pytest.mark.parametrize("types", (["ngram-simple", "ngram-mod"], "ngram-map-k4v,ngram-cache",
                                   ["ngram-cache", "draft-simple"], NGRAM_TYPES))
def test_combined_types_equal_plain(targets, references, draft_path, target, types):
    model = targets[target]
    cfg = config(types, 4, draft_model_path=str(draft_path("noisy")))
    for p in PROMPTS:
        prompt, ref = references[target, p]
        got, st = spec_generate(model, prompt, N_GEN, cfg)
        assert got == ref, (target, types, p)
        assert set(st.drafted_by) <= {t.value for t in cfg.types}
        assert sum(st.drafted_by.values()) == st.drafted and sum(st.accepted_by.values()) == st.accepted


@pytest.mark.parametrize("target", ("echo", "random"))
@pytest.mark.parametrize("n_rs_seq", (0, 1))
def test_checkpoint_rollback_on_hybrid_target(targets, references, draft_path, target, n_rs_seq):
    """Fewer recurrent snapshots than the draft: rejections restore a checkpoint and replay."""
    model = targets[target]
    for cfg in (config("ngram-simple", 8, n_rs_seq=n_rs_seq),
                config("draft-simple", draft_model_path=str(draft_path("noisy")), draft_n_max=4, n_rs_seq=n_rs_seq)):
        for p in PROMPTS:
            prompt, ref = references[target, p]
            got, st = spec_generate(model, prompt, N_GEN, cfg)
            assert got == ref, (target, n_rs_seq, cfg.spec_type, p)
            assert st.rollbacks_checkpoint <= st.checkpoints
            if n_rs_seq == 0:
                assert st.rollbacks_partial == 0


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spec_type", NGRAM_TYPES + ("draft-simple",))
def test_seeded_sampling_equals_plain(targets, draft_path, target, spec_type):
    """Sample and match: one target draw per emitted token, so the same seed gives the same tokens."""
    model = targets[target]
    prompt = model.tokenize(PROMPTS[1].encode(), add_special=True)
    cfg = config(spec_type, 4, draft_model_path=str(draft_path("echo")))
    for seed in (1, 7):
        ref = plain_generate(model, prompt, N_GEN, dist_sampler(seed))
        got, _ = spec_generate(model, prompt, N_GEN, cfg, dist_sampler(seed))
        assert got == ref, (target, spec_type, seed)


@pytest.fixture(scope="module")
def mtp_targets():
    from llama_cpp.speculative import load_mtp_model

    models = {form: load_mtp_model(fixture_path("qwen35_mtp", form=form)) for form in ("echo", "noisy", "random")}
    yield models
    for m in models.values():
        m.close()


@pytest.mark.parametrize("form", ("echo", "noisy", "random"))
@pytest.mark.parametrize("types", (["ngram-simple", "draft-mtp"], ["ngram-mod", "ngram-cache", "draft-mtp"],
                                   ["ngram-map-k", "draft-mtp"]))
def test_ngram_or_draft_model_with_mtp_equals_plain(mtp_targets, draft_path, form, types):
    """n-gram drafts first, the MTP head when they have none (llama.cpp's order)."""
    model = mtp_targets[form]
    for p in PROMPTS:
        prompt = model.tokenize(p.encode(), add_special=True)
        ref = plain_generate(model, prompt, N_GEN)
        for n, n_rs_seq in ((3, None), (4, 1)):
            cfg = config(types, draft_n_max=n, n_rs_seq=n_rs_seq, draft_model_path=str(draft_path("noisy")))
            got, st = spec_generate(model, prompt, N_GEN, cfg)
            assert got == ref, (form, types, n, p)
            assert len(st.drafted_at) <= n
            assert set(st.drafted_by) <= set(types) and sum(st.drafted_by.values()) == st.drafted
        seeded = plain_generate(model, prompt, N_GEN, dist_sampler(4))
        got, _ = spec_generate(model, prompt, N_GEN, config(types, draft_n_max=3,
                                                            draft_model_path=str(draft_path("noisy"))), dist_sampler(4))
        assert got == seeded


@pytest.mark.parametrize("spec_type", ("ngram-simple", "draft-simple"))
def test_generation_budget_and_continuation_on_checkpoint_replays(targets, references, draft_path, spec_type):
    """Every max_tokens from 1 up, then continuing the history: the replay's extra token never
    overshoots the budget, and a continued generation equals a fresh one."""
    from llama_cpp.speculative import make_decoder

    from .util import CTX, greedy_sampler

    model = targets["random"]
    prompt, ref = references["random", PROMPTS[0]]
    cfg = config(spec_type, 4, draft_model_path=str(draft_path("noisy")))
    with make_decoder(model, cfg, ctx_params=dict(CTX)) as dec:
        for n in range(1, 12):
            dec.prefill(prompt)
            got = list(dec.generate(greedy_sampler(), n))
            assert got == ref[:n], (spec_type, n)
        dec.prefill(prompt)
        first = list(dec.generate(greedy_sampler(), 7))
        dec.prefill(prompt + first)
        rest = list(dec.generate(greedy_sampler(), N_GEN - 7))
        assert first + rest == ref
        assert dec.stats.rollbacks_checkpoint > 0


@pytest.mark.parametrize("target", ("bpe", "echo"))
@pytest.mark.parametrize("spec_type", ("ngram-simple", "draft-simple"))
def test_prompt_longer_than_a_batch(targets, draft_path, target, spec_type):
    """Prefill and the draft model's catch-up are split into n_batch chunks."""
    from .util import CTX

    model = targets[target]
    prompt = model.tokenize((" ".join([PROMPTS[0], PROMPTS[1]] * 3)).encode(), add_special=True)
    small = dict(CTX, n_batch=32, n_ubatch=32)
    assert len(prompt) > 2 * small["n_batch"]
    ref = plain_generate(model, prompt, N_GEN)
    got, _ = spec_generate(model, prompt, N_GEN, config(spec_type, 4, draft_model_path=str(draft_path("noisy"))),
                           ctx=small)
    assert got == ref

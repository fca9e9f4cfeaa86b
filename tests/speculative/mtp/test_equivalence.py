"""Greedy MTP output equals plain greedy output and llama.cpp's llama-speculative-simple."""

from __future__ import annotations

import pytest

from .util import FORMS, N_GEN, PROMPTS, dist_sampler, plain_generate, spec_generate

DRAFTS = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def references(mtp_models) -> dict:
    """Plain greedy continuations per (form, prompt)."""
    out = {}
    for form, m in mtp_models.items():
        for p in PROMPTS:
            toks = m.tokenize(p.encode(), add_special=True)
            out[form, p] = (toks, plain_generate(m, toks, N_GEN))
    return out


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("draft_n_max", DRAFTS)
def test_greedy_equals_plain(mtp_models, references, form, draft_n_max):
    m = mtp_models[form]
    for p in PROMPTS:
        prompt, ref = references[form, p]
        got, st = spec_generate(m, prompt, N_GEN, draft_n_max=draft_n_max)
        assert got == ref, (form, draft_n_max, p)
        assert st.generated == len(ref)


@pytest.mark.parametrize("form", ("noisy", "random"))
@pytest.mark.parametrize("n_rs_seq", (0, 1))
def test_checkpoint_rollback_equals_plain(mtp_models, references, form, n_rs_seq):
    """Fewer recurrent snapshots than the draft: rejected suffixes go through checkpoint + replay."""
    m = mtp_models[form]
    for p in PROMPTS:
        prompt, ref = references[form, p]
        got, st = spec_generate(m, prompt, N_GEN, draft_n_max=4, n_rs_seq=n_rs_seq)
        assert got == ref, (form, n_rs_seq, p)
        assert st.rollbacks_checkpoint > 0
        if n_rs_seq == 0:
            assert st.rollbacks_partial == 0
        assert st.checkpoints >= st.rollbacks_checkpoint


@pytest.mark.parametrize("form", FORMS)
def test_p_min_and_n_min_keep_output(mtp_models, references, form):
    m = mtp_models[form]
    prompt, ref = references[form, PROMPTS[0]]
    got, st = spec_generate(m, prompt, N_GEN, draft_n_max=4, draft_p_min=0.3)
    assert got == ref
    got, st = spec_generate(m, prompt, N_GEN, draft_n_max=4, draft_n_min=3)
    assert got == ref
    assert all(d == st.drafted_at[0] for d in st.drafted_at[:3])  # no draft shorter than 3 verified


@pytest.mark.parametrize("form", ("echo", "noisy"))
def test_seeded_sampling_equals_plain(mtp_models, form):
    """Sample-and-match draws one target sample per emitted token: same seed, same tokens."""
    m = mtp_models[form]
    prompt = m.tokenize(PROMPTS[1].encode(), add_special=True)
    for seed in (1, 7):
        ref = plain_generate(m, prompt, N_GEN, dist_sampler(seed))
        got, _ = spec_generate(m, prompt, N_GEN, dist_sampler(seed), draft_n_max=4)
        assert got == ref, seed
        got, _ = spec_generate(m, prompt, N_GEN, dist_sampler(seed), draft_n_max=4, n_rs_seq=0)
        assert got == ref, seed


def _generated_text(stdout: bytes, prompt: str) -> str:
    text = stdout.decode("utf-8", errors="replace").lstrip("\n")
    assert text.startswith(prompt), text[:200]
    return text[len(prompt):]


@pytest.mark.parametrize("form", FORMS)
def test_matches_llama_speculative_simple(mtp_models, mtp_path, references, run_tool, form):
    m = mtp_models[form]
    for p in PROMPTS[:2]:
        prompt, ref = references[form, p]
        ref_text = m.detokenize(ref).decode("utf-8", errors="replace")
        need = len(p) + len(ref_text.strip())
        for dn in DRAFTS:
            got, _ = spec_generate(m, prompt, N_GEN, draft_n_max=dn)
            mine = m.detokenize(got).decode("utf-8", errors="replace")
            assert mine == ref_text
            proc = run_tool("llama-speculative-simple", "-m", mtp_path(form), "--spec-type", "draft-mtp",
                            "--spec-draft-n-max", dn, "--temp", "0", "-p", p, "-n", N_GEN, "-c", 256,
                            "-t", 1, "-tb", 1, "--seed", 1,
                            complete=lambda out, n=need: len(out.decode(errors="replace").strip()) >= n)
            theirs = _generated_text(proc.stdout, p)
            # the tool may overshoot -n by up to one draft; compare over our tokens
            assert theirs.startswith(mine), (form, dn, p, theirs[:200], mine[:200])

"""Acceptance rates land where each fixture's construction puts them, and the counters add up."""

from __future__ import annotations

import itertools

import pytest

from llama_cpp.speculative import SpeculativeStats

from .util import N_GEN, PROMPTS, spec_generate


def _run_all(model, draft_n_max: int, **cfg) -> SpeculativeStats:
    """Stats summed over every prompt."""
    total = SpeculativeStats()
    for p in PROMPTS:
        prompt = model.tokenize(p.encode(), add_special=True)
        _, st = spec_generate(model, prompt, N_GEN, draft_n_max=draft_n_max, **cfg)
        _check_consistent(st, N_GEN, draft_n_max)
        for f in ("steps", "generated", "drafted", "accepted", "draft_steps", "rollbacks_partial",
                  "rollbacks_checkpoint"):
            setattr(total, f, getattr(total, f) + getattr(st, f))
        for j, (d, a) in enumerate(zip(st.drafted_at, st.accepted_at)):
            if j == len(total.drafted_at):
                total.drafted_at.append(0)
                total.accepted_at.append(0)
            total.drafted_at[j] += d
            total.accepted_at[j] += a
    return total


def _check_consistent(st: SpeculativeStats, n_gen: int, draft_n_max: int) -> None:
    assert st.generated == n_gen
    assert 0 <= st.accepted <= st.drafted
    assert sum(st.drafted_at) == st.drafted and sum(st.accepted_at) == st.accepted
    assert len(st.drafted_at) <= draft_n_max
    for j in range(len(st.drafted_at)):
        assert st.accepted_at[j] <= st.drafted_at[j]
        if j:
            # a token at position j is only accepted after every earlier one was
            assert st.accepted_at[j] <= st.accepted_at[j - 1]
            assert st.drafted_at[j] <= st.drafted_at[j - 1]
    # every step emits its accepted drafts plus one target token
    assert st.generated == st.accepted + st.steps
    # a step rolls back exactly when some draft token was rejected
    assert st.rollbacks == st.drafted - st.accepted if draft_n_max == 1 else st.rollbacks <= st.steps
    assert st.draft_steps <= st.steps
    assert 0.0 <= st.acceptance_rate <= 1.0
    assert st.tokens_per_step == pytest.approx(1.0 + st.accepted / st.steps)
    assert st.tokens_per_second > 0
    assert st.t_draft > 0 and st.t_verify > 0 and st.t_generate >= st.t_verify
    d = st.as_dict()
    assert d["acceptance_rate"] == st.acceptance_rate and d["rollbacks"] == st.rollbacks
    assert "accepted" in str(st)


@pytest.mark.parametrize("draft_n_max", (1, 2, 4, 8))
def test_echo_accepts_everything(mtp_models, draft_n_max):
    st = _run_all(mtp_models["echo"], draft_n_max)
    assert st.acceptance_rate == 1.0
    assert st.rollbacks == 0
    assert all(r == 1.0 for r in st.acceptance_rate_at)
    assert st.tokens_per_step > min(draft_n_max, 2) * 0.9


@pytest.mark.parametrize("draft_n_max", (1, 2, 4, 8))
def test_random_accepts_nothing(mtp_models, draft_n_max):
    st = _run_all(mtp_models["random"], draft_n_max)
    assert st.acceptance_rate <= 0.02
    assert st.rollbacks >= st.draft_steps - st.accepted


@pytest.mark.parametrize("draft_n_max", (1, 2, 4, 8))
def test_noisy_accepts_part(mtp_models, draft_n_max):
    st = _run_all(mtp_models["noisy"], draft_n_max)
    assert 0.05 < st.acceptance_rate < 0.95
    assert 0 < st.rollbacks < st.steps


def test_noisy_per_position_rates_non_increasing_on_average(mtp_models):
    st = _run_all(mtp_models["noisy"], 4)
    rates = st.acceptance_rate_at
    assert len(rates) == 4
    # conditional per-position rates may wobble; the trend may not rise
    first, rest = rates[0], rates[1:]
    assert sum(rest) / len(rest) <= first + 1e-9
    # unconditional rates (accepted at j / drafts of full length) never rise
    unconditional = [a / st.drafted_at[0] for a in st.accepted_at]
    assert all(x >= y for x, y in itertools.pairwise(unconditional))


def test_acceptance_falls_with_noise():
    """The noisy head's acceptance drops as its noise grows (the construction's knob)."""
    from build_tools.fixtures import fixture_path
    from llama_cpp.speculative import load_mtp_model

    rates = []
    for noise in (0.0, 0.02, 0.1):
        with load_mtp_model(fixture_path("qwen35_mtp", form="noisy", noise=noise)) as m:
            rates.append(_run_all(m, 2).acceptance_rate)
    assert rates[0] == 1.0
    assert rates[0] > rates[1] > rates[2]


def test_stats_reset():
    st = SpeculativeStats(steps=3, drafted=4, accepted=2, drafted_at=[2, 2], accepted_at=[2, 0])
    assert st.acceptance_rate_at == [1.0, 0.0]
    st.reset()
    assert st == SpeculativeStats()
    assert st.acceptance_rate == 0.0 and st.tokens_per_second == 0.0 and st.mean_accepted_length == 0.0

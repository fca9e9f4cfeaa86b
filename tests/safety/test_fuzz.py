"""The bounded, seeded fuzz run of issue 29 (the longer run: ``python -m tests.safety.fuzz``)."""

from __future__ import annotations

import os

import pytest

from .fuzz import KINDS, run

#: mutants per kind in the bounded run, and its time limit (CI: about two minutes on 2 cores)
BOUNDED = {"gguf": 24, "state": 60, "cache": 40, "template": 200, "grammar": 150, "schema": 200}
BUDGET_S = float(os.environ.get("LLAMA_CPP_FUZZ_BUDGET", "240"))


@pytest.mark.parametrize("seed", [29])
def test_bounded_fuzz_run(seed: int) -> None:
    outcomes = run(seed, BOUNDED, BUDGET_S)
    ran = sum(outcomes.values())
    assert ran >= 0.5 * sum(BOUNDED.values()), f"only {ran} mutants in the budget: {outcomes}"
    kinds = {k.split(":")[0] for k in outcomes}
    assert kinds == set(KINDS), outcomes

"""``draft-eagle3``, ``draft-dflash`` and ``draft-dspark`` in the slot engine: a drafter per slot
sequence (its own draft context), told after every target decode where its slot's rows are among the
per-token outputs. The target is the hybrid ``qwen35_mtp(form="echo")`` fixture (one recurrent layer:
its micro-batches take the slots' tokens in another order than the batch, and rejected rows roll back
through the slots' checkpoints). Four concurrent greedy requests each give what the plain model gives
alone; the ``feature`` drafts depend on the target's layer features, so they draft in the slots what
the same request drafts alone on the serial engine only when every slot reads its own rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from build_tools.fixtures import fixture_path

from .test_slots import assert_kv_matches_bookkeeping
from .test_spec_slots import alone, assert_same, complete, concurrently, speculative

SLOT = {"n_parallel": 4, "n_ctx": 256, "n_batch": 128, "max_queue": 16}
#: alias -> (spec_type, draft fixture, its parameters)
DRAFTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "eagle3-echo": ("draft-eagle3", "eagle3_draft", {"form": "echo"}),
    "eagle3-feature": ("draft-eagle3", "eagle3_draft", {"form": "feature"}),
    "dflash-first": ("draft-dflash", "dflash_draft", {"form": "first"}),
    "dflash-feature": ("draft-dflash", "dflash_draft", {"form": "feature"}),
    "dspark-chain": ("draft-dspark", "dflash_draft", {"form": "first", "markov": "chain"}),
}


def target() -> str:
    return str(fixture_path("qwen35_mtp", form="echo"))


def spec(alias: str) -> dict[str, Any]:
    kind, name, kw = DRAFTS[alias]
    return {"spec_type": kind, "draft_model_path": str(fixture_path(name, **kw)), "draft_n_max": 4}


@pytest.fixture(scope="module")
def srv(start_server):
    """The plain model (the reference); each draft in slots; the feature drafts also on the serial
    engine (what a request drafts alone)."""
    models: list[dict[str, Any]] = [{"model": target(), "model_alias": "plain", **SLOT}]
    models += [{"model": target(), "model_alias": alias, **spec(alias), **SLOT} for alias in DRAFTS]
    models += [{"model": target(), "model_alias": f"{alias}-serial", **spec(alias), **SLOT, "n_parallel": 0}
               for alias in ("eagle3-feature", "dflash-feature")]
    models.append({"model": target(), "model_alias": "small-batch", **spec("dflash-feature"), **SLOT,
                   "n_batch": 16, "n_ubatch": 16})
    models.append({"model": target(), "model_alias": "small-batch-plain", **SLOT, "n_batch": 16, "n_ubatch": 16})
    return start_server(models, max_tokens_limit=200)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from llama_cpp._internals import LlamaModel

    with LlamaModel(target()) as m:
        return [m.tokenize(t, add_special=True) for t in
                (b"the cat sat on the mat and then", b"Hello world, this is a test of",
                 b"one two three four five six seven", b"a")]


@pytest.mark.parametrize("alias", list(DRAFTS))
def test_feature_drafts_in_slots_equal_plain(srv, prompts, alias):
    calls = [{"prompt": p, "stream": i % 2 == 1} for i, p in enumerate(prompts)]
    want = alone(srv, calls)
    got = concurrently(srv, alias, calls)
    assert_same(got, want)
    stats = [speculative(g) for g in got]
    kind = DRAFTS[alias][0]
    assert all(s["drafted_by"].keys() <= {kind} for s in stats)
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    assert drafted > 0
    if alias in ("eagle3-echo", "dspark-chain"):  # the draft predicts the target's greedy chain
        assert accepted == drafted
    else:
        assert 0 < accepted <= drafted
    engine = srv.engine(alias)
    assert not engine.serial
    drafters = [d for ds in engine.spec.seq_drafters for d in ds]  # one per slot, one draft model loaded
    assert len(drafters) == 4 and len({id(d.model) for d in drafters}) == 1
    assert len({id(d.ctx) for d in drafters}) == 4
    assert engine.stats()["speculative"]["drafted_by"].get(kind, 0) >= drafted
    assert_kv_matches_bookkeeping(engine)


@pytest.mark.parametrize("alias", ["eagle3-feature", "dflash-feature"])
def test_slots_draft_what_the_request_drafts_alone(srv, prompts, alias):
    """Drafts that read the target's features: each slot's drafter reads its own rows of the shared
    batch (rows taken from another slot, or in batch order where the micro-batches reorder them, would
    change the drafts)."""
    calls = [{"prompt": p} for p in prompts]
    got = concurrently(srv, alias, calls)
    serial = [complete(srv, f"{alias}-serial", **c) for c in calls]
    assert_same(got, serial)
    for g, s in zip(got, serial):
        a, b = speculative(g), speculative(s)
        assert (a["drafted"], a["accepted"]) == (b["drafted"], b["accepted"])


def test_small_batch_and_a_second_round(srv, prompts):
    """A batch smaller than four prompts and drafts (chunked prefill, drafts cut to the batch), then the
    same prompts again on slots whose drafters already hold a history."""
    calls = [{"prompt": p, "max_tokens": 24} for p in prompts]
    want = alone(srv, calls, "small-batch-plain")
    for _ in range(2):
        assert_same(concurrently(srv, "small-batch", calls), want)
    assert_kv_matches_bookkeeping(srv.engine("small-batch"))


def test_models_report_feature_drafts_in_slots(srv):
    from llama_cpp.server.settings import ModelSettings

    for alias in DRAFTS:
        s = ModelSettings(model=target(), **spec(alias), n_parallel=2)
        assert not s.serial and s.spec_serial_reason is None, alias

"""draft-mtp in the slot engine: a NextN drafter per slot (the table's per-sequence row), on the hybrid ``qwen35_mtp`` fixtures (one recurrent layer: rejected rows roll back through the
slots' checkpoints). Every request gives what it gives alone on the same model without speculation.

``echo``: the NextN head predicts exactly the target's next token (every draft accepted); ``noisy``: a
perturbed head (some accepted, some rejected); ``random``: head and target unrelated (nearly none).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from build_tools.fixtures import fixture_path

from .test_slots import assert_kv_matches_bookkeeping, wait_for
from .test_spec_slots import alone, assert_same, complete, concurrently, speculative

SLOT = {"n_parallel": 4, "n_ctx": 256, "n_batch": 128, "max_queue": 16}
FORMS = ("echo", "noisy", "random")


def model(form: str) -> str:
    return str(fixture_path("qwen35_mtp", form=form))


HEAD_FORMS = ("echo", "noisy")


def heads(form: str) -> str:
    return str(fixture_path("step35_mtp_heads", form=form))


@pytest.fixture(scope="module")
def srv(start_server):
    """Per form: the plain model (the reference) and draft-mtp in slots; a small batch; MTP with an n-gram
    type before it; and the serial MTP engine for the statistics' shape."""
    models: list[dict[str, Any]] = []
    for form in FORMS:
        models.append({"model": model(form), "model_alias": f"{form}-plain", **SLOT})
        models.append({"model": model(form), "model_alias": f"{form}-mtp", "spec_type": "draft-mtp",
                       "draft_n_max": 4, **SLOT})
    models.append({"model": model("noisy"), "model_alias": "small-batch-mtp", "spec_type": "draft-mtp",
                   "draft_n_max": 4, **SLOT, "n_batch": 16, "n_ubatch": 16})
    models.append({"model": model("noisy"), "model_alias": "small-batch-plain", **SLOT, "n_batch": 16,
                   "n_ubatch": 16})
    models.append({"model": model("noisy"), "model_alias": "ngram+mtp", "spec_type": "ngram-simple,draft-mtp",
                   "spec_ngram_simple": {"size_n": 2, "size_m": 8}, "draft_n_max": 4, **SLOT})
    models.append({"model": model("echo"), "model_alias": "serial-mtp", "spec_type": "draft-mtp",
                   "draft_n_max": 4, **SLOT, "n_parallel": 0})
    for form in HEAD_FORMS:  # several chained NextN heads: an MTP draft context per slot
        models.append({"model": heads(form), "model_alias": f"heads-{form}-plain", **SLOT})
        models.append({"model": heads(form), "model_alias": f"heads-{form}-mtp", "spec_type": "draft-mtp",
                       "draft_n_max": 3, **SLOT})
    models.append({"model": heads("noisy"), "model_alias": "heads-noisy-serial", "spec_type": "draft-mtp",
                   "draft_n_max": 3, **SLOT, "n_parallel": 0})
    return start_server(models, max_tokens_limit=200)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from llama_cpp._internals import LlamaModel

    with LlamaModel(model("echo")) as m:
        return [m.tokenize(t, add_special=True) for t in
                (b"the cat sat on the mat and then", b"Hello world, this is a test of",
                 b"one two three four five six seven", b"a")]


@pytest.mark.parametrize("form", FORMS)
def test_mtp_in_slots_equals_plain(srv, prompts, form):
    calls = [{"prompt": p, "stream": i % 2 == 1} for i, p in enumerate(prompts)]
    want = alone(srv, calls, f"{form}-plain")
    got = concurrently(srv, f"{form}-mtp", calls)
    assert_same(got, want)
    stats = [speculative(g) for g in got]
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    assert drafted > 0
    assert all(s["drafted_by"].keys() <= {"draft-mtp"} for s in stats)
    if form == "echo":  # the head is the target's next token: every draft accepted, full drafts of 4
        assert accepted == drafted
        assert all(s["tokens_per_step"] > 3.0 for s in stats)
    elif form == "noisy":  # some accepted, the rest rolled back through the checkpoints
        assert 0 < accepted < drafted
        assert sum(s["rollbacks_checkpoint"] for s in stats) > 0
        assert all(s["rollbacks_partial"] == 0 for s in stats)
    else:  # a target that reads its whole history: a missing or wrong replay would change the output
        assert accepted < drafted // 4
        assert sum(s["rollbacks_checkpoint"] for s in stats) > 0
    engine = srv.engine(f"{form}-mtp")
    assert not engine.serial and _nextn_per_slot(engine)
    assert_kv_matches_bookkeeping(engine)


def test_mtp_in_slots_seeded_sampling_and_grammar(srv, prompts):
    seeded = {"temperature": 0.9, "seed": 11, "top_k": 40, "top_p": 0.95}
    letters = 'root ::= [a-zA-Z ]+'
    calls: list[dict[str, Any]] = [{"prompt": prompts[0], **seeded}, {"prompt": prompts[1], **seeded, "seed": 12,
                                                                        "stream": True},
                                   {"prompt": prompts[2], "grammar": letters}, {"prompt": prompts[0], "max_tokens": 9},
                                   {"prompt": prompts[1], "max_tokens": 1}, {"prompt": prompts[3][:1], "max_tokens": 5}]
    for form in ("echo", "noisy"):
        got = concurrently(srv, f"{form}-mtp", calls)
        assert_same(got, alone(srv, calls, f"{form}-plain"))
        assert all(c.isalpha() or c == " " for c in got[2]["choices"][0]["text"])
        assert got[3]["usage"]["completion_tokens"] == 9
        assert got[4]["usage"]["completion_tokens"] == 1
        assert_kv_matches_bookkeeping(srv.engine(f"{form}-mtp"))


def test_mtp_in_slots_reuses_cached_prompts(srv, prompts):
    """A prompt extending a finished request's (a chat's next turn) keeps its cached prefix: the NextN row of
    its last cached token is kept (or that token decoded again), and the output is still the plain one."""
    first = complete(srv, "noisy-mtp", prompts[0], max_tokens=20)
    assert first["usage"]["completion_tokens"] == 20
    from llama_cpp._internals import LlamaModel

    with LlamaModel(model("noisy")) as m:
        longer = prompts[0] + m.tokenize(first["choices"][0]["text"].encode(), add_special=False) + prompts[2][1:]
    calls = [{"prompt": longer}, {"prompt": prompts[0]}, {"prompt": prompts[0][:-2]}]
    want = alone(srv, calls, "noisy-plain")
    got = []
    for c, w in zip(calls, want):  # one at a time: each lands on the slot that caches its prefix
        got.append(complete(srv, "noisy-mtp", **c))
        assert_same(got[-1:], [w])
    # the next turn reuses the whole first request (recurrent memory cannot drop a suffix: the others start over)
    assert got[0]["usage"]["prompt_tokens_cached"] == 20 + len(prompts[0]) - 1
    assert_kv_matches_bookkeeping(srv.engine("noisy-mtp"))


def test_mtp_small_batch_and_combined_with_ngram(srv, prompts):
    calls = [{"prompt": p, "stream": i == 0} for i, p in enumerate(prompts)]
    got = concurrently(srv, "small-batch-mtp", calls)
    assert_same(got, alone(srv, calls, "small-batch-plain"))
    assert sum(speculative(g)["accepted"] for g in got) > 0
    assert_kv_matches_bookkeeping(srv.engine("small-batch-mtp"))
    rep = [{"prompt": prompts[0] * 3}, *calls[1:]]
    got = concurrently(srv, "ngram+mtp", rep)
    assert_same(got, alone(srv, rep, "noisy-plain"))
    by = srv.engine("ngram+mtp").stats()["speculative"]["drafted_by"]
    assert by.get("draft-mtp", 0) > 0  # and the n-gram type first, where the history repeats
    assert set(by) <= {"ngram-simple", "draft-mtp"}


def test_disconnect_mid_mtp_frees_the_slot(srv, prompts):
    engine = srv.engine("noisy-mtp")
    with httpx.Client(timeout=60) as http:
        body = {"model": "noisy-mtp", "prompt": prompts[0], "max_tokens": 150, "temperature": 0, "stream": True}
        with http.stream("POST", srv.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            assert next(line for line in r.iter_lines() if line.startswith("data:"))
    assert wait_for(lambda: engine.stats()["active"] == 0)
    assert_kv_matches_bookkeeping(engine)
    calls = [{"prompt": prompts[0]}, {"prompt": prompts[1]}]
    assert_same(concurrently(srv, "noisy-mtp", calls), alone(srv, calls, "noisy-plain"))


def test_mtp_in_slots_matches_the_serial_engine(srv, prompts):
    """Where every draft is accepted the slot engine drafts as the serial MTP decoder does, step for step."""
    for p in prompts[:3]:
        slot = speculative(complete(srv, "echo-mtp", p))
        serial = speculative(complete(srv, "serial-mtp", p))
        for k in ("steps", "drafted", "accepted", "generated"):
            assert slot[k] == serial[k], k
    assert srv.engine("serial-mtp").serial


def test_chained_heads_run_in_slots():
    from llama_cpp.server.settings import ModelSettings
    from llama_cpp.speculative import SpecConfig
    from llama_cpp.speculative.slots import slot_unsupported

    s = ModelSettings(model=model("echo"), spec_type="draft-mtp", n_parallel=2)
    assert not s.serial and s.spec_serial_reason is None
    assert slot_unsupported(SpecConfig(spec_type="draft-mtp")) is None
    s = ModelSettings(model=heads("echo"), spec_type="draft-mtp", n_parallel=2)
    assert not s.serial and s.spec_serial_reason is None


@pytest.mark.parametrize("form", HEAD_FORMS)
def test_chained_heads_in_slots_equal_plain(srv, form):
    """Four concurrent greedy requests on a model with three chained NextN heads (step35): each gives the
    plain model's output; ``echo`` heads predict the target's chain (every draft accepted), ``noisy``
    ones some of it."""
    from llama_cpp._internals import LlamaModel

    with LlamaModel(heads("echo")) as m:
        ps = [m.tokenize(t, add_special=True) for t in
              (b"the cat sat on the mat and then", b"Hello world, this is a test of",
               b"one two three four five six seven", b"a")]
    calls = [{"prompt": p, "stream": i % 2 == 1} for i, p in enumerate(ps)]
    want = alone(srv, calls, f"heads-{form}-plain")
    got = concurrently(srv, f"heads-{form}-mtp", calls)
    assert_same(got, want)
    stats = [speculative(g) for g in got]
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    assert drafted > 0 and all(s["drafted_by"].keys() <= {"draft-mtp"} for s in stats)
    if form == "echo":
        assert accepted == drafted
    else:
        assert 0 < accepted < drafted
    engine = srv.engine(f"heads-{form}-mtp")
    assert not engine.serial and _nextn_per_slot(engine)
    assert_kv_matches_bookkeeping(engine)
    # the same prompts again: each slot's draft memory holds another request's pairs, partly reused
    assert_same(concurrently(srv, f"heads-{form}-mtp", calls), want)
    if form == "noisy":  # the heads read the target's rows: each slot drafts what the serial decoder drafts
        for g, c in zip(got, calls):
            a, b = speculative(g), speculative(complete(srv, "heads-noisy-serial", **c))
            assert (a["drafted"], a["accepted"], a["steps"]) == (b["drafted"], b["accepted"], b["steps"])


def _nextn_per_slot(engine) -> bool:
    """Each slot drafts draft-mtp with a NextNDrafter of its own (the table's per-sequence row)."""
    from llama_cpp.speculative.nextn import NextNDrafter

    per = engine.spec.seq_drafters
    return all(any(isinstance(d, NextNDrafter) and d.seq == seq for d in ds) for seq, ds in enumerate(per))


def test_slot_drafters_equal_the_serial_decoders_on_a_history_reading_head(prompts):
    """On the ``random`` fixture the NextN head reads the target's hidden rows: the per-slot drafters of
    several sequences decoded in one target batch (each reading its rows from its first entry, a backlog
    caught up from the rows it observed, a second step after a partial acceptance, a new request on a slot)
    draft what the one-sequence MTP decoder drafts for each history."""
    import numpy as np

    from llama_cpp._internals import LlamaBatch, LlamaContext
    from llama_cpp.speculative import MTPDecoder, SpecConfig, load_mtp_model
    from llama_cpp.speculative.registry import DrafterArgs, find

    cfg = SpecConfig(spec_type="draft-mtp", draft_n_max=4)
    th = {"n_threads": 1, "n_threads_batch": 1}
    # the third history is longer than a batch: its prompt takes two target decodes
    hists = [list(p) for p in prompts[:2]] + [list(prompts[2]) * 5]

    def serial(history: list[int]) -> list[int]:
        with MTPDecoder(m, {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, **th}, cfg) as dec:
            dec.prefill(history)
            nextn = next(d for d in dec.drafters if d.kind == "draft-mtp")
            return nextn.draft(dec.kv_tokens, history[-1], 4)

    with load_mtp_model(model("random")) as m:
        tgt = LlamaContext(m, n_ctx=3 * 256, n_batch=64, n_ubatch=64, n_seq_max=3, kv_unified=True, **th)
        row = find("draft-mtp")
        drafters = [row.build(DrafterArgs(m, cfg, tgt, ctx_params={"n_ctx": 256, **th}, seq=seq, shared={}))
                    for seq in range(3)]
        batch = LlamaBatch(64, 0, 1)
        try:
            assert [d.seq for d in drafters] == [0, 1, 2]

            def decode(rows: list[tuple[int, int, list[int]]]) -> None:  # (seq, pos0, tokens): all kept
                batch.clear()
                firsts = [batch.add_sequence(np.asarray(t, dtype=np.int32), seq, p0, logits=False)[0]
                          for seq, p0, t in rows]
                tgt.decode(batch)
                for (seq, p0, t), f in zip(rows, firsts):
                    drafters[seq].observe(t, p0, f)

            for seq, h in enumerate(hists):  # as the slots: a request's drafter is told its prompt first
                drafters[seq].begin(h[:-1])
            decode([(seq, 0, h[:-1]) for seq, h in enumerate(hists[:2])] + [(2, 0, hists[2][:40])])
            decode([(2, 40, hists[2][40:-1])])
            drafts = [drafters[seq].draft(h[:-1], h[-1], 4) for seq, h in enumerate(hists)]
            assert drafts == [serial(h) for h in hists]
            assert all(len(d) == 4 for d in drafts)
            # verify: the pending token and every draft decoded, the first j drafts kept (j = 0, 1, 2)
            decode([(seq, len(h) - 1, [h[-1], *drafts[seq]]) for seq, h in enumerate(hists)])
            hists = [[*h, *drafts[seq][:seq], hists[(seq + 1) % 3][seq]] for seq, h in enumerate(hists)]
            drafts = [drafters[seq].draft(h[:-1], h[-1], 4) for seq, h in enumerate(hists)]
            assert drafts == [serial(h) for h in hists]
            # a new request on slot 0 sharing part of the last history: its pairs past that part go
            new = [*hists[0][:5], *hists[1][:7]]
            drafters[0].begin(new[:-1])
            keep = 5 if tgt.seq_rm(0, 5, -1) else 0  # (a recurrent layer cannot drop a suffix)
            if not keep:
                tgt.seq_rm(0, -1, -1)
            decode([(0, keep, new[keep:-1])])
            assert drafters[0].draft(new[:-1], new[-1], 4) == serial(new)
        finally:
            batch.close()
            for d in drafters:
                d.close()
            tgt.close()


def test_a_model_without_nextn_layers_is_refused_before_loading():
    from llama_cpp import Llama
    from llama_cpp._errors import SpeculativeError
    from llama_cpp.server.models import ServedModel
    from llama_cpp.server.settings import ModelSettings

    plain = str(fixture_path("draft_model", form="echo"))  # a llama model: no NextN layers
    with pytest.raises(SpeculativeError, match="NextN"):
        Llama(plain, load_mtp=True, n_seq_max=2, verbose=False)
    m = ServedModel(ModelSettings(model=plain, spec_type="draft-mtp", n_parallel=2, n_threads=1, n_threads_batch=1))
    assert not m.serial
    with pytest.raises(SpeculativeError, match="NextN"):
        m.load()
    assert not m.loaded

"""Speculative decoding in the slot engine: concurrent requests on a speculating model give what the
same request gives alone without speculation (greedy and seeded, grammar, stop strings, streaming).

The target is the ``draft_model(form="echo")`` fixture, a pure-attention llama model whose next
token depends only on the current one, so its greedy output runs into a cycle (repetition for the
n-gram types). Drafting for it: the same model (``echo``: every draft accepted), ``noisy`` (some
accepted) and ``constant`` (none accepted). ``qwen35_mtp(form="echo")`` is a hybrid target (one
recurrent layer: rejected rows roll back through per-slot checkpoints) whose own draft fixtures
are ``draft_model`` forms too (its ``draft-mtp`` in slots: tests/server/test_spec_slots_mtp.py).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from build_tools.fixtures import fixture_path
from tests.speculative.util import always_prompt, echo_cycle, partial_prompt

# each free sequence holds exactly the tokens the engine caches: no rejected draft row is left
from .test_slots import assert_kv_matches_bookkeeping, wait_for
from .together import run_together

SMALL = {"spec_ngram_simple": {"size_n": 2, "size_m": 8}, "spec_ngram_map_k": {"size_n": 2, "size_m": 8},
         "spec_ngram_map_k4v": {"size_n": 2, "size_m": 8, "min_hits": 1},
         "spec_ngram_mod": {"n_match": 2, "n_max": 8, "n_min": 1}, "spec_ngram_cache": {"n_draft": 8}}
NGRAM = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFTS = ("echo", "noisy", "constant")
SLOT = {"n_parallel": 4, "n_ctx": 256, "n_batch": 128, "max_queue": 16}
N_GEN = 48


def target() -> str:
    return str(fixture_path("draft_model", form="echo"))


@pytest.fixture(scope="module")
def srv(start_server):
    """One plain model (the reference), one per n-gram type, one per draft form, prompt lookup, draft-mtp,
    draft-eagle3 on a hybrid model (in slots too: tests/server/test_spec_slots_features.py), and speculation
    on a hybrid model."""
    models: list[dict[str, Any]] = [{"model": target(), "model_alias": "plain", **SLOT}]
    models += [{"model": target(), "model_alias": t, "spec_type": t, **SMALL, **SLOT} for t in NGRAM]
    models.append({"model": target(), "model_alias": "ngram-all", "spec_type": ",".join(NGRAM), **SMALL, **SLOT})
    models += [{"model": target(), "model_alias": f"draft-{form}", "spec_type": "draft-simple",
                "draft_model_path": str(fixture_path("draft_model", form=form)), "draft_n_max": 4, **SLOT}
               for form in DRAFTS]
    models.append({"model": target(), "model_alias": "ngram+draft", "spec_type": "ngram-simple,draft-simple",
                   "draft_model_path": str(fixture_path("draft_model", form="noisy")), "draft_n_max": 4,
                   **SMALL, **SLOT})
    # a batch smaller than the prompts and the drafts of four slots: chunked prefill, drafts cut to the batch
    models += [{"model": target(), "model_alias": "small-batch-plain", **SLOT, "n_batch": 16, "n_ubatch": 16},
               {"model": target(), "model_alias": "small-batch", "spec_type": "ngram-simple,draft-simple",
                "draft_model_path": str(fixture_path("draft_model", form="noisy")), "draft_n_max": 4, **SMALL,
                **SLOT, "n_batch": 16, "n_ubatch": 16}]
    models.append({"model": target(), "model_alias": "lookup", "draft_model": "prompt-lookup-decoding",
                   "draft_model_num_pred_tokens": 6, **SLOT})
    hybrid = str(fixture_path("qwen35_mtp", form="echo"))
    models.append({"model": hybrid, "model_alias": "mtp", "spec_type": "draft-mtp", **SLOT})
    models.append({"model": hybrid, "model_alias": "eagle3", "spec_type": "draft-eagle3",
                   "draft_model_path": str(fixture_path("eagle3_draft", form="echo")), "draft_n_max": 3, **SLOT})
    models.append({"model": hybrid, "model_alias": "hybrid-plain", **SLOT})
    models.append({"model": hybrid, "model_alias": "hybrid-ngram", "spec_type": "ngram-simple,ngram-mod",
                   **SMALL, **SLOT})
    models += [{"model": hybrid, "model_alias": f"hybrid-draft-{form}", "spec_type": "draft-simple",
                "draft_model_path": str(fixture_path("draft_model", form=form)), "draft_n_max": 4, **SLOT}
               for form in ("echo", "noisy")]
    # a target whose next token depends on the whole history (the echo ones depend on the last token
    # only), drafting for itself: greedy requests accept everything, sampled ones roll back
    rnd = str(fixture_path("qwen35_mtp", form="random"))
    models.append({"model": rnd, "model_alias": "random-plain", **SLOT})
    models.append({"model": rnd, "model_alias": "random-self", "spec_type": "draft-simple", "draft_model_path": rnd,
                   "draft_n_max": 4, **SLOT})
    return start_server(models, max_tokens_limit=200)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Token prompts: two repeated echo cycles (every n-gram draft right), a cycle broken by another
    token (partly wrong), and a text without repetition."""
    from llama_cpp._internals import LlamaModel

    with LlamaModel(target()) as m:
        text = m.tokenize(b"the cat sat on the mat and then", add_special=True)
        cyc = echo_cycle(m, 513)
        other = next(t for t in text if t not in cyc)
        return [always_prompt(m, 512, 50), always_prompt(m, 511, 30), partial_prompt(m, 513, other), text]


@pytest.fixture(scope="module")
def hybrid_prompts() -> list[list[int]]:
    """The same kinds of prompts for the hybrid echo target."""
    from llama_cpp._internals import LlamaModel

    with LlamaModel(str(fixture_path("qwen35_mtp", form="echo"))) as m:
        text = m.tokenize(b"the cat sat on the mat and then", add_special=True)
        cyc = echo_cycle(m, text[-1])
        other = next(t for t in text if t not in cyc)
        return [always_prompt(m, text[0], 40), partial_prompt(m, text[-1], other), text, always_prompt(m, text[2])]


def complete(srv, model: str, prompt: Any, stream: bool = False, **kw: Any) -> dict[str, Any]:
    """The response of one /v1/completions request (a stream joined: text, finish_reason, usage)."""
    # no repeat penalty by default: it would steer the echo target out of its cycle
    body = {"model": model, "prompt": prompt, "max_tokens": N_GEN, "temperature": 0, "repeat_penalty": 1.0,
            "stream": stream, **kw}
    with httpx.Client(timeout=120) as http:
        if not stream:
            r = http.post(srv.url + "/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()
        text, reason, usage, pieces = "", None, None, 0
        with http.stream("POST", srv.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                text += chunk["choices"][0]["text"]
                pieces += 1
                reason = chunk["choices"][0]["finish_reason"] or reason
                usage = chunk.get("usage") or usage
        return {"choices": [{"text": text, "finish_reason": reason}], "usage": usage, "pieces": pieces}


def concurrently(srv, model: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``complete(srv, model, **call)`` for every call at once (threads released together)."""
    return run_together(lambda call: complete(srv, model, **call), calls)


def alone(srv, calls: list[dict[str, Any]], plain: str = "plain") -> list[dict[str, Any]]:
    """The same calls on the plain model, one at a time."""
    return [complete(srv, plain, **c) for c in calls]


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["choices"][0]["text"] == w["choices"][0]["text"], i
        assert g["choices"][0]["finish_reason"] == w["choices"][0]["finish_reason"], i
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert g["usage"][k] == w["usage"][k], (i, k)


def speculative(resp: dict[str, Any]) -> dict[str, Any]:
    return resp["usage"]["speculative"]


@pytest.mark.parametrize("model", [*NGRAM, "ngram-all"])
def test_ngram_types_in_slots_equal_plain(srv, prompts, model):
    calls = [{"prompt": p, "stream": i % 2 == 1} for i, p in enumerate(prompts)]
    want = alone(srv, calls)
    got = concurrently(srv, model, calls)
    assert_same(got, want)
    # the repeated cycle is drafted right: accepted tokens, several tokens per verify step
    st = speculative(got[0])
    assert st["accepted"] == st["drafted"] > 0
    assert st["generated"] == got[0]["usage"]["completion_tokens"] == N_GEN
    # every step verifies a full draft of 8, the first one drafted right after the prompt
    assert st["steps"] == -(-N_GEN // 9)
    engine = srv.engine(model)
    assert engine.stats()["speculative"]["accepted"] >= st["accepted"]
    assert_kv_matches_bookkeeping(engine)


@pytest.mark.parametrize("form", DRAFTS)
def test_draft_simple_in_slots_equal_plain(srv, prompts, form):
    calls = [{"prompt": p, "stream": i % 2 == 0} for i, p in enumerate(prompts)]
    want = alone(srv, calls)
    got = concurrently(srv, f"draft-{form}", calls)
    assert_same(got, want)
    stats = [speculative(g) for g in got]
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    assert drafted > 0
    if form == "echo":  # the draft is the target: every drafted token is accepted
        assert accepted == drafted
        assert all(s["tokens_per_step"] > 2.0 for s in stats)
    elif form == "constant":  # the draft's token is never the target's
        assert accepted == 0
    else:
        assert 0 < accepted < drafted
    assert_kv_matches_bookkeeping(srv.engine(f"draft-{form}"))


@pytest.mark.parametrize("model", ["ngram+draft", "lookup"])
def test_combined_types_and_prompt_lookup_in_slots(srv, prompts, model):
    calls = [{"prompt": p} for p in prompts]
    got = concurrently(srv, model, calls)
    assert_same(got, alone(srv, calls))
    assert speculative(got[0])["accepted"] > 0
    if model == "ngram+draft":  # the n-gram type drafts first; the draft model where it has nothing
        by = srv.engine(model).stats()["speculative"]["drafted_by"]
        assert by.get("ngram-simple", 0) > 0 and by.get("draft-simple", 0) > 0


@pytest.mark.parametrize("model", ["ngram-all", "draft-noisy"])
def test_seeded_sampling_and_grammar_equal_plain(srv, prompts, model):
    seeded = {"temperature": 0.9, "seed": 11, "top_k": 40, "top_p": 0.95, "repeat_penalty": 1.0}
    letters = 'root ::= [a-zA-Z ]+'
    calls: list[dict[str, Any]] = [{"prompt": prompts[0], **seeded}, {"prompt": prompts[1], **seeded, "seed": 12, "stream": True},
             {"prompt": prompts[0], "grammar": letters}, {"prompt": prompts[3], "grammar": letters, **seeded}]
    calls.append({"prompt": prompts[2], "logprobs": 2})
    got = concurrently(srv, model, calls)
    want = alone(srv, calls)
    assert_same(got, want)
    assert all(c.isalpha() or c == " " for c in got[2]["choices"][0]["text"])
    lp, want_lp = got[4]["choices"][0]["logprobs"], want[4]["choices"][0]["logprobs"]
    assert lp["tokens"] == want_lp["tokens"] and lp["text_offset"] == want_lp["text_offset"]
    assert [sorted(t) for t in lp["top_logprobs"]] == [sorted(t) for t in want_lp["top_logprobs"]]
    assert lp["token_logprobs"] == pytest.approx(want_lp["token_logprobs"], abs=1e-4)


def test_stop_strings_and_limits_mid_draft(srv, prompts):
    """A stop string, max_tokens or end inside an accepted draft ends the request at the plain point
    and leaves no draft row in the slot's cache; a stream still comes in pieces."""
    plain = complete(srv, "plain", prompts[0], max_tokens=40)["choices"][0]["text"]
    stop = plain[len(plain) // 2:len(plain) // 2 + 3]
    calls = [{"prompt": prompts[0], "stop": [stop], "stream": True}, {"prompt": prompts[0], "stop": [stop]},
             {"prompt": prompts[1], "max_tokens": 7}, {"prompt": prompts[2], "max_tokens": 13, "stream": True}]
    want = alone(srv, calls)
    for model in ("draft-echo", "ngram-simple"):
        got = concurrently(srv, model, calls)
        assert_same(got, want)
        assert got[0]["choices"][0]["finish_reason"] == "stop"
        assert got[2]["usage"]["completion_tokens"] == 7
        assert got[3]["pieces"] > 2  # streamed per verified chunk, not in one piece
        assert_kv_matches_bookkeeping(srv.engine(model))
    # the cached prefix of a finished request is reused by the next one: same answer again
    again = complete(srv, "draft-echo", prompts[0], stop=[stop])
    assert again["choices"][0]["text"] == want[1]["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_cached"] > 0


@pytest.mark.parametrize("model", ["hybrid-ngram", "hybrid-draft-echo", "hybrid-draft-noisy"])
def test_hybrid_target_rolls_back_through_checkpoints(srv, hybrid_prompts, model):
    """Recurrent state cannot drop rejected rows: each slot restores its checkpoint and decodes its kept
    tokens again in the next step's batch; the output is still the plain one."""
    calls = [{"prompt": p, "stream": i == 1} for i, p in enumerate(hybrid_prompts)]
    calls.append({"prompt": hybrid_prompts[1], "temperature": 0.8, "seed": 5})
    want = alone(srv, calls, "hybrid-plain")
    got = concurrently(srv, model, calls)
    assert_same(got, want)
    stats = [speculative(g) for g in got]
    assert sum(s["accepted"] for s in stats) > 0
    if model == "hybrid-draft-echo":  # its greedy requests accept every draft (the sampled one need not)
        assert all(s["accepted"] == s["drafted"] for s in stats[:-1])
    else:  # some drafts were rejected: rolled back to a checkpoint and replayed, never partially
        assert sum(s["rollbacks_checkpoint"] for s in stats) > 0
        assert sum(s["replayed_tokens"] for s in stats) > 0
        assert all(s["rollbacks_partial"] == 0 for s in stats)
    # a finished request's cache is what its sequence holds, and the next request reuses it
    assert_kv_matches_bookkeeping(srv.engine(model))
    again = complete(srv, model, **calls[0])
    assert again["choices"][0]["text"] == want[0]["choices"][0]["text"]


def test_history_dependent_hybrid_target(srv, hybrid_prompts):
    """On a target that reads its whole history, a replay that is missing or wrong changes the output."""
    sampled = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}
    calls = [{"prompt": hybrid_prompts[2]}, {"prompt": hybrid_prompts[2], "seed": 1, **sampled},
             {"prompt": hybrid_prompts[1], "seed": 2, **sampled, "stream": True},
             {"prompt": hybrid_prompts[0], "seed": 3, **sampled}]
    want = alone(srv, calls, "random-plain")
    got = concurrently(srv, "random-self", calls)
    assert_same(got, want)
    stats = [speculative(g) for g in got]
    assert stats[0]["accepted"] == stats[0]["drafted"] > 0
    assert sum(s["rollbacks_checkpoint"] for s in stats[1:]) > 0
    assert_kv_matches_bookkeeping(srv.engine("random-self"))


def test_small_batch_cuts_drafts_to_fit(srv, prompts):
    calls = [{"prompt": p, "stream": i == 0} for i, p in enumerate(prompts)]
    got = concurrently(srv, "small-batch", calls)
    assert_same(got, alone(srv, calls, "small-batch-plain"))
    assert sum(speculative(g)["accepted"] for g in got) > 0
    assert_kv_matches_bookkeeping(srv.engine("small-batch"))


@pytest.mark.parametrize("model", ["ngram-all", "draft-noisy", "hybrid-ngram"])
def test_chat_in_slots_equals_plain(srv, model):
    plain = "hybrid-plain" if model.startswith("hybrid") else "plain"
    msgs = [[{"role": "user", "content": "the cat sat on the mat and the cat sat on the mat and the cat"}],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello world, this is a test"}]]

    def chat(alias: str, messages: list[dict[str, str]], stream: bool) -> str:
        c = srv.client()
        kw = {"model": alias, "messages": messages, "max_tokens": 32, "temperature": 0}
        if not stream:
            return c.chat.completions.create(**kw).choices[0].message.content
        return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw))

    want = [chat(plain, m, False) for m in msgs]
    out: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, chat(model, msgs[i % 2], i >= 2)))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [out[i] for i in range(4)] == want + want


def test_disconnect_mid_speculation_frees_the_slot(srv, prompts):
    engine = srv.engine("draft-echo")
    with httpx.Client(timeout=60) as http:
        body = {"model": "draft-echo", "prompt": prompts[0], "max_tokens": 200, "temperature": 0,
                "repeat_penalty": 1.0, "stream": True}
        with http.stream("POST", srv.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            assert next(line for line in r.iter_lines() if line.startswith("data:"))
    assert wait_for(lambda: engine.stats()["active"] == 0)
    assert_kv_matches_bookkeeping(engine)
    calls = [{"prompt": prompts[0]}]
    assert_same([complete(srv, "draft-echo", **calls[0])], alone(srv, calls))


def test_models_report_where_they_speculate(srv, prompts):
    with httpx.Client(timeout=60) as http:
        data = {m["id"]: m for m in http.get(srv.url + "/v1/models").json()["data"]}
    assert "speculative" not in data["plain"]
    for alias in (*NGRAM, "draft-echo", "ngram+draft", "hybrid-ngram", "hybrid-draft-noisy"):
        assert data[alias]["speculative"]["engine"] == "slots", alias
        assert not srv.engine(alias).serial
    assert data["lookup"]["speculative"] == {"types": ["prompt-lookup"], "engine": "slots"}
    assert data["mtp"]["speculative"] == {"types": ["draft-mtp"], "engine": "slots"}
    assert data["eagle3"]["speculative"] == {"types": ["draft-eagle3"], "engine": "slots"}
    assert not srv.engine("eagle3").serial
    r = complete(srv, "eagle3", "the cat sat on the mat", max_tokens=8)
    assert r["usage"]["completion_tokens"] == 8 and "speculative" in r["usage"]


def test_settings_refuse_bad_ngram_parameters():
    from llama_cpp.server.settings import ModelSettings

    with pytest.raises(ValueError, match="size_n"):
        ModelSettings(model=target(), spec_type="ngram-simple", spec_ngram_simple={"size_n": 0})
    with pytest.raises(ValueError, match="n_min"):
        ModelSettings(model=target(), spec_type="ngram-mod", spec_ngram_mod={"n_min": 9, "n_max": 4})
    s = ModelSettings(model=target(), spec_type="ngram-simple", n_parallel=2)
    assert not s.serial and s.spec_serial_reason is None
    s = ModelSettings(model=target(), spec_type="draft-eagle3", n_parallel=2,
                      draft_model_path=str(fixture_path("eagle3_draft", form="echo")))
    assert not s.serial and s.spec_serial_reason is None




def test_draft_with_another_vocabulary_is_refused_at_load():
    from llama_cpp._errors import SpeculativeError
    from llama_cpp.server.models import ServedModel
    from llama_cpp.server.settings import ModelSettings

    bad = str(fixture_path("draft_model", form="echo", vocab="renamed"))
    m = ServedModel(ModelSettings(model=target(), spec_type="draft-simple", draft_model_path=bad, n_parallel=2,
                                  n_threads=1, n_threads_batch=1))
    with pytest.raises(SpeculativeError, match="vocabulary"):
        m.load()
    assert not m.loaded
    missing = ModelSettings(model=target(), spec_type="draft-simple", draft_model_path="/nonexistent/draft.gguf",
                            n_parallel=2)
    with pytest.raises(SpeculativeError, match="not a file"):
        ServedModel(missing).load()

"""The prompt cache the slots share: saved states restore the same memory, stay within their limit, a bad
state is only a miss, and conversations moving between slots get the outputs they get without a cache."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama
from llama_cpp.server.engine.prompt_cache import PromptCache

from .conftest import THREADS


def _decode(llama: Llama, tokens: list[int], seq: int) -> np.ndarray:
    """Evaluate ``tokens`` into sequence ``seq`` from position 0; the last row's logits."""
    from llama_cpp._core.context import LlamaBatch

    ctx = llama.native_context()
    with LlamaBatch(len(tokens), 0, 1) as batch:
        batch.add_sequence(np.asarray(tokens, dtype=np.int32), seq, 0, logits="last")
        ctx.decode(batch)
    return np.array(ctx.logits_ith(-1))


def _next_logits(llama: Llama, tok: int, pos: int, seq: int) -> np.ndarray:
    from llama_cpp._core.context import LlamaBatch

    ctx = llama.native_context()
    with LlamaBatch(1, 0, 1) as batch:
        batch.add_sequence(np.asarray([tok], dtype=np.int32), seq, pos, logits="last")
        ctx.decode(batch)
    return np.array(ctx.logits_ith(-1))


@pytest.fixture(scope="module")
def two_seqs(spm_path):
    with Llama(spm_path, n_ctx=512, n_seq_max=2, verbose=False, **THREADS) as llama:
        yield llama


def test_a_restored_state_continues_as_the_original(two_seqs):
    llama = two_seqs
    ctx = llama.native_context()
    toks = llama.tokenize(b"the quick brown fox jumps over the lazy dog and")
    ctx.memory_clear(True)
    _decode(llama, toks, 0)
    want = _next_logits(llama, toks[-1], len(toks), 0)
    ctx.memory_clear(True)
    _decode(llama, toks, 0)
    pc = PromptCache(ctx, 16, exact=False)
    assert pc.save(0, toks) and len(pc) == 1 and pc.size > 0
    assert not pc.save(0, toks[:5])  # a prefix of a saved state is served by it already
    ctx.seq_rm(0, -1, -1)
    saved = pc.best(toks + [toks[-1]], 0)
    assert saved is not None and pc.usable(saved.tokens, toks + [toks[-1]]) == len(toks)
    assert pc.restore(saved, 1)  # into another sequence
    assert len(pc) == 0 and pc.size == 0 and pc.n_tokens == 0
    assert ctx.seq_pos_max(1) + 1 == len(toks)
    got = _next_logits(llama, toks[-1], len(toks), 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ctx.memory_clear(True)


def test_the_cache_stays_within_its_limit_and_evicts_the_oldest(two_seqs):
    llama = two_seqs
    ctx = llama.native_context()
    ctx.memory_clear(True)
    pc = PromptCache(ctx, 1, exact=False)
    prompts = [llama.tokenize(f"prompt number {i} says {'word ' * (8 + i)}".encode()) for i in range(4)]
    sizes = []
    for p in prompts:
        ctx.seq_rm(0, -1, -1)
        _decode(llama, p, 0)
        sizes.append(int(ctx.bindings.llama_state_seq_get_size_ext(ctx.ptr, 0, 0)))
    pc.limit = sizes[0] + sizes[1] + sizes[2] // 2  # room for two states, not three
    for p in prompts:
        ctx.seq_rm(0, -1, -1)
        _decode(llama, p, 0)
        pc.save(0, p)
        assert pc.size <= pc.limit
        assert pc.size == sum(len(e.data) for e in pc.entries)
    assert [e.tokens for e in pc.entries] == prompts[2:]  # least recently saved first out
    assert pc.evicted == 2
    pc.limit = min(sizes) - 1  # one state alone exceeds it: not stored, nothing evicted for it
    before = list(pc.entries)
    ctx.seq_rm(0, -1, -1)
    _decode(llama, prompts[0], 0)
    assert not pc.save(0, prompts[0])
    assert pc.entries == before
    ctx.memory_clear(True)


def test_a_state_that_does_not_restore_is_dropped(two_seqs):
    llama = two_seqs
    ctx = llama.native_context()
    ctx.memory_clear(True)
    toks = llama.tokenize(b"a state that will not restore")
    _decode(llama, toks, 0)
    pc = PromptCache(ctx, -1, exact=False)
    assert pc.save(0, toks)
    saved = pc.entries[0]
    saved.data[:] = b"\xff" * len(saved.data)  # not a state of this context
    assert not pc.restore(saved, 1)
    assert len(pc) == 0 and pc.failed == 1 and pc.size == 0
    assert ctx.seq_pos_max(1) == -1
    ctx.memory_clear(True)


def test_exact_caches_use_only_whole_states():
    pc = PromptCache.__new__(PromptCache)
    pc.exact = True
    assert pc.usable([1, 2, 3], [1, 2, 3, 4]) == 3
    assert pc.usable([1, 2, 3], [1, 2, 3]) == 0  # the last prompt token needs its logits
    assert pc.usable([1, 2, 9], [1, 2, 3, 4]) == 0  # a partial prefix of a recurrent state is no state
    pc.exact = False
    assert pc.usable([1, 2, 9], [1, 2, 3, 4]) == 2
    assert pc.usable([1, 2, 3], [1, 2, 3]) == 2


def _conversations(srv, alias: str, starts: list[str], turns: int, n_gen: int) -> list[list[str]]:
    """Each conversation at once in its own thread: every turn resends its history plus new text."""
    out: list[list[str]] = [[] for _ in starts]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            c = srv.client()
            history = starts[i]
            for t in range(turns):
                r = c.completions.create(model=alias, prompt=history, max_tokens=n_gen, temperature=0)
                out[i].append(r.choices[0].text)
                history += r.choices[0].text + f" then turn {t} of talk {i} went on"
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(starts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return out


STARTS = ["once upon a time there was a small", "The capital of the country is", "hello there my friend, how",
          "in the beginning the cat sat on the", "a b c d e f g", "what is the name of the river"]


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_conversations_moving_between_slots_match_the_cache_off_outputs(start_server, spm_path, kind):
    model = str(spm_path) if kind == "llama" else str(fixture_path("qwen35_mtp", form="random"))
    common = {"model": model, "n_parallel": 2, "n_ctx": 512, "max_queue": 16}
    srv = start_server([{**common, "model_alias": "on"},
                        {**common, "model_alias": "off", "cache_prompt": False}])
    engine = srv.engine("on")
    assert engine.prompt_cache is not None and engine.prompt_cache.exact == (kind == "hybrid")
    starts = STARTS[:5]
    got = _conversations(srv, "on", starts, 3, 8)
    want = _conversations(srv, "off", starts, 3, 8)
    assert got == want
    pc = engine.prompt_cache
    # five conversations on two slots: turns land where another conversation was, and restore their own
    assert pc.saved > 0 and pc.restored > 0 and pc.restored_tokens > 0
    assert engine.counters.prompt_cached >= pc.restored_tokens
    assert srv.engine("off").counters.prompt_cached == 0
    assert pc.size <= pc.limit


def test_cached_tokens_are_reported_in_usage_and_metrics(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 1, "n_ctx": 512}])
    c = srv.client()
    a_msgs = [{"role": "user", "content": "tell me about the sea and the ships on it"}]
    b_msgs = [{"role": "user", "content": "and now something else entirely, about mountains"}]
    first = c.chat.completions.create(model="spm", messages=a_msgs, max_tokens=6, temperature=0)
    c.chat.completions.create(model="spm", messages=b_msgs, max_tokens=6, temperature=0)  # takes the one slot
    a_msgs += [{"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "go on"}]
    again = c.chat.completions.create(model="spm", messages=a_msgs, max_tokens=6, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1 > 0  # restored from the shared cache
    assert srv.engine("spm").prompt_cache.restored >= 1
    import httpx

    text = httpx.get(srv.url + "/metrics").text
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("llamacpp:prompt_cache")}
    assert values["llamacpp:prompt_cache_restored_total"] >= 1
    assert values["llamacpp:prompt_cache_restored_tokens_total"] >= cached
    assert 0 < values["llamacpp:prompt_cache_bytes"] <= values["llamacpp:prompt_cache_limit_bytes"]


def test_cache_ram_zero_turns_the_shared_cache_off(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 2, "n_ctx": 256,
                         "cache_ram": 0}])
    assert srv.engine("spm").prompt_cache is None
    r = srv.client().completions.create(model="spm", prompt="hello", max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize("between", [False, True])
def test_a_hybrid_prompt_that_ends_differently_resumes_at_a_context_checkpoint(start_server, between):
    """Recurrent memory cannot drop the end of a prompt: a checkpoint taken a few tokens before the end
    (as llama-server takes them) is where the next prompt starts, in its slot or through the cache."""
    from llama_cpp.server.engine.prompt_cache import CHECKPOINT_OFFSET

    model = str(fixture_path("qwen35_mtp", form="random"))
    common = {"model": model, "n_parallel": 1, "n_ctx": 512}
    srv = start_server([{**common, "model_alias": "on"}, {**common, "model_alias": "off", "cache_prompt": False}])
    c = srv.client()
    import httpx

    def tokens(text: str) -> list[int]:
        return httpx.post(srv.url + "/extras/tokenize", json={"model": "on", "input": text}).json()["tokens"]

    first = tokens("the river ran past the old mill and the children sat by the water to watch the boats go")
    # the same words in another order: the tiny vocabulary has no others to spare
    second = first[:-2] + [t for t in first[1:] if t != first[-2]][:3]
    assert second[:len(first) - 2] == first[:-2] and second[len(first) - 2] != first[-2]
    c.completions.create(model="on", prompt=first, max_tokens=4, temperature=0)
    if between:  # another prompt takes the only slot: the first one's state goes to the cache
        c.completions.create(model="on", prompt=tokens("a different story about mountains and snow"),
                             max_tokens=4, temperature=0)
    got = c.completions.create(model="on", prompt=second, max_tokens=8, temperature=0)
    want = c.completions.create(model="off", prompt=second, max_tokens=8, temperature=0)
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.prompt_tokens_details.cached_tokens == len(first) - CHECKPOINT_OFFSET
    pc = srv.engine("on").prompt_cache
    assert pc.exact and (pc.restored == 1) == between


def test_saving_a_slot_never_evicts_the_state_about_to_be_restored(two_seqs):
    llama = two_seqs
    ctx = llama.native_context()
    ctx.memory_clear(True)
    a = llama.tokenize(b"the first prompt that will be restored in a moment")
    b = llama.tokenize(b"another prompt which the slot holds now, longer than the first one was")
    _decode(llama, a, 0)
    pc = PromptCache(ctx, 1, exact=False)
    assert pc.save(0, a)
    ctx.seq_rm(0, -1, -1)
    _decode(llama, b, 0)
    size_b = int(ctx.bindings.llama_state_seq_get_size_ext(ctx.ptr, 0, 0))
    pc.limit = pc.size + size_b - 1  # storing b needs a's room
    saved = pc.best(a + [a[-1]], 0)
    assert not pc.save(0, b, pin=saved)
    assert pc.entries == [saved]
    assert pc.save(0, b)  # without the pin the oldest goes, as the limit wants
    assert [e.tokens for e in pc.entries] == [b] and pc.size <= pc.limit
    ctx.memory_clear(True)


def test_several_choices_report_the_prompts_cached_tokens_once(start_server, spm_path):
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 2, "n_ctx": 256}])
    c = srv.client()
    prompt = "the story of the lighthouse keeper and the storm that came in the night"
    first = c.completions.create(model="spm", prompt=prompt, max_tokens=2, temperature=0)
    both = c.completions.create(model="spm", prompt=prompt + " and", max_tokens=2, temperature=0, n=2)
    assert len(both.choices) == 2
    cached = both.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 1 <= cached < both.usage.prompt_tokens


def test_a_failing_cache_is_a_miss_not_an_error(start_server, spm_path, monkeypatch):
    srv = start_server([{"model": str(spm_path), "model_alias": "spm", "n_parallel": 1, "n_ctx": 256}])
    c = srv.client()
    first = "the long road to the sea was empty that morning"
    c.completions.create(model="spm", prompt=first, max_tokens=2, temperature=0)

    def broken(*args, **kw):
        raise RuntimeError("the cache broke")

    monkeypatch.setattr(PromptCache, "save", broken)
    monkeypatch.setattr(PromptCache, "best", broken)
    other = c.completions.create(model="spm", prompt="something unrelated about clouds", max_tokens=4, temperature=0)
    with Llama(spm_path, n_ctx=256, verbose=False, **THREADS) as solo:
        want = solo.create_completion("something unrelated about clouds", max_tokens=4, temperature=0,
                                      repeat_penalty=1.1)
    assert other.choices[0].text == want["choices"][0]["text"]
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_states_under_two_keys_never_serve_each_other(two_seqs):
    """A state is kept with the key it was computed under (a LoRA adapter set's scales): only a prompt
    under the same key reuses it, and the same tokens under another key are a state of their own."""
    llama = two_seqs
    ctx = llama.native_context()
    ctx.memory_clear(True)
    toks = llama.tokenize(b"one prompt computed under two adapter sets")
    a, b = (1.0, 0.0), (0.0, 0.5)
    pc = PromptCache(ctx, -1, exact=False)
    _decode(llama, toks, 0)
    assert pc.save(0, toks, key=a)
    assert not pc.save(0, toks[:4], key=a)  # covered under a
    assert pc.best(toks + [toks[-1]], 0, key=b) is None and pc.best(toks + [toks[-1]], 0) is None
    assert pc.save(0, toks[:4], key=b)  # not covered under b: a state of its own
    assert [e.key for e in pc.entries] == [a, b]
    got = pc.best(toks + [toks[-1]], 0, key=a)
    assert got is not None and got.key == a and got.tokens == toks
    assert pc.best(toks + [toks[-1]], 0, key=b).tokens == toks[:4]
    # a longer state under b replaces b's prefix only, never a's
    assert pc.save(0, toks, key=b)
    assert sorted((e.key, len(e.tokens)) for e in pc.entries) == sorted([(a, len(toks)), (b, len(toks))])
    ctx.memory_clear(True)


def test_a_state_is_saved_only_where_its_copies_cost_less_than_evaluating_it_again(two_seqs):
    """Saves and restores are timed; until two saves are, every state is saved; after that a state is saved
    only where a save and a restore cost less than evaluating its tokens again (a KV cache on an RPC server
    is copied a row per network round trip)."""
    llama = two_seqs
    ctx = llama.native_context()
    ctx.memory_clear(True)
    pc = PromptCache(ctx, -1, exact=False)
    toks = llama.tokenize(b"the ships came into the harbour one by one as the sun went down")
    _decode(llama, toks, 0)
    assert pc.worth_saving(len(toks), 1.0) and pc.copy_cost() is None
    assert pc.save(0, toks) and len(pc.save_s) == 1 and pc.save_s[0] > 0
    assert pc.restore(pc.entries[0], 1) and len(pc.restore_s) == 1
    ctx.memory_clear(True)
    pc.save_s, pc.restore_s = [0.5, 0.2], [0.1]  # copies as slow as a remote device's: 0.3 s a round trip
    assert pc.copy_cost() == pytest.approx(0.3)
    assert not pc.worth_saving(10, 0.01)  # 0.1 s to evaluate again
    assert pc.skipped == 1
    assert pc.worth_saving(100, 0.01)  # 1 s to evaluate again
    assert pc.worth_saving(10, None)  # nothing measured: saved, as before
    assert pc.stats()["skipped"] == 1


def test_an_engine_whose_copies_cost_more_saves_nothing_and_answers_the_same(start_server, spm_path, monkeypatch):
    monkeypatch.setattr(PromptCache, "copy_cost", lambda self: 60.0)  # a minute a copy: never worth it
    common = {"model": str(spm_path), "n_parallel": 2, "n_ctx": 512, "max_queue": 16}
    srv = start_server([{**common, "model_alias": "on"},
                        {**common, "model_alias": "off", "cache_prompt": False}])
    starts = STARTS[:4]
    assert _conversations(srv, "on", starts, 2, 6) == _conversations(srv, "off", starts, 2, 6)
    pc = srv.engine("on").prompt_cache
    assert pc.saved == 0 and pc.skipped > 0 and len(pc) == 0 and pc.restored == 0
    import httpx

    text = httpx.get(srv.url + "/metrics").text
    assert f'llamacpp:prompt_cache_skipped_total{{model="on"}} {float(pc.skipped)!r}' in text


def test_a_state_is_restored_only_where_writing_it_back_costs_less_than_evaluating_what_it_skips():
    pc = PromptCache.__new__(PromptCache)
    pc.restore_s = []
    assert pc.worth_restoring(4, 0.01)  # nothing timed yet
    pc.restore_s = [0.3, 0.2]
    assert not pc.worth_restoring(10, 0.01) and pc.worth_restoring(30, 0.01)
    assert pc.worth_restoring(10, None)

"""Upstream's ``LlamaPromptLookupDecoding`` as the n-gram type ``prompt-lookup`` of the speculative engine.

``Llama(draft_model=LlamaPromptLookupDecoding(...))`` drafts what the object itself proposes, through
:class:`~llama_cpp.speculative.engine.DraftDecoder`: the output is plain decoding's on attention and hybrid
targets, stats are reported, and it combines with ``speculative=``. Any other ``LlamaDraftModel`` drafts as the type
``llama-draft-model`` through the same verify loop.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import SpeculativeError
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
from llama_cpp.speculative import SpecConfig, SpeculativeType, make_decoder

from .util import CTX, SMALL, greedy_sampler, plain_generate

Llama = pytest.importorskip("llama_cpp.llama").Llama
KW = {"n_ctx": 512, "n_batch": 128, "n_ubatch": 128, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
PROMPT = "the cat sat on the mat and the dog sat on the log and the cat sat on the"
TARGETS = {"bpe": ("llama_bpe", {}), "echo": ("qwen35_mtp", {"form": "echo"})}


class Recording(LlamaPromptLookupDecoding):
    """Upstream's lookup, remembering every history it was asked about and its answer."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls: list[tuple[list[int], list[int]]] = []

    def __call__(self, input_ids, /, **kwargs):
        out = super().__call__(input_ids, **kwargs)
        self.calls.append((np.asarray(input_ids).tolist(), np.asarray(out).tolist()))
        return out


def _path(target: str):
    name, kw = TARGETS[target]
    return fixture_path(name, **kw)


def _text(resp) -> str:
    return resp["choices"][0]["text"]


def test_the_drafter_proposes_what_the_class_proposes():
    from llama_cpp.speculative.ngram import PromptLookup

    rng = random.Random(3)
    for _ in range(300):
        hist = [rng.randrange(6) for _ in range(rng.randrange(0, 40))]
        last = rng.randrange(6)
        size, n = rng.randrange(1, 4), rng.randrange(1, 9)
        lookup = LlamaPromptLookupDecoding(size, n)
        want = LlamaPromptLookupDecoding.find_candidate_pred_tokens(np.array(hist + [last], dtype=np.intc), size, n)
        assert PromptLookup(lookup, n).draft(hist, last) == want.tolist()


@pytest.mark.parametrize("target", TARGETS)
def test_llama_output_equals_plain_with_stats(target):
    """Attention (bpe) and hybrid (echo, rolled back by checkpoints) targets."""
    lookup = Recording(max_ngram_size=2, num_pred_tokens=6)
    with Llama(_path(target), **KW) as plain, Llama(_path(target), draft_model=lookup, **KW) as spec:
        assert spec.draft_model is lookup
        drafted = 0
        for p in (PROMPT, "Once upon a time"):
            ref = plain.create_completion(p, max_tokens=32, temperature=0)
            got = spec.create_completion(p, max_tokens=32, temperature=0)
            assert _text(got) == _text(ref) and got["usage"] == ref["usage"]
            st = spec.last_speculative_stats
            assert st is not None and st.generated == got["usage"]["completion_tokens"]
            assert set(st.drafted_by) <= {"prompt-lookup"} and st.drafted_by.get("prompt-lookup", 0) == st.drafted
            drafted += st.drafted
        assert drafted > 0
        chunks = list(spec.create_completion(PROMPT, max_tokens=32, temperature=0, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == _text(plain.create_completion(
            PROMPT, max_tokens=32, temperature=0))
        kw = {"max_tokens": 20, "temperature": 0.8, "seed": 5, "repeat_penalty": 1.1}
        assert _text(spec.create_completion(PROMPT, **kw)) == _text(plain.create_completion(PROMPT, **kw))
        # every history the object saw is the sequence so far (the pending token included), and the
        # drafts are its own answers, unchanged
        toks = spec.tokenize(PROMPT.encode())
        for hist, out in lookup.calls:
            assert out == LlamaPromptLookupDecoding.find_candidate_pred_tokens(
                np.array(hist, dtype=np.intc), 2, 6).tolist()
        assert any(h[:len(toks)] == toks for h, _ in lookup.calls)
        if target == "echo":  # hybrid memory without snapshots: rejected drafts go through checkpoints
            st = spec.last_speculative_stats
            assert st.rollbacks == st.rollbacks_checkpoint


def test_each_step_verifies_the_objects_answer():
    """One call per verify step, and the step verifies that call's whole answer (the token budget
    may cut the last one)."""
    lookup = Recording(2, 6)
    with Llama(_path("bpe"), draft_model=lookup, **KW) as m:
        ks: list[int] = []
        st = m.sequence.spec.stats
        count = st.count_draft

        def counted(k, n_acc, kind=None):
            ks.append(k)
            count(k, n_acc, kind)

        st.count_draft = counted
        m.create_completion(PROMPT, max_tokens=40, temperature=0)
    answers = [len(out) for _, out in lookup.calls]
    # a step with no budget left for a draft (the last) asks nobody
    assert len(answers) <= len(ks) <= len(answers) + 1 and sum(ks) > 0
    assert ks[:len(answers) - 1] == answers[:-1] and ks[len(answers) - 1] <= answers[-1]


def test_combined_with_speculative_and_named_by_specconfig():
    path = _path("echo")
    lookup = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=4)
    with Llama(path, **KW) as plain, \
            Llama(path, draft_model=lookup, speculative=SpecConfig("ngram-mod", **SMALL), **KW) as both:
        for p in (PROMPT, "Once upon a time there was a test, and once upon a time there was"):
            ref = plain.create_completion(p, max_tokens=32, temperature=0)
            assert _text(both.create_completion(p, max_tokens=32, temperature=0)) == _text(ref)
            assert set(both.last_speculative_stats.drafted_by) <= {"prompt-lookup", "ngram-mod"}
        assert both.speculative.types == (SpeculativeType.NGRAM_MOD,)  # the caller's config is kept
    # SpecConfig names it: the same drafts as the object with those parameters
    from llama_cpp._internals import LlamaModel

    with LlamaModel(str(path)) as model:
        prompt = model.tokenize(PROMPT.encode(), add_special=True)
        ref = plain_generate(model, prompt, 32)
        stats = []
        for cfg, obj in ((SpecConfig("prompt-lookup", prompt_lookup={"max_ngram_size": 3, "num_pred_tokens": 4}),
                          None), (SpecConfig("prompt-lookup"), LlamaPromptLookupDecoding(3, 4))):
            with make_decoder(model, cfg, ctx_params=dict(CTX), prompt_lookup=obj) as dec:
                dec.prefill(prompt)
                assert list(dec.generate(greedy_sampler(), 32)) == ref
                stats.append((dec.stats.drafted_at, dec.stats.accepted_at))
        assert stats[0] == stats[1] and stats[0][0]


class Lookup(LlamaDraftModel):
    """A custom draft model (not upstream's prompt-lookup class): upstream's lookup, called through."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, input_ids, /, **kwargs):
        self.calls += 1
        return LlamaPromptLookupDecoding.find_candidate_pred_tokens(input_ids, 2, 8)


@pytest.mark.parametrize("target", TARGETS)
def test_custom_draft_models_run_the_one_verify_loop(target):
    """A user's ``LlamaDraftModel`` is a drafter of the speculative decoder: greedy output is plain
    greedy's, its drafts are counted under ``llama-draft-model``, on attention and hybrid targets."""
    from llama_cpp.speculative import DraftDecoder
    from llama_cpp.speculative.upstream import LlamaDraftModelDrafter

    draft = Lookup()
    with Llama(_path(target), **KW) as plain, Llama(_path(target), draft_model=draft, **KW) as m:
        assert isinstance(m.sequence.spec, DraftDecoder)
        assert [type(d) for d in m.sequence.spec.drafters] == [LlamaDraftModelDrafter]
        for p in (PROMPT, "Once upon a time"):
            ref = plain.create_completion(p, max_tokens=32, temperature=0)
            got = m.create_completion(p, max_tokens=32, temperature=0)
            assert _text(got) == _text(ref) and got["usage"] == ref["usage"]
            st = m.last_speculative_stats
            assert st.generated == got["usage"]["completion_tokens"]
            assert set(st.drafted_by) <= {"llama-draft-model"}
        m.create_completion(PROMPT, max_tokens=32, temperature=0)
        st = m.last_speculative_stats
        assert draft.calls > 0 and st.drafted_by == {"llama-draft-model": st.drafted} and st.drafted > 0
    # combined with speculative=: both rows in one decoder, the object asked first
    with Llama(_path(target), draft_model=Lookup(), speculative=SpecConfig("ngram-simple", **SMALL), **KW) as m:
        assert [d.kind for d in m.sequence.spec.drafters] == ["llama-draft-model", "ngram-simple"]
        assert _text(m.create_completion(PROMPT, max_tokens=32, temperature=0)) == _text(
            plain_completion(target, PROMPT, 32))


def plain_completion(target, prompt, n):
    with Llama(_path(target), **KW) as plain:
        return plain.create_completion(prompt, max_tokens=n, temperature=0)


def test_the_draft_model_type_needs_its_object():
    from llama_cpp._internals import LlamaModel

    with LlamaModel(str(_path("bpe"))) as model, pytest.raises(SpeculativeError, match="Llama\\(draft_model="):
        make_decoder(model, SpecConfig("llama-draft-model"), ctx_params=dict(CTX))


def test_prompt_lookup_config_errors():
    for bad in ({"max_ngram_size": 0}, {"num_pred_tokens": 0}, {"num_pred_tokens": 2.5}, {"bogus": 1}):
        with pytest.raises(SpeculativeError, match="prompt_lookup"):
            SpecConfig("prompt-lookup", prompt_lookup=bad)
    cfg = SpecConfig("prompt-lookup,ngram-simple,draft-simple", draft_model_path="d.gguf")
    assert cfg.types[0] is SpeculativeType.PROMPT_LOOKUP and cfg.n_max == max(10, cfg.ngram_simple.size_m, 3)


@pytest.mark.parametrize("target", TARGETS)
def test_replacing_the_draft_model_after_construction(target):
    """Upstream reads ``draft_model`` at each generation: assigning one rebuilds the decoder, which then
    drafts with the new object (a custom one, a lookup, one added to a Llama made without); None turns
    drafting off. The output stays plain decoding's throughout."""
    with Llama(_path(target), **KW) as plain, Llama(_path(target), draft_model=LlamaPromptLookupDecoding(), **KW) as m:
        ref = _text(plain.create_completion(PROMPT, max_tokens=20, temperature=0))
        assert _text(m.create_completion(PROMPT, max_tokens=20, temperature=0)) == ref
        assert set(m.last_speculative_stats.drafted_by) <= {"prompt-lookup"}
        custom = Lookup()
        m.draft_model = custom
        assert m.draft_model is custom and m.__getstate__()["draft_model"] is custom  # pickled as it is now
        assert _text(m.create_completion(PROMPT, max_tokens=20, temperature=0)) == ref
        st = m.last_speculative_stats
        assert custom.calls > 0 and st.drafted_by == {"llama-draft-model": st.drafted} and st.drafted > 0
        lookup = Recording(2, 6)
        m.draft_model = lookup
        assert _text(m.create_completion(PROMPT, max_tokens=20, temperature=0)) == ref
        assert lookup.calls and set(m.last_speculative_stats.drafted_by) <= {"prompt-lookup"}
        m.draft_model = None
        m.last_speculative_stats = None
        assert m.sequence.spec is None
        assert _text(m.create_completion(PROMPT, max_tokens=20, temperature=0)) == ref
        assert m.last_speculative_stats is None
        with pytest.raises(TypeError, match="draft_model"):
            m.draft_model = 42
    with Llama(_path(target), **KW) as m:  # made without a draft model
        custom = Lookup()
        m.draft_model = custom
        assert _text(m.create_completion(PROMPT, max_tokens=20, temperature=0)) == ref
        assert custom.calls > 0 and m.last_speculative_stats.drafted > 0


def test_slots_run_a_named_prompt_lookup(targets):
    """The server's slots draft with ``spec_type="prompt-lookup"`` as with upstream's ``draft_model``."""
    from llama_cpp._internals import LlamaContext
    from llama_cpp.speculative.ngram import PromptLookup
    from llama_cpp.speculative.slots import SlotSpeculation

    model = targets["bpe"]
    with LlamaContext(model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=1, n_threads_batch=1) as ctx:
        named = SlotSpeculation(model, ctx, 2, config=SpecConfig(
            "prompt-lookup", prompt_lookup={"max_ngram_size": 3, "num_pred_tokens": 5}))
        given = SlotSpeculation(model, ctx, 2, prompt_lookup=LlamaPromptLookupDecoding(3, 5))
        prompt = model.tokenize(PROMPT.encode(), add_special=True)
        a, b = named.start(prompt), given.start(prompt)
        assert [type(d) for d in a.drafters] == [PromptLookup] and named.n_max == given.n_max == 5
        assert a.drafters[0].draft(prompt[:-1], prompt[-1]) == b.drafters[0].draft(prompt[:-1], prompt[-1]) != []


def test_slots_ask_the_given_lookup_first(targets):
    """Upstream's object drafts as the ``prompt-lookup`` row ahead of the configured types (as in
    ``Llama``), cut to its own ``num_pred_tokens``; the slots still report the configured types."""
    from llama_cpp._internals import LlamaContext
    from llama_cpp.speculative.ngram import NgramSimple, PromptLookup
    from llama_cpp.speculative.slots import SlotSpeculation

    model = targets["bpe"]
    lookup = LlamaPromptLookupDecoding(2, 7)
    with LlamaContext(model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=1, n_threads_batch=1) as ctx:
        spec = SlotSpeculation(model, ctx, 2, config=SpecConfig("ngram-simple", ngram_simple={"size_m": 3}),
                               prompt_lookup=lookup)
        sd = spec.start(model.tokenize(PROMPT.encode(), add_special=True))
        assert [type(d) for d in sd.drafters] == [PromptLookup, NgramSimple]
        assert sd.drafters[0].fn is lookup and sd.drafters[0].n_max == 7 and spec.n_max == 7
        assert spec.types == ["ngram-simple"]
        assert SlotSpeculation(model, ctx, 2, prompt_lookup=lookup).types == ["prompt-lookup"]


def test_slots_load_ngram_cache_files_once(targets, tmp_path):
    """``ngram-cache``'s files are read when the slots start (a bad one refuses them) and shared by every
    request's drafter."""
    import struct

    from llama_cpp._internals import LlamaContext
    from llama_cpp.speculative.ngram import NgramCache
    from llama_cpp.speculative.slots import SlotSpeculation

    static = tmp_path / "static.bin"
    static.write_bytes(struct.pack("<4ii", 7, 8, -1, -1, 1) + struct.pack("<ii", 9, 5))
    model = targets["bpe"]
    with LlamaContext(model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=1, n_threads_batch=1) as ctx:
        spec = SlotSpeculation(model, ctx, 2, config=SpecConfig(
            "ngram-cache", ngram_cache={"lookup_cache_static": str(static)}))
        a, b = spec.start([1, 7, 8], 0), spec.start([1, 2, 3], 1)
        assert [type(d) for d in a.drafters] == [type(d) for d in b.drafters] == [NgramCache]
        assert a.drafters[0].static is b.drafters[0].static and a.drafters[0].static[(7, 8)] == {9: 5}
        static.write_bytes(b"\x01")
        with pytest.raises(SpeculativeError, match="truncated n-gram cache"):
            SlotSpeculation(model, ctx, 2, config=SpecConfig("ngram-cache", ngram_cache={"lookup_cache_static": str(static)}))

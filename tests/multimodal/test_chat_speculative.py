"""Multimodal chat speculating with the n-gram types and ``draft-simple`` (and lists of them), as
llama.cpp's server does on media prompts: the drafters see the text tokens, a draft model mirrors
the target's memory media rows included. Greedy and seeded outputs must be plain decoding's.

Targets: ``llama_spm`` (attention only, one position per row, random weights: few n-gram drafts)
and ``qwen35_mtp`` (hybrid, M-RoPE; ``echo`` repeats a short cycle, so the n-gram types draft and
are accepted). ``draft-simple`` drafts with the target's own file: a draft that sees exactly what the
target saw, the image's rows included, is always right (every draft accepted).
"""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import ContextOverflowError, SpeculativeError
from llama_cpp.mtmd_chat import (
    MEDIA_TOKEN,
    MediaDraftModel,
    MediaHistory,
    MultimodalChat,
    MultimodalDraftDecoder,
    TextHistoryDrafter,
    check_media_prompt,
)
from llama_cpp.speculative import NgramCacheParams, NgramMapParams, NgramModParams, SpecConfig
from llama_cpp.speculative.drafter import DrafterBase

NGRAM_TYPES = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
SERVED = [*NGRAM_TYPES, "draft-simple", "ngram-simple,ngram-map-k4v,ngram-cache", "ngram-mod,draft-simple"]
CTX = {"n_ctx": 512, "n_batch": 64, "n_threads": 1}


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _prompts(png: bytes, png2: bytes) -> list[list[dict]]:
    """Text around an image, an image first, and two images (two media spans)."""
    img = {"type": "image_url", "image_url": {"url": _url(png)}}
    img2 = {"type": "image_url", "image_url": {"url": _url(png2)}}
    return [
        [{"role": "system", "content": "You look at images."},
         {"role": "user", "content": [{"type": "text", "text": "one two three one two three"}, img,
                                      {"type": "text", "text": "one two three, answer briefly"}]}],
        [{"role": "user", "content": [img, {"type": "text", "text": "describe it"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "compare"}, img, {"type": "text", "text": "and"},
                                      img2, {"type": "text", "text": "which is brighter?"}]}],
    ]


def _spec(spec_type: str, n: int, model) -> SpecConfig:
    """``spec_type`` drafting up to ``n`` tokens; n-grams short enough to match in a short chat."""
    kw = {"draft_model_path": str(model)} if "draft-simple" in spec_type else {}
    ngram = NgramMapParams(size_n=2, size_m=n)
    return SpecConfig(spec_type=spec_type, draft_n_max=n, ngram_simple=ngram, ngram_map_k=ngram,
                      ngram_map_k4v=ngram, ngram_mod=NgramModParams(n_match=2, n_max=n, n_min=1),
                      ngram_cache=NgramCacheParams(n_draft=n), **kw)


@pytest.fixture(scope="module")
def models():
    return {"spm": fixture_path("llama_spm"), "qwen35": fixture_path("qwen35_mtp", form="echo")}


@pytest.fixture(scope="module")
def prompts(png_path, png2):
    return _prompts(png_path.read_bytes(), png2)


@pytest.fixture(scope="module")
def plain(models, prompts, mmproj_vision):
    """Greedy tokens without speculation, per model and prompt."""
    out = {}
    for name, path in models.items():
        with MultimodalChat(path, mmproj_vision, **CTX) as chat:
            out[name] = [list(chat.generate_tokens(m, max_tokens=40, temperature=0)) for m in prompts]
    return out


@pytest.mark.parametrize("model_name", ["spm", "qwen35"])
@pytest.mark.parametrize("spec_type", [*SERVED, "draft-mtp,ngram-map-k"])
def test_greedy_with_images_equals_plain(spec_type, model_name, models, prompts, plain, mmproj_vision):
    if "draft-mtp" in spec_type and model_name == "spm":
        pytest.skip("llama_spm has no NextN layers")
    path = models[model_name]
    for n in (2, 5):
        with MultimodalChat(path, mmproj_vision, speculative=_spec(spec_type, n, path), **CTX) as chat:
            drafted = accepted = by_model = by_model_ok = 0
            for i, msgs in enumerate(prompts):
                toks = list(chat.generate_tokens(msgs, max_tokens=40, temperature=0))
                assert toks == plain[model_name][i], f"{spec_type} n={n} prompt {i}"
                st = chat.last_speculative_stats
                assert st.generated == len(toks) and 0 <= st.accepted <= st.drafted
                drafted, accepted = drafted + st.drafted, accepted + st.accepted
                by_model += st.drafted_by.get("draft-simple", 0)
                by_model_ok += st.accepted_by.get("draft-simple", 0)
        if "draft-simple" in spec_type:
            # the draft is the target's own file: it agrees wherever it saw what the target saw
            assert by_model_ok == by_model > 0, f"{spec_type} n={n}"
        elif model_name == "qwen35" and spec_type != "ngram-cache":
            # the echo target repeats a cycle, which the n-gram types draft (ngram-cache's count
            # thresholds accept none of it on the text path either)
            assert accepted > 0 and drafted > 0, f"{spec_type} n={n}"


@pytest.mark.parametrize("spec_type", SERVED)
def test_chat_completion_and_stream_equal_plain(spec_type, models, prompts, mmproj_vision):
    path = models["qwen35"]
    msgs = prompts[0]
    with MultimodalChat(path, mmproj_vision, **CTX) as chat:
        ref = chat.create_chat_completion(msgs, max_tokens=30, temperature=0)
    with MultimodalChat(path, mmproj_vision, speculative=_spec(spec_type, 4, path), **CTX) as chat:
        full = chat.create_chat_completion(msgs, max_tokens=30, temperature=0)
        assert full["choices"][0]["message"] == ref["choices"][0]["message"]
        assert full["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"] == 30
        parts = list(chat.create_chat_completion(msgs, max_tokens=30, temperature=0, stream=True))
        text = "".join(p["choices"][0]["delta"].get("content", "") for p in parts)
        assert text == ref["choices"][0]["message"]["content"]
        assert parts[-1]["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
        st = chat.last_speculative_stats
        assert st.generated == 30 and 0 <= st.accepted <= st.drafted


@pytest.mark.parametrize("model_name", ["spm", "qwen35"])
@pytest.mark.parametrize("spec_type", SERVED)
def test_seeded_sampling_equals_plain(spec_type, model_name, models, prompts, mmproj_vision):
    path = models[model_name]
    kw = {"max_tokens": 24, "temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    with MultimodalChat(path, mmproj_vision, **CTX) as chat:
        ref = [chat.create_chat_completion(m, seed=s, **kw)["choices"][0]["message"]["content"]
               for m in prompts for s in (7, 11)]
    assert len(set(ref)) > 1  # the seeds matter
    with MultimodalChat(path, mmproj_vision, speculative=_spec(spec_type, 3, path), **CTX) as chat:
        got = [chat.create_chat_completion(m, seed=s, **kw)["choices"][0]["message"]["content"]
               for m in prompts for s in (7, 11)]
    assert got == ref


@pytest.mark.parametrize("spec_type", ["ngram-map-k", "draft-simple"])
def test_context_overflow_and_full_context(spec_type, models, prompts, mmproj_vision):
    path = models["qwen35"]
    long = [{"role": "user", "content": [{"type": "text", "text": "word " * 300},
                                         prompts[1][0]["content"][0]]}]
    fit = [{"role": "user", "content": [{"type": "text", "text": "word " * 150},
                                        prompts[1][0]["content"][0]]}]
    ctx = {**CTX, "n_ctx": 256}
    with MultimodalChat(path, mmproj_vision, **ctx) as chat:
        n_ctx = chat._ctx.n_ctx()
        chunks, _ = chat.tokenize_messages(long)
        assert chunks.n_tokens > n_ctx
        chunks.close()
        ref = list(chat.generate_tokens(fit, temperature=0))  # every position left
        chunks, _ = chat.tokenize_messages(fit)
        room = n_ctx - chunks.n_tokens
        chunks.close()
    assert 0 < len(ref) == room
    with MultimodalChat(path, mmproj_vision, speculative=_spec(spec_type, 4, path), **ctx) as chat:
        with pytest.raises(ContextOverflowError, match=f"n_ctx is {n_ctx}"):
            list(chat.generate_tokens(long, temperature=0))
        assert chat._spec.target.seq_pos_max(0) == -1  # refused before anything was decoded
        assert list(chat.generate_tokens(fit, temperature=0)) == ref
        assert chat.last_speculative_stats.drafted > 0
        assert list(chat.generate_tokens(fit, temperature=0, max_tokens=room + 10)) == ref


def test_drafters_see_the_text_tokens(models, prompts, mmproj_vision):
    """The n-gram drafters get the text history, media positions dropped (llama.cpp's
    ``get_text_tokens()``), in begin() and in every draft."""

    class Recorder(DrafterBase):
        kind, n_max = "recorder", 4

        def __init__(self) -> None:
            self.begun: list[list[int]] = []
            self.seen: list[list[int]] = []

        def reset(self) -> None:
            pass

        def begin(self, prompt):
            self.begun.append(list(prompt))

        def draft(self, prompt, id_last):
            self.seen.append([*prompt, id_last])
            return []

        def accept(self, n):
            pass

    path = models["spm"]
    with MultimodalChat(path, mmproj_vision, speculative=_spec("ngram-simple", 4, path), **CTX) as chat:
        rec = Recorder()
        wrapper = chat._spec.drafters[0]
        assert isinstance(wrapper, TextHistoryDrafter)
        wrapper.inner = rec
        for msgs in prompts[::2]:
            chunks, _ = chat.tokenize_messages(msgs)
            text = [int(t) for c in chunks if not c.is_media for t in c.tokens]
            assert any(c.is_media for c in chunks)
            chunks.close()
            rec.seen.clear()
            toks = list(chat.generate_tokens(msgs, max_tokens=6, temperature=0))
            assert rec.begun[-1] == text[:-1]
            assert [s for s in rec.seen] == [text + toks[:i] for i in range(len(rec.seen))]
            assert len(rec.seen) == 5  # one ask per step but the last (no room for a draft)


def test_text_history_positions():
    """Media runs map history positions to text positions (rewind) and are folded in as they come."""

    class Inner(DrafterBase):
        kind, n_max = "inner", 2

        def __init__(self) -> None:
            self.calls: list = []

        def reset(self):
            pass

        def begin(self, prompt):
            self.calls.append(("begin", prompt))

        def rewind(self, n):
            self.calls.append(("rewind", n))

        def draft(self, prompt, id_last):
            self.calls.append(("draft", list(prompt), id_last))
            return [7]

        def accept(self, n):
            pass

    M = MEDIA_TOKEN
    w = TextHistoryDrafter(Inner())
    hist = [5, 6, M, M, M, 8, M, 9]
    w.begin(hist)
    assert w.inner.calls[-1] == ("begin", [5, 6, 8, 9])
    assert [w.text_len(n) for n in range(9)] == [0, 1, 2, 2, 2, 2, 3, 3, 4]
    assert w.draft([*hist, 10], 11) == [7] and w.inner.calls[-1] == ("draft", [5, 6, 8, 9, 10], 11)
    w.rewind(4)
    assert w.inner.calls[-1] == ("rewind", 2)
    w.begin([1, M, 2])
    assert w.inner.calls[-1] == ("begin", [1, 2]) and w.text_len(3) == 2


def test_media_cells_beyond_positions():
    """M-RoPE image rows may share positions: the context room counts their cells."""
    text = SimpleNamespace(is_media=False, n_tokens=10, n_pos=10)
    img = SimpleNamespace(is_media=True, n_tokens=64, n_pos=8)
    assert check_media_prompt([text, img, text], 84) == 56
    with pytest.raises(ContextOverflowError, match="84 tokens"):
        check_media_prompt([text, img, text], 83)
    with pytest.raises(Exception, match="must end with text"):
        check_media_prompt([text, img], 512)
    h = MediaHistory()
    h.n_ctx = 100
    h._excess = 56
    assert h.n_ctx == 44  # positions left to the history


@pytest.mark.parametrize("model_name", ["spm", "qwen35"])
def test_draft_memory_mirrors_the_target(model_name, models, prompts, mmproj_vision):
    """The draft context holds the target's positions, media spans included (target rows)."""
    path = models[model_name]
    with MultimodalChat(path, mmproj_vision, speculative=_spec("draft-simple", 3, path), **CTX) as chat:
        dec = chat._spec
        assert isinstance(dec, MultimodalDraftDecoder)
        chunks, _ = chat.tokenize_messages(prompts[2])
        try:
            dec.prefill_chunks(chat.mtmd, chunks)
            n_media = sum(c.n_pos for c in chunks if c.is_media)
            kv = dec.kv_tokens
            assert len(kv) == chunks.n_pos - 1 and kv.count(MEDIA_TOKEN) == n_media
            assert dec.target.seq_pos_max(0) == len(kv) - 1
            d = dec.drafters[0]
            assert isinstance(d, MediaDraftModel)
            assert len(d.draft(kv, dec.history[-1], 1)) == 1
            assert d.inner.kv_tokens == dec.history  # the pending token is decoded there to draft after it
            assert d.inner.ctx.seq_pos_max(0) == len(kv)
        finally:
            chunks.close()


@pytest.mark.parametrize("model_name", ["spm", "qwen35_random"])
def test_media_rows_reach_the_draft(model_name, models, prompts, mmproj_vision, monkeypatch):
    """A draft with the target's weights agrees with it after the image only when it saw the
    image's rows at the target's positions; fed zero rows (llama.cpp's fallback when widths
    differ) it drafts worse after them, and the output stays the target's. (The echo target's
    next token ignores the context: the random-weight targets are the ones that tell.)"""
    path = fixture_path("qwen35_mtp", form="random") if model_name == "qwen35_random" else models[model_name]
    msgs = prompts[1]
    with MultimodalChat(path, mmproj_vision, **CTX) as chat:
        ref = list(chat.generate_tokens(msgs, max_tokens=40, temperature=0))
    stats = []
    for zero in (False, True):
        if zero:
            monkeypatch.setattr(MediaDraftModel, "_rows_for", lambda self, sp, width: None)
        with MultimodalChat(path, mmproj_vision, speculative=_spec("draft-simple", 4, path), **CTX) as chat:
            assert list(chat.generate_tokens(msgs, max_tokens=40, temperature=0)) == ref
            stats.append(chat.last_speculative_stats)
    assert stats[0].accepted == stats[0].drafted > 0
    assert 0 <= stats[1].accepted < stats[1].drafted


def test_mrope_target_refuses_a_draft_without_mrope(models, mmproj_vision):
    draft = fixture_path("draft_model", form="echo")  # llama arch, for qwen35_mtp
    spec = SpecConfig(spec_type="draft-simple", draft_model_path=str(draft), draft_n_max=3)
    with pytest.raises(SpeculativeError, match="M-RoPE and the draft model does not"):
        MultimodalChat(models["qwen35"], mmproj_vision, speculative=spec, **CTX)


def test_state_of_a_media_prompt_is_not_saved(models, prompts, mmproj_vision):
    path = models["spm"]
    with MultimodalChat(path, mmproj_vision, speculative=_spec("ngram-mod", 3, path), **CTX) as chat:
        list(chat.generate_tokens(prompts[0], max_tokens=4, temperature=0))
        with pytest.raises(SpeculativeError, match="not saved"):
            chat._spec.save_state()


def test_text_prefill_after_a_media_prompt_starts_over(models, prompts, mmproj_vision):
    path = models["spm"]
    with MultimodalChat(path, mmproj_vision, speculative=_spec("ngram-simple,draft-simple", 3, path), **CTX) as chat:
        dec = chat._spec
        list(chat.generate_tokens(prompts[2], max_tokens=8, temperature=0))
        text = [int(t) for t in chat.model.tokenize(b"one two three one two three", add_bos=True)]
        dec.prefill(text)
        assert dec.kv_tokens == text[:-1] and MEDIA_TOKEN not in dec.history
        toks = list(dec.generate(lambda ctx, i: int(ctx.logits_ith(i).argmax()), 12))
        assert len(toks) == 12
        model_draft = dec.drafters[1]
        assert model_draft._spans == [] and MEDIA_TOKEN not in model_draft.inner.kv_tokens
        assert dec.stats.accepted_by.get("draft-simple", 0) == dec.stats.drafted_by.get("draft-simple", 0) > 0


DFLASH = [("draft-dflash", {}), ("draft-dflash", {"selector": True}), ("draft-dspark", {"markov": "zero"})]


def _dflash(kind: str, n: int, **kw) -> SpecConfig:
    """A DFlash-family draft for the echo target whose first drafted token is always right (its rows
    read ``id_last`` alone, whatever features the draft memory holds), M-RoPE as the target is."""
    draft = fixture_path("dflash_draft", form="first", mrope=True, **kw)
    return SpecConfig(kind, draft_model_path=str(draft), draft_n_max=n)


@pytest.mark.parametrize(("kind", "kw"), DFLASH, ids=["dflash", "dflash2", "dspark"])
def test_dflash_with_images_equals_plain(kind, kw, models, prompts, plain, mmproj_vision):
    """DFlash, DFlash2 and DSpark speculate over media prompts (one image, two images, an image
    first): the same tokens as plain decoding, and the first drafted token accepted every time."""
    for n in (1, 3):
        with MultimodalChat(models["qwen35"], mmproj_vision, speculative=_dflash(kind, n, **kw), **CTX) as chat:
            for i, msgs in enumerate(prompts):
                toks = list(chat.generate_tokens(msgs, max_tokens=40, temperature=0))
                assert toks == plain["qwen35"][i], f"{kind} {kw} n={n} prompt {i}"
                st = chat.last_speculative_stats
                assert st.drafted_by.get(kind, 0) > 0 and st.accepted_at[0] == st.drafted_at[0], (kind, n, i)
                if n > 1:
                    assert st.accepted_at[1] == 0  # the construction: the second token is never right


def test_dflash_draft_memory_jumps_over_an_image(models, prompts, mmproj_vision):
    """An M-RoPE image's rows share one position, so (as llama.cpp's server) the draft memory takes no
    features for them and jumps over its positions: the text after it is in the draft memory at the
    target's positions, and no draft decodes the target again."""
    with MultimodalChat(models["qwen35"], mmproj_vision, speculative=_dflash("draft-dflash", 3), **CTX) as chat:
        dec = chat._spec
        d = dec.drafters[0].inner
        redecoded: list[int] = []
        orig = d._tl.redecode
        d._tl.redecode = lambda hist, first, end, obs: (redecoded.append(first), orig(hist, first, end, obs))
        list(chat.generate_tokens(prompts[0], max_tokens=12, temperature=0))
        span = dec._spans[0]
        assert redecoded == []
        assert d.ctx.seq_pos_max(0) >= span.p0 + span.n_pos  # text after the image went in after it
        assert d.ctx.seq_pos_min(0) == 0


def test_mrope_target_refuses_a_dflash_draft_without_mrope(models, mmproj_vision):
    draft = fixture_path("dflash_draft", form="first")
    spec = SpecConfig("draft-dflash", draft_model_path=str(draft), draft_n_max=2)
    with pytest.raises(SpeculativeError, match="M-RoPE and the draft does not"):
        MultimodalChat(models["qwen35"], mmproj_vision, speculative=spec, **CTX)


def test_dflash_takes_the_features_of_audio_rows(models, mmproj_audio, wav_path):
    """Audio rows take one position each, so their target features go into the draft memory at those
    positions like a text token's (llama.cpp's DFlash ``process`` on an embedding batch)."""
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_path.read_bytes()).decode(),
                                                    "format": "wav"}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "one two three"}, audio,
                                         {"type": "text", "text": "one two three again"}]}]
    with MultimodalChat(models["qwen35"], mmproj_audio, **CTX) as chat:
        plain = list(chat.generate_tokens(msgs, max_tokens=30, temperature=0))
    with MultimodalChat(models["qwen35"], mmproj_audio, speculative=_dflash("draft-dflash", 3), **CTX) as chat:
        d = chat._spec.drafters[0].inner
        seen: list[tuple[int, int, int]] = []
        observe = d.observe
        d.observe = lambda toks, p0, first=0: (seen.append((p0, len(toks), int(toks[0]))), observe(toks, p0, first))
        assert list(chat.generate_tokens(msgs, max_tokens=30, temperature=0)) == plain
        span = chat._spec._spans[0]
        assert (span.p0, span.n_pos, MEDIA_TOKEN) in seen  # every audio row, at its own position
        st = chat.last_speculative_stats
        assert st.drafted > 0 and st.accepted_at[0] == st.drafted_at[0]


def test_media_rows_reach_a_dflash_draft_only_at_their_own_positions():
    """``observe_media``: rows at consecutive positions go in, rows sharing a position (an M-RoPE
    image) or skipping positions do not; ``end_media`` makes the draft memory jump the span."""
    import numpy as np

    from llama_cpp.mtmd_chat import MediaFeatureDrafter

    calls: list[tuple] = []
    inner = SimpleNamespace(kind="draft-dflash", n_max=3, mrope=True,
                            observe=lambda toks, p0: calls.append(("observe", list(toks), p0)),
                            skip=lambda p0, n, tok: calls.append(("skip", p0, n, tok)))
    d = MediaFeatureDrafter(inner, SimpleNamespace(n_pos_per_embd=4))
    d.observe_media(np.array([[5, 5, 5, 5], [6, 6, 6, 6]]))
    d.observe_media(np.array([[7, 7, 0, 0], [7, 7, 1, 0], [7, 7, 2, 0]]))  # an image: one position
    d.observe_media(np.array([[9, 9, 9, 9], [11, 11, 11, 11]]))
    d.end_media(SimpleNamespace(p0=5, n_pos=7))
    assert calls == [("observe", [MEDIA_TOKEN, MEDIA_TOKEN], 5), ("skip", 5, 7, MEDIA_TOKEN)]
    with pytest.raises(SpeculativeError, match="M-RoPE and the draft does not"):
        MediaFeatureDrafter(SimpleNamespace(kind="draft-dflash", mrope=False), SimpleNamespace(n_pos_per_embd=4))

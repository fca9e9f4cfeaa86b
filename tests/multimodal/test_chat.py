"""Multimodal chat (mtmd) and MTP speculative decoding after images, on the synthetic fixtures."""

from __future__ import annotations

import base64
import ctypes

import numpy as np
import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import MultimodalError
from llama_cpp._safety.media_policy import MediaPolicy
from llama_cpp.mtmd import MarkerPrompt, MTMDContext
from llama_cpp.mtmd_chat import MTMDChatHandler, MultimodalChat, eval_chunks, image_from_url
from llama_cpp.speculative import SpecConfig


def _msgs(img_bytes: bytes, text: str = "what is in the picture?") -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(img_bytes).decode()
    return [{"role": "system", "content": "You look at images."},
            {"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "answer briefly"}]}]


def _greedy(model, mmproj, messages, spec=None, n=32):
    with MultimodalChat(model, mmproj, n_ctx=512, n_batch=64, n_threads=1, speculative=spec) as chat:
        toks = list(chat.generate_tokens(messages, max_tokens=n, temperature=0))
        return toks, chat.last_speculative_stats


@pytest.mark.parametrize("form", ["random", "noisy"])
def test_image_chat_with_mtp_equals_plain_greedy(form, mmproj_vision, png2):
    model = fixture_path("qwen35_mtp", form=form)
    msgs = _msgs(png2)
    plain, _ = _greedy(model, mmproj_vision, msgs)
    assert len(plain) == 32
    for spec in (SpecConfig(draft_n_max=1), SpecConfig(draft_n_max=3), SpecConfig(draft_n_max=8),
                 SpecConfig(draft_n_max=4, n_rs_seq=1)):  # n_rs_seq < draft: checkpoint restores
        toks, st = _greedy(model, mmproj_vision, msgs, spec)
        assert toks == plain, f"{form} draft_n_max={spec.draft_n_max} n_rs_seq={spec.n_rs_seq}"
        assert st.drafted > 0 and st.accepted <= st.drafted
        if form == "noisy":
            assert 0 < st.accepted < st.drafted and st.rollbacks > 0
        else:
            assert st.accepted <= st.drafted // 4
        if spec.n_rs_seq == 1:
            assert st.rollbacks_checkpoint > 0


def test_echo_mtp_drafts_fully_after_image(qwen35_echo, mmproj_vision, png_path):
    msgs = _msgs(png_path.read_bytes())
    plain, _ = _greedy(qwen35_echo, mmproj_vision, msgs)
    toks, st = _greedy(qwen35_echo, mmproj_vision, msgs, SpecConfig(draft_n_max=4))
    assert toks == plain
    assert st.accepted == st.drafted > 0 and st.rollbacks == 0


def test_media_span_positions_in_both_memories(qwen35_random, mmproj_vision, png_path):
    spec = SpecConfig(draft_n_max=3)
    with MultimodalChat(qwen35_random, mmproj_vision, n_ctx=512, n_batch=64, n_threads=1, speculative=spec) as chat:
        chunks, _ = chat.tokenize_messages(_msgs(png_path.read_bytes()))
        try:
            dec = chat._spec
            dec.prefill_chunks(chat.mtmd, chunks)
            n_pos = chunks.n_pos
            img = next(c for c in chunks if c.is_media)
            # every position but the pending last token is in the target, mirrored in the draft
            assert dec.n_past == n_pos - 1
            assert dec.target.seq_pos_max(0) == n_pos - 2
            assert dec.draft.seq_pos_max(0) == n_pos - 2
            assert dec.kv_tokens.count(dec.MEDIA_TOKEN) == img.n_pos
        finally:
            chunks.close()


def test_media_changes_the_answer(qwen35_random, mmproj_vision, png_path, png2):
    a, _ = _greedy(qwen35_random, mmproj_vision, _msgs(png_path.read_bytes()), n=12)
    b, _ = _greedy(qwen35_random, mmproj_vision, _msgs(png2), n=12)
    a2, _ = _greedy(qwen35_random, mmproj_vision, _msgs(png_path.read_bytes()), n=12)
    assert a == a2 and a != b


@pytest.mark.parametrize("model_name", ["spm", "qwen35"])
def test_eval_chunks_equals_mtmd_helper(model_name, spm_model, qwen35_random, mmproj_vision, png_path, png2):
    from llama_cpp import mtmd_cpp as M
    from llama_cpp._internals import LlamaContext, LlamaModel

    path = spm_model if model_name == "spm" else qwen35_random
    model = LlamaModel(path)
    mctx = MTMDContext(mmproj_vision, model, n_threads=1)
    item = MarkerPrompt("one <__media__> two <__media__> three", [png_path, png2])
    logits = []
    try:
        for use_helper in (False, True):
            ctx = LlamaContext(model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
            chunks = mctx.tokenize(item)
            try:
                if use_helper:
                    new_past = ctypes.c_int32(0)
                    assert M.mtmd_helper_eval_chunks(mctx.ptr, ctx.ptr, chunks.ptr, 0, 0, 64, True,
                                                     ctypes.byref(new_past)) == 0
                    n_past = new_past.value
                else:
                    n_past = eval_chunks(mctx, ctx, chunks)
                assert n_past == chunks.n_pos
                logits.append(np.array(ctx.logits_ith(-1)))
            finally:
                chunks.close()
                ctx.close()
    finally:
        mctx.close()
        model.close()
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)


@pytest.fixture(scope="module")
def chat(spm_model, mmproj_vision):
    with MultimodalChat(spm_model, mmproj_vision, n_ctx=512, n_batch=64, n_threads=1) as c:
        yield c


def test_chat_completion_and_stream_agree(chat, png_path):
    msgs = _msgs(png_path.read_bytes())
    full = chat.create_chat_completion(msgs, max_tokens=16, temperature=0)
    msg = full["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"]
    assert full["usage"]["completion_tokens"] == 16 and full["choices"][0]["finish_reason"] == "length"
    parts = list(chat.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
    assert parts[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(p["choices"][0]["delta"].get("content", "") for p in parts)
    assert text == msg["content"]
    assert parts[-1]["choices"][0]["finish_reason"] == "length"
    # a stop string cuts the answer where it first appears
    word = msg["content"].split()[2]
    cut = chat.create_chat_completion(msgs, max_tokens=16, temperature=0, stop=[word])
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["content"] == msg["content"][: msg["content"].index(word)]
    # seeded sampling is reproducible
    s1 = chat.create_chat_completion(msgs, max_tokens=8, temperature=0.9, seed=7)
    s2 = chat.create_chat_completion(msgs, max_tokens=8, temperature=0.9, seed=7)
    assert s1["choices"][0]["message"] == s2["choices"][0]["message"]


def test_image_url_forms(chat, png_path):
    data = png_path.read_bytes()
    ref = chat.create_chat_completion(_msgs(data), max_tokens=6, temperature=0)["choices"][0]["message"]
    default = chat.media_policy
    for url in (png_path.as_uri(), str(png_path)):
        msgs = _msgs(data)
        msgs[1]["content"][1] = {"type": "image_url", "image_url": url}
        with pytest.raises(MultimodalError, match="local image paths are refused"):  # unless allowed
            chat.create_chat_completion(msgs, max_tokens=6, temperature=0)
        chat.media_policy = MediaPolicy.with_dirs([png_path.parent])
        try:
            got = chat.create_chat_completion(msgs, max_tokens=6, temperature=0)["choices"][0]["message"]
        finally:
            chat.media_policy = default
        assert got == ref
    assert image_from_url({"url": "data:image/png;base64," + base64.b64encode(data).decode()}).source == data


def test_chat_rejects_bad_media(chat, tmp_path):
    cases = [
        ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "not fetched"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "base64"),
        ({"type": "image_url", "image_url": {"url": str(tmp_path / "missing.png")}}, "local image paths are refused"),
        ({"type": "image_url", "image_url": {"url": "ftp://host/x.png"}}, "not fetched"),
        ({"type": "text", "text": "sneaky <__media__> marker"}, "media marker"),
        ({"type": "video_url", "video_url": "x"}, "unsupported content part"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}, "not supported"),
    ]
    for part, msg in cases:
        with pytest.raises(MultimodalError, match=msg):
            chat.create_chat_completion([{"role": "user", "content": [part]}], max_tokens=2)
    # still usable
    assert chat.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)


def test_chat_handler_for_llama(spm_model, mmproj_vision, png_path, chat):
    from llama_cpp import Llama

    msgs = _msgs(png_path.read_bytes())
    ref = chat.create_chat_completion(msgs, max_tokens=10, temperature=0)["choices"][0]["message"]["content"]
    handler = MTMDChatHandler(mmproj_vision, n_threads=1)
    with Llama(spm_model, n_ctx=512, n_batch=64, n_threads=1, n_threads_batch=1, chat_handler=handler,
               verbose=False) as llm:
        out = llm.create_chat_completion(msgs, max_tokens=10, temperature=0)
        assert out["choices"][0]["message"]["content"] == ref
        streamed = "".join(c["choices"][0]["delta"].get("content", "")
                           for c in llm.create_chat_completion(msgs, max_tokens=10, temperature=0, stream=True))
        assert streamed == ref
        # the Llama's own text path is unaffected afterwards
        a = llm.create_completion("hello", max_tokens=4, temperature=0)["choices"][0]["text"]
        llm.chat_handler = None
        b = llm.create_completion("hello", max_tokens=4, temperature=0)["choices"][0]["text"]
        assert a == b
    handler.close()
    handler.close()


def test_mtp_chat_needs_nextn_model(spm_model, mmproj_vision):
    from llama_cpp import SpeculativeError

    with pytest.raises(SpeculativeError, match="NextN"):
        MultimodalChat(spm_model, mmproj_vision, n_threads=1, speculative=SpecConfig(draft_n_max=2))


@pytest.mark.parametrize("spec_type", ["draft-eagle3", "ngram-mod,draft-eagle3"])
def test_eagle3_is_refused_before_loading(spec_type, tmp_path):
    """EAGLE3 (its draft pairs each position's features with the next token, which media positions
    lack) is refused before any file is read (neither the model nor the draft exists here); the
    n-gram types, draft-simple, draft-dflash and draft-dspark are served
    (tests/multimodal/test_chat_speculative.py)."""
    from llama_cpp import SpeculativeError

    spec = SpecConfig(spec_type=spec_type, draft_model_path=tmp_path / "draft.gguf")
    with pytest.raises(SpeculativeError, match="use draft-simple, draft-mtp, draft-dflash, draft-dspark or an n-gram") as e:
        MultimodalChat(tmp_path / "model.gguf", tmp_path / "mmproj.gguf", n_threads=1, speculative=spec)
    assert spec_type.split(",")[-1] in str(e.value)

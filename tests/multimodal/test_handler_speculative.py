"""``Llama(model, chat_handler=MTMDChatHandler(mmproj), speculative=SpecConfig(...))``: the handler
builds the Llama's decoder, so media chats speculate as ``MultimodalChat`` does (the same tokens as
the handler without speculation) and text prompts keep speculating; ``draft-eagle3`` speculates on
text only. Target: the hybrid M-RoPE echo fixture (its output repeats a cycle: drafts land)."""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp import Llama
from llama_cpp.mtmd_chat import MediaHistory, MTMDChatHandler
from llama_cpp.speculative import SpecConfig

from .test_chat_speculative import _dflash, _prompts, _spec

LLAMA_CTX = {"n_ctx": 512, "n_batch": 64, "n_threads": 1, "n_threads_batch": 1, "verbose": False}
TEXT = "one two three one two three one two"
N = 24


@pytest.fixture(scope="module")
def target():
    return fixture_path("qwen35_mtp", form="echo")


@pytest.fixture(scope="module")
def prompts(png_path, png2):
    return _prompts(png_path.read_bytes(), png2)


def _chat(llm: Llama, msgs: list[dict], stream: bool = False) -> str:
    if stream:
        return "".join(c["choices"][0]["delta"].get("content", "")
                       for c in llm.create_chat_completion(msgs, max_tokens=N, temperature=0, stream=True))
    return llm.create_chat_completion(msgs, max_tokens=N, temperature=0)["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def plain(target, prompts, mmproj_vision):
    """The handler's greedy replies and a text completion, without speculation."""
    handler = MTMDChatHandler(mmproj_vision, n_threads=1)
    try:
        with Llama(str(target), chat_handler=handler, **LLAMA_CTX) as llm:
            return [_chat(llm, m) for m in prompts], llm(TEXT, max_tokens=N, temperature=0)["choices"][0]["text"]
    finally:
        handler.close()


def _config(spec_type: str, target) -> SpecConfig:
    return _dflash(spec_type, 3) if spec_type == "draft-dflash" else _spec(spec_type, 3, target)


@pytest.mark.parametrize("spec_type", ["draft-mtp", "ngram-simple", "draft-simple", "draft-dflash",
                                       "draft-mtp,ngram-map-k"])
def test_media_chats_speculate(spec_type, target, prompts, plain, mmproj_vision):
    replies, text = plain
    handler = MTMDChatHandler(mmproj_vision, n_threads=1)
    try:
        with Llama(str(target), chat_handler=handler, speculative=_config(spec_type, target), **LLAMA_CTX) as llm:
            assert isinstance(llm.sequence.spec, MediaHistory)
            drafted = accepted = 0
            for i, msgs in enumerate(prompts):
                assert _chat(llm, msgs) == replies[i], (spec_type, i)
                st = llm.last_speculative_stats
                assert st is not None and st.generated == N and 0 <= st.accepted <= st.drafted
                drafted, accepted = drafted + st.drafted, accepted + st.accepted
                assert _chat(llm, msgs, stream=True) == replies[i], (spec_type, i)
                assert llm.last_speculative_stats.generated == N
            assert accepted > 0 and drafted > 0, spec_type
            # the Llama's own text path after media chats: same text, still speculating
            assert llm(TEXT, max_tokens=N, temperature=0)["choices"][0]["text"] == text
            assert llm.last_speculative_stats.drafted > 0
            assert _chat(llm, prompts[0]) == replies[0]
    finally:
        handler.close()


@pytest.mark.parametrize(("spec_type", "draft", "words"), [
    ("draft-eagle3", ("eagle3_draft", {"form": "echo"}), "does not speculate with draft-eagle3"),
    # drafts without M-RoPE under this M-RoPE target: they cannot take an image's positions
    ("draft-simple", ("draft_model", {"form": "echo"}), "M-RoPE and the draft model does not"),
    ("draft-dflash", ("dflash_draft", {"form": "first"}), "M-RoPE and the draft does not"),
], ids=["eagle3", "draft-simple-no-mrope", "dflash-no-mrope"])
def test_text_only_speculation(spec_type, draft, words, target, prompts, plain, mmproj_vision, caplog):
    """Where a type or draft cannot draft over media, the Llama still builds (its own decoder
    speculates on text) and media chats decode without drafts, which is logged."""
    replies, text = plain
    cfg = SpecConfig(spec_type, draft_n_max=3, draft_model_path=str(fixture_path(draft[0], **draft[1])))
    handler = MTMDChatHandler(mmproj_vision, n_threads=1)
    try:
        with caplog.at_level("INFO", logger="llama_cpp.mtmd_chat"), \
                Llama(str(target), chat_handler=handler, speculative=cfg, **LLAMA_CTX) as llm:
            assert not isinstance(llm.sequence.spec, MediaHistory)
            assert "media chats decode without speculation" in caplog.text and words in caplog.text
            assert llm(TEXT, max_tokens=N, temperature=0)["choices"][0]["text"] == text
            assert llm.last_speculative_stats.accepted > 0
            assert [_chat(llm, m) for m in prompts] == replies
    finally:
        handler.close()


def test_handler_set_later_decodes_media_without_drafts(target, prompts, plain, mmproj_vision):
    """A handler assigned to a Llama built without it: its decoder takes no media, so media chats
    decode plainly (same tokens) and text keeps speculating."""
    replies, text = plain
    handler = MTMDChatHandler(mmproj_vision, n_threads=1)
    try:
        with Llama(str(target), speculative=_spec("draft-mtp", 3, target), **LLAMA_CTX) as llm:
            llm.chat_handler = handler
            assert _chat(llm, prompts[1]) == replies[1]
            assert llm(TEXT, max_tokens=N, temperature=0)["choices"][0]["text"] == text
            assert llm.last_speculative_stats.drafted > 0
    finally:
        handler.close()


def test_a_vision_preset_speculates(target, prompts, mmproj_vision):
    """The template presets (``_vision_handlers``) run on the same decoder."""
    from llama_cpp.llama_chat_format import Qwen25VLChatHandler

    out = []
    for spec in (None, _spec("draft-mtp", 3, target)):
        handler = Qwen25VLChatHandler(str(mmproj_vision), n_threads=1)
        try:
            with Llama(str(target), chat_handler=handler, speculative=spec, **LLAMA_CTX) as llm:
                out.append([_chat(llm, m) for m in prompts[:2]])
                st = llm.last_speculative_stats
                assert (st is None) if spec is None else (st.generated == N and st.drafted > 0)
        finally:
            handler.close()
    assert out[0] == out[1]

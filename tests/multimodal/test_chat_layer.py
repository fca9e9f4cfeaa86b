"""A projector model's chat through llama.cpp's chat layer: tools, tool calls and reasoning parsed.

A tiny model carries Qwen 3's template (thinking, ``<tool_call>``) and its preserved tokens; a logits
processor forces its native output. With an image in the conversation, ``MTMDChatHandler`` and
``MultimodalChat`` must return what ``Llama.create_chat_completion`` returns for the same output
through the chat layer: ``reasoning_content``, ``tool_calls`` (finish ``"tool_calls"``), and, streamed,
deltas that assemble to that message.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from llama_cpp.server.prompts import join_chat_chunks
from tests.chat.forcing import BOS, EOS, Force, assemble_stream, model_with_template

REPO = Path(__file__).resolve().parents[2]
QWEN3 = REPO / "vendor" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OUTPUT = ('<think>\nThe picture shows Paris.\n</think>\n\nLet me check.\n<tool_call>\n'
          '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
EXPECTED = {"content": "Let me check.", "reasoning_content": "The picture shows Paris.",
            "tool_calls": [("get_weather", '{"city": "Paris"}')]}


@pytest.fixture(scope="module")
def nc():
    from llama_cpp._chat import native_chat

    if not native_chat.available():
        pytest.skip("libllama-cpp-ext is not in this native build")
    if not QWEN3.is_file():
        pytest.skip("vendor/llama.cpp/models/templates is not vendored")
    return native_chat


@pytest.fixture(scope="module")
def qwen_model(nc, tmp_path_factory) -> Path:
    text = QWEN3.read_text(encoding="utf-8")
    with nc.ChatTemplates(text, bos_token=BOS, eos_token=EOS) as t:
        preserved = set(t.apply([{"role": "user", "content": "hi"}], tools=[WEATHER]).preserved_tokens)
    return model_with_template(tmp_path_factory.mktemp("mm-chat") / "qwen3.gguf", text, sorted(preserved))


def _ask(png: bytes) -> list[dict[str, Any]]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is the weather there?"}]}]


def _summary(msg: dict[str, Any]) -> dict[str, Any]:
    return {"content": (msg.get("content") or "").strip(), "reasoning_content": (msg.get("reasoning_content") or "").strip(),
            "tool_calls": [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or ()]}


def _check(run: Any, llm: Any) -> None:
    """``run(stream, force)``: a chat answer forced to OUTPUT, parsed; streamed, the same message."""
    force = Force(llm, OUTPUT)
    r = run(False, force)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert _summary(choice["message"]) == EXPECTED
    assert all(c["id"] and c["type"] == "function" for c in choice["message"]["tool_calls"])
    chunks = list(run(True, Force(llm, OUTPUT)))
    streamed, finish = assemble_stream(chunks)
    assert finish == "tool_calls"
    assert _summary(streamed) == EXPECTED
    # the server's image chat joins the handler's stream into its non-streamed answer
    joined = join_chat_chunks(chunks)["choices"][0]
    assert joined["finish_reason"] == "tool_calls" and _summary(joined["message"]) == EXPECTED
    assert all(c["id"] for c in streamed["tool_calls"])


def test_handler_parses_tool_calls_and_reasoning_as_llama_does(qwen_model, mmproj_vision, png_path):
    from llama_cpp import Llama
    from llama_cpp.mtmd_chat import MTMDChatHandler

    handler = MTMDChatHandler(mmproj_vision, n_threads=1)
    with Llama(model_path=str(qwen_model), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False) as llm:
        # the text-only chat through the chat layer: the reference
        def text_run(stream: bool, force: Any) -> Any:
            return llm.create_chat_completion([{"role": "user", "content": "What is the weather in Paris?"}],
                                              tools=[WEATHER], logits_processor=force, temperature=0.0,
                                              max_tokens=len(force.tokens) + 4, stream=stream)

        _check(text_run, llm)
        llm.chat_handler = handler

        def media_run(stream: bool, force: Any) -> Any:
            return llm.create_chat_completion(_ask(png_path.read_bytes()), tools=[WEATHER], tool_choice="auto",
                                              logits_processor=force, temperature=0.0,
                                              max_tokens=len(force.tokens) + 4, stream=stream)

        _check(media_run, llm)
        # chat-layer options reach the handler: reasoning left in the content
        force = Force(llm, "<think>\nhm\n</think>\n\nHi")
        r = llm.create_chat_completion(_ask(png_path.read_bytes()), reasoning_format="none", logits_processor=force,
                                       temperature=0.0, max_tokens=len(force.tokens) + 4)
        assert "reasoning_content" not in r["choices"][0]["message"]
        assert "<think>" in r["choices"][0]["message"]["content"]
        # without tools or options, the template path (thinking inline, as Llama's)
        force = Force(llm, "Sunny")
        r = llm.create_chat_completion(_ask(png_path.read_bytes()), logits_processor=force, temperature=0.0,
                                       max_tokens=len(force.tokens) + 4)
        assert r["choices"][0]["message"]["content"] == "Sunny"
    handler.close()


def test_multimodal_chat_parses_tool_calls(qwen_model, mmproj_vision, png_path):
    from llama_cpp.mtmd_chat import MultimodalChat

    with MultimodalChat(qwen_model, mmproj_vision, n_ctx=2048, n_threads=1) as chat:
        class Tok:  # Force tokenizes with the chat's model
            def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
                return chat.model.tokenize(text, add_special=add_bos, parse_special=special)

            def token_eos(self) -> int:
                return chat.model.token_eos()

        def run(stream: bool, force: Any) -> Any:
            return chat.create_chat_completion(_ask(png_path.read_bytes()), tools=[WEATHER], logits_processor=force,
                                               temperature=0.0, max_tokens=len(force.tokens) + 4, stream=stream)

        _check(run, Tok())


def test_preset_template_refuses_chat_layer_options(qwen_model, mmproj_vision, png_path):
    from llama_cpp import Llama
    from llama_cpp._errors import MultimodalError, ParameterError
    from llama_cpp.llama_chat_format import Llava15ChatHandler

    with Llama(model_path=str(qwen_model), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False,
               chat_handler=Llava15ChatHandler(mmproj_vision, verbose=False)) as llm:
        with pytest.raises(MultimodalError, match="tools"):
            llm.create_chat_completion(_ask(png_path.read_bytes()), tools=[WEATHER], max_tokens=2)
        with pytest.raises(ParameterError, match="reasoning_format"):
            llm.create_chat_completion(_ask(png_path.read_bytes()), reasoning_format="none", max_tokens=2)

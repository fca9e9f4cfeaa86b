"""The one table of named chat formats: upstream's text prompt and the media-aware rendering per name."""

from __future__ import annotations

import pytest

from llama_cpp._chat import base, formats
from llama_cpp._chat.base import Jinja2ChatFormatter, NamedChatFormatter

MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]


def test_every_row_renders_and_the_names_are_the_rows():
    assert base.chat_format_names() == sorted(formats.BUILTIN_FORMATS)
    for name, row in formats.BUILTIN_FORMATS.items():
        assert row.text is not None or row.media is not None, name
        for media in (False, True):
            assert base.get_chat_formatter(name, media=media)(messages=MESSAGES).prompt


def test_text_chat_gets_upstreams_prompt_and_media_chat_the_template():
    assert isinstance(base.get_chat_formatter("chatml", media=False), NamedChatFormatter)
    assert isinstance(base.get_chat_formatter("chatml"), Jinja2ChatFormatter)
    assert isinstance(base.get_chat_formatter("phi-3", media=False), Jinja2ChatFormatter)  # its only rendering
    assert isinstance(base.get_chat_formatter("qwen"), NamedChatFormatter)  # upstream's only
    assert base.get_chat_formatter("llama2", media=False)(messages=MESSAGES).prompt == \
        formats.format_llama2(messages=MESSAGES).prompt  # an alias names the same row


def test_a_registered_format_replaces_its_row_and_unregistering_restores_the_builtin():
    registry = base.LlamaChatCompletionHandlerRegistry()
    handler = registry._chat_handlers.pop("chatml", None)  # registered once llama_chat_format is imported

    @base.register_chat_format("chatml")
    def mine(messages, **kwargs):
        return formats.ChatFormatterResponse(prompt="MINE")

    try:
        assert base.get_chat_formatter("chatml")(messages=MESSAGES).prompt == "MINE"
    finally:
        registry.unregister_chat_handler("chatml")
        if handler is not None:  # the built-in handler, for the tests that run after this one
            registry.register_chat_completion_handler("chatml", handler)
    assert base.NAMED_FORMATS["chatml"] is formats.BUILTIN_FORMATS["chatml"]

    base.register_chat_format("unit-test-format")(mine)
    registry.unregister_chat_handler("unit-test-format")
    assert "unit-test-format" not in base.NAMED_FORMATS
    with pytest.raises(ValueError, match="unknown chat_format 'unit-test-format'"):
        base.get_chat_formatter("unit-test-format")

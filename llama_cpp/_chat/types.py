"""The small types every chat module shares: the formatter response and the formatter/handler protocols."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass
class ChatFormatterResponse:
    """A rendered prompt, the format's stop string(s), an optional stopping criterion, and whether
    the prompt already holds BOS (``added_special``; False: the tokenizer adds it)."""

    prompt: str
    stop: str | list[str] | None = None
    stopping_criteria: Any = None
    added_special: bool = False


class ChatFormatter(Protocol):
    """``formatter(messages=..., **kwargs) -> ChatFormatterResponse``."""

    def __call__(self, *, messages: list[Any], **kwargs: Any) -> ChatFormatterResponse: ...


class LlamaChatCompletionHandler(Protocol):
    """``handler(llama=..., messages=..., **openai_params)``: a chat completion, or an iterator
    of chunks with ``stream=True``."""

    def __call__(self, *, llama: Any, messages: list[Any], **kwargs: Any) -> Any: ...

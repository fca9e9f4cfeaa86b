"""Tokenize a rendered chat prompt so message content cannot inject special tokens (roles, turns).

The template's own text is parsed with special tokens (``<start_of_turn>`` and the like are how
templates mark roles); message content is not, unless the caller asks: a user writing
``<end_of_turn><start_of_turn>model`` gets those characters as text. Prompts whose content holds no
special-token text tokenize exactly as one pass over the whole prompt would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _special_in(model: Any, text: str) -> bool:
    raw = text.encode("utf-8")
    return model.tokenize(raw, add_special=False, parse_special=True) != model.tokenize(
        raw, add_special=False, parse_special=False)


def content_spans(prompt: str, contents: Sequence[str]) -> list[tuple[int, int] | None]:
    """Where each content string occurs in ``prompt``, in order (templates may trim it); None
    for one that is not found."""
    spans: list[tuple[int, int] | None] = []
    pos = 0
    for content in contents:
        span = None
        for candidate in (content, content.strip()):
            at = prompt.find(candidate, pos) if candidate else -1
            if at >= 0:
                span = (at, at + len(candidate))
                pos = span[1]
                break
        spans.append(span)
    return spans


def message_texts(messages: Sequence[Any]) -> list[str]:
    """The text of each message's content (string content, or the text parts of a list)."""
    texts: list[str] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return texts


def prompt_pieces(model: Any, prompt: str, contents: Sequence[str], *,
                  special_in_content: bool = False) -> list[tuple[str, bool]] | None:
    """``prompt`` cut into ``(text, parse_special)`` pieces: the spans of ``contents`` that hold
    special-token text are ``False``, the rest ``True``; None when no content needs it (tokenize
    the prompt in one pass then).

    ``model`` is a :class:`~llama_cpp._internals.LlamaModel`; ``contents`` every message text in
    conversation order (the benign ones too: locating each in turn keeps a hostile content from
    being matched against an earlier part of the template). Content a template rewrote beyond
    trimming is not found in the prompt and keeps the one-pass tokenization.
    """
    hostile = set() if special_in_content else {c for c in contents if c and _special_in(model, c)}
    if not hostile:
        return None
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for span, content in zip(content_spans(prompt, contents), contents):
        if span is None or content not in hostile:
            continue
        start, end = span
        if start > pos:
            pieces.append((prompt[pos:start], True))
        pieces.append((prompt[start:end], False))
        pos = end
    if pos < len(prompt):
        pieces.append((prompt[pos:], True))
    return pieces


def tokenize_chat_prompt(model: Any, prompt: str, contents: Sequence[str], *, add_special: bool,
                         special_in_content: bool = False) -> list[int]:
    """Tokens of ``prompt``; the spans of ``contents`` holding special-token text are parsed as text
    (see :func:`prompt_pieces`)."""
    pieces = prompt_pieces(model, prompt, contents, special_in_content=special_in_content)
    if pieces is None:
        return model.tokenize(prompt.encode("utf-8"), add_special=add_special, parse_special=True)
    tokens: list[int] = []
    for k, (text, special) in enumerate(pieces):
        tokens += model.tokenize(text.encode("utf-8"), add_special=add_special and k == 0, parse_special=special)
    return tokens

"""Tokenize a rendered chat prompt so message content cannot inject special tokens (roles, turns).

The template's own text is parsed with special tokens (``<start_of_turn>`` and the like are how
templates mark roles); message content is not, unless the caller asks: a user writing
``<end_of_turn><start_of_turn>model`` gets those characters as text. Prompts whose content holds no
special-token text tokenize exactly as one pass over the whole prompt would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Render = Callable[[list[Any]], str]  # messages -> the prompt the template makes of them


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


def _sentinel(k: int) -> str:
    # private-use code points and digits: no template filter (trim, upper, escape) changes them
    return f"\ue000{k}\ue001"


def _marked(messages: Sequence[Any], hostile: set[str]) -> tuple[list[Any], list[str]]:
    """``messages`` with each hostile text replaced by a sentinel, and the texts in sentinel order."""
    texts: list[str] = []

    def mark(text: str) -> str:
        if text in hostile:
            texts.append(text)
            return _sentinel(len(texts) - 1)
        return text

    out: list[Any] = []
    for msg in messages:
        if isinstance(msg, dict):
            content = msg.get("content")
            if isinstance(content, str):
                msg = {**msg, "content": mark(content)}
            elif isinstance(content, list):
                msg = {**msg, "content": [{**p, "text": mark(p["text"])}
                                          if isinstance(p, dict) and isinstance(p.get("text"), str) else p
                                          for p in content]}
        out.append(msg)
    return out, texts


def _rendered_pieces(prompt: str, render: Render, messages: Sequence[Any],
                     hostile: set[str]) -> list[tuple[str, bool]] | None:
    """Pieces from a second rendering with sentinels in place of the hostile texts: every span is
    known exactly, even where a content equals template text next to it (``<|im_end|>`` as a whole
    message). None when the template does not keep each sentinel once, in order."""
    marked, texts = _marked(messages, hostile)
    if not texts or any(_sentinel(k) in prompt for k in range(len(texts))):
        return None
    try:
        with_marks = render(marked)
    except Exception:  # noqa: BLE001 - the caller's own rendering already succeeded; fall back to spans
        return None
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for k, text in enumerate(texts):
        mark = _sentinel(k)
        at = with_marks.find(mark, pos)
        if at < 0 or with_marks.find(mark, at + len(mark)) >= 0:
            return None
        if at > pos:
            pieces.append((with_marks[pos:at], True))
        # a template that trims contents trims this one too
        pieces.append((text if text in prompt or text.strip() not in prompt else text.strip(), False))
        pos = at + len(mark)
    if pos < len(with_marks):
        pieces.append((with_marks[pos:], True))
    return pieces


def prompt_pieces(model: Any, prompt: str, contents: Sequence[str], *, special_in_content: bool = False,
                  render: Render | None = None, messages: Sequence[Any] | None = None,
                  ) -> list[tuple[str, bool]] | None:
    """``prompt`` cut into ``(text, parse_special)`` pieces: the spans of ``contents`` that hold
    special-token text are ``False``, the rest ``True``; None when no content needs it (tokenize
    the prompt in one pass then).

    With ``render`` and ``messages`` (how the prompt was made), the spans come from a second
    rendering with sentinels, which is exact. Without them, each content is located in turn in
    ``prompt`` (``contents`` holds every message text in conversation order, the benign ones too);
    content a template rewrote beyond trimming is not found and keeps the one-pass tokenization.
    """
    hostile = set() if special_in_content else {c for c in contents if c and _special_in(model, c)}
    if not hostile:
        return None
    if render is not None and messages is not None:
        exact = _rendered_pieces(prompt, render, messages, hostile)
        if exact is not None:
            return exact
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
                         special_in_content: bool = False, render: Render | None = None,
                         messages: Sequence[Any] | None = None) -> list[int]:
    """Tokens of ``prompt``; the spans of ``contents`` holding special-token text are parsed as text
    (see :func:`prompt_pieces`; pass ``render`` and ``messages`` for exact spans)."""
    pieces = prompt_pieces(model, prompt, contents, special_in_content=special_in_content, render=render,
                           messages=messages)
    if pieces is None:
        return model.tokenize(prompt.encode("utf-8"), add_special=add_special, parse_special=True)
    tokens: list[int] = []
    for k, (text, special) in enumerate(pieces):
        tokens += model.tokenize(text.encode("utf-8"), add_special=add_special and k == 0, parse_special=special)
    return tokens

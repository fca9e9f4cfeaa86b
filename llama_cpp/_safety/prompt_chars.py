"""Refuse a prompt that cannot fit its context by counting characters, before tokenizing it.

No token covers more input characters than its own text has (byte tokens cover less), so a text
longer than ``n_ctx * longest token text`` never fits ``n_ctx`` tokens: the server answers it
with 400 ``context_length_exceeded`` at once, without the tokenizer's time (which llama.cpp does
not bound for every vocabulary, see :mod:`.tokenize_bounds`).
"""

from __future__ import annotations

import weakref
from typing import Any

from .._core.ownership import unwrap
from .._errors import ContextOverflowError

_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token_chars(model: Any) -> int:
    """The longest token text of ``model`` in characters (computed once per model)."""
    cached = _LONGEST.get(unwrap(model))
    if cached is None:
        C, vocab = model.bindings, model.vocab
        cached = 1
        for i in range(int(model.n_vocab)):
            raw = C.llama_vocab_get_text(vocab, i)
            if raw and len(raw) > cached:  # bytes >= characters: decode only the candidates
                cached = max(cached, len(raw.decode("utf-8", "replace")))
        _LONGEST[unwrap(model)] = cached
    return cached


def max_prompt_chars(model: Any, n_ctx: int) -> int:
    """The most characters a prompt that fits ``n_ctx`` tokens can have."""
    return int(n_ctx) * longest_token_chars(model)


def check_prompt_chars(model: Any, text: str, n_ctx: int, what: str = "the prompt") -> None:
    """Raise ContextOverflowError when ``text`` has more characters than ``n_ctx`` tokens can hold."""
    limit = max_prompt_chars(model, n_ctx)
    if len(text) > limit:
        raise ContextOverflowError(
            f"{what} has {len(text)} characters; a context of {n_ctx} tokens holds at most {limit} characters of "
            f"this model's text (its longest token is {limit // max(int(n_ctx), 1)} characters): shorten it")

"""Keep SentencePiece tokenization linear: long texts are tokenized in exact chunks.

llama.cpp's SPM tokenizer reserves its output vector to the exact size for every character it
emits as byte tokens (``llm_tokenizer_spm_session::resegment``: ``output.reserve(output.size() +
symbol.n)``), which defeats geometric growth: a text of N characters that are in no vocabulary
token costs O(N^2) (100k CJK characters: 8 s; a 1 MB prompt: minutes).

A character that is in no token can never be merged with a neighbour, so the tokenization of
a text cut just before such a character is the concatenation of the pieces' tokenizations,
except for the space prefix SPM adds at the start of each call, which is computed once and
removed. :func:`tokenize` cuts texts over :data:`THRESHOLD_CHARS` into chunks of about
:data:`CHUNK_CHARS` that way (tokens identical to one call); other vocabulary types and texts
without such characters are tokenized in one call (they have no quadratic path).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from .._core.ownership import unwrap

log = logging.getLogger("llama_cpp")

LLAMA_VOCAB_TYPE_SPM = 1
#: texts up to this many characters are tokenized in one call
THRESHOLD_CHARS = 16_384
#: the chunk size past the threshold (a chunk ends before the first unmergeable character after it)
CHUNK_CHARS = 4_096

Once = Callable[[bytes, bool, bool], list[int]]


#: llama.cpp's special tokens (``cache_special_tokens``): CONTROL | USER_DEFINED | UNKNOWN attributes
_SPECIAL_ATTRS = 8 | 16 | 1


_VOCAB_CHARS: weakref.WeakKeyDictionary[Any, tuple[frozenset[str], frozenset[str]]] = weakref.WeakKeyDictionary()


def vocab_chars(model: Any) -> tuple[frozenset[str], frozenset[str]]:
    """Every character that occurs in some token text of ``model`` (SPM's ``▁`` also as a space),
    and the last characters of the special tokens' texts; computed once per model."""
    cached = _VOCAB_CHARS.get(unwrap(model))
    if cached is not None:
        return cached
    C, vocab = model.bindings, model.vocab
    chars: set[str] = set()
    ends: set[str] = set()
    for i in range(int(model.n_vocab)):
        raw = C.llama_vocab_get_text(vocab, i)
        if raw:
            text = raw.decode("utf-8", "replace")
            chars.update(text)
            if int(C.llama_vocab_get_attr(vocab, i)) & _SPECIAL_ATTRS:
                ends.add(text[-1])
    if "\u2581" in chars:
        chars.add(" ")
    cached = _VOCAB_CHARS[unwrap(model)] = (frozenset(chars), frozenset(ends))
    return cached


def cut_points(text: str, chars: frozenset[str], chunk: int = CHUNK_CHARS,
               special_ends: frozenset[str] = frozenset()) -> list[int]:
    """Indices (at least ``chunk`` apart) of characters in no token, not right after a character
    that ends a special token (SPM adds a space prefix after one), where ``text`` may be cut."""
    points: list[int] = []
    pos, n = chunk, len(text)
    while pos < n:
        while pos < n and (text[pos] in chars or text[pos - 1] in special_ends):
            pos += 1
        if pos >= n:
            break
        points.append(pos)
        pos += chunk
    return points


def tokenize(model: Any, text: bytes, add_special: bool, parse_special: bool, once: Once, *,
             threshold: int = THRESHOLD_CHARS, chunk: int = CHUNK_CHARS) -> list[int]:
    """``once(text, add_special, parse_special)``, in exact chunks when that call would be quadratic."""
    if len(text) <= threshold or model.vocab_type() != LLAMA_VOCAB_TYPE_SPM:
        return once(text, add_special, parse_special)
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        return once(text, add_special, parse_special)
    chars, ends = vocab_chars(model)
    points = cut_points(s, chars, chunk, ends if parse_special else frozenset())
    if not points:
        return once(text, add_special, parse_special)
    bounds = [0, *points, len(s)]
    out: list[int] = []
    for k in range(len(bounds) - 1):
        piece = s[bounds[k]:bounds[k + 1]]
        toks = once(piece.encode("utf-8"), False, parse_special)
        if k:
            alone = once(piece[0].encode("utf-8"), False, False)
            prefix = alone[: len(alone) - len(piece[0].encode("utf-8"))]
            if toks[: len(prefix)] != prefix:
                log.debug("chunked tokenization fell back to one call (unexpected prefix)")
                return once(text, add_special, parse_special)
            toks = toks[len(prefix):]
        out += toks
    if add_special and model.add_bos():
        out.insert(0, model.token_bos())
    if add_special and model.add_eos():
        out.append(model.token_eos())
    return out

"""N-gram self-speculation: drafts looked up in the sequence's own history, no draft model.

One class per llama.cpp type, with the semantics of ``common/ngram-map.cpp``,
``common/ngram-mod.cpp``, ``common/ngram-cache.cpp`` and their drivers in
``common/speculative.cpp`` (so acceptance matches ``llama-speculative-simple --spec-type ...``):

- :class:`NgramSimple` (``ngram-simple``): the last ``size_n`` tokens (the pending one included)
  are searched backwards in the history; the ``size_m`` tokens after the latest earlier match are
  the draft (none shorter than ``size_n``).
- :class:`NgramMap` (``ngram-map-k``, ``key_only``): the same lookup through a hash map of
  earlier n-grams, remembering per key how many draft tokens the target accepted last time and
  drafting no more than that. ``ngram-map-k4v`` (not ``key_only``) also counts up to four
  distinct m-grams seen after each key and drafts only when the key occurred ``min_hits`` times
  and its most frequent continuation is at least twice as frequent as the others together.
- :class:`NgramMod` (``ngram-mod``): a lossy hash table from every ``n_match``-gram to the
  token that followed it; drafts ``n_min..n_max`` tokens by chained lookups and clears the table
  when it fills past a quarter or after five drafts in a row with under 25 % accepted.
- :class:`NgramCache` (``ngram-cache``): token counts after every 1..4-gram of the context, plus
  optional static/dynamic caches loaded from llama.cpp's ``lookup-cache`` files; drafts up to
  ``n_draft`` tokens, each the most frequent continuation above a sample-size and share
  threshold.
- :class:`PromptLookup` (``prompt-lookup``, not a llama.cpp type): upstream llama-cpp-python's
  :class:`~llama_cpp.llama_speculative.LlamaPromptLookupDecoding`, called as it is. It tries the
  longest n-gram first (``max_ngram_size`` down to 1) and drafts after its *earliest* earlier
  occurrence, where ``ngram-simple`` drafts after the *latest* occurrence of exactly ``size_n``
  tokens and proposes nothing shorter than ``size_n``.

Every drafter offers ``begin(prompt)`` (a generation starts with ``prompt`` in the target's
memory), ``draft(prompt, id_last) -> tokens`` and ``accept(n_accepted)`` (how much of the last
draft the target kept), like ``common_speculative_impl``. Histories are Python lists of token ids.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import SpeculativeError
from .._safety.cache_files import read_regular_file
from .drafter import DrafterBase, StatelessDrafter

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def _find_backwards(tokens: Sequence[int], key: Sequence[int], hi: int, lo: int) -> int:
    """The largest ``j`` in ``(lo, hi]`` with ``tokens[j:j+len(key)] == key``; 0 when none."""
    n = len(key)
    first = key[0]
    key = list(key)
    for j in range(hi, lo, -1):
        if tokens[j] == first and tokens[j:j + n] == key:
            return j
    return 0


class NgramSimple(DrafterBase):
    """``ngram-simple``: copy what followed the latest earlier occurrence of the current n-gram."""

    kind = "ngram-simple"

    def __init__(self, size_n: int, size_m: int) -> None:
        self.size_n, self.size_m = int(size_n), int(size_m)
        self.n_max = self.size_m

    def reset(self) -> None:
        pass

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        n, m = self.size_n, self.size_m
        cur = len(prompt)
        if cur <= n + m + 1:
            return []
        key = prompt[cur - n + 1:] + [id_last]
        pos = _find_backwards(prompt, key, cur - n - 1, 0)  # position 0 never counts as a match
        if pos == 0:
            return []
        count = min(m, cur - (pos + n))
        if count < n:
            return []
        return prompt[pos + n:pos + n + count]

    def accept(self, n_accepted: int) -> None:
        pass


# --------------------------------------------------------------------------------------------
# ngram-map-k / ngram-map-k4v
# --------------------------------------------------------------------------------------------

_MAP_VALUES = 4           # m-grams remembered per key
_MAP_HASH_SLOTS = 262144  # slots of the hash -> n-gram index table
_MAP_COUNT_MAX = 16380
_LCG = 2654435761


def _map_hash(tokens: Sequence[int], start: int, n: int) -> int:
    h = 0
    for i in range(start, start + n):
        h = (h * _LCG + tokens[i]) & _U32
    return h % _MAP_HASH_SLOTS


class _MapValue:
    __slots__ = ("idx", "num", "n_accepted")

    def __init__(self, idx: int = 0, num: int = 0, n_accepted: int = -1) -> None:
        self.idx, self.num, self.n_accepted = idx, num, n_accepted


class _MapKey:
    __slots__ = ("idx", "stat_idx", "num", "values", "tokens")

    def __init__(self, idx: int, m: int, tokens: tuple[int, ...] = ()) -> None:
        self.idx = idx
        self.tokens = tokens
        self.stat_idx = 0
        self.num = 0
        self.values = [_MapValue(0, 0, m) for _ in range(_MAP_VALUES)]


class NgramMap(DrafterBase):
    """``ngram-map-k`` (``key_only=True``) and ``ngram-map-k4v`` (``key_only=False``)."""

    def __init__(self, size_n: int, size_m: int, min_hits: int, key_only: bool) -> None:
        self.size_n, self.size_m = int(size_n), int(size_m)
        self.min_hits = int(min_hits)
        self.key_only = bool(key_only)
        self.kind = "ngram-map-k" if self.key_only else "ngram-map-k4v"
        self.n_max = self.size_m
        self.reset()

    def reset(self) -> None:
        self.keys: list[_MapKey] = []
        self._index: dict[tuple[int, ...], int] = {}  # key tokens -> offset in ``keys``
        self.slots: dict[int, int] = {}  # hash slot -> index of an n-gram in the history (0: none)
        self.slots_last = 0              # highest history index entered into ``slots``
        self.size_last_begin = 0
        self.idx_last_check = 0
        self._last: tuple[int, int] | None = None  # (key offset, value slot) of the last draft

    def rewind(self, n_keep: int) -> None:
        """Only the first ``n_keep`` tokens of the history still hold."""
        self._begin(int(n_keep))

    def begin(self, prompt: Sequence[int]) -> None:
        self._begin(len(prompt))

    def _begin(self, size: int) -> None:
        n, m = self.size_n, self.size_m
        cleanup = self.size_last_begin
        if cleanup > size:
            cleanup = size - n - m if size > n + m else 0
        if size < self.idx_last_check:
            # the history shrank: forget what points past the surviving prefix
            self.slots = {h: i for h, i in self.slots.items() if i < cleanup}
            self.slots_last = cleanup - 1 if cleanup > 0 else 0
            kept: list[_MapKey] = []
            for key in self.keys:
                if key.idx >= cleanup:
                    continue
                if not self.key_only:
                    vals = [v for v in key.values if not (v.idx != 0 and v.idx >= cleanup)]
                    vals += [_MapValue(0, 0, v.n_accepted) for v in key.values[len(vals):]]
                    key.values = vals
                    if key.values[0].idx == 0:
                        continue
                kept.append(key)
            self.keys = kept
            self._index = {key.tokens: off for off, key in enumerate(kept)}
        self.idx_last_check = size
        self.size_last_begin = size

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        self._last = None
        inp = prompt
        cur = len(inp)
        n, m = self.size_n, self.size_m
        if cur < 2 * n + m:
            return []
        self.idx_last_check = cur
        key = inp[cur - n + 1:] + [id_last]
        top = cur - n - m - 1  # the newest n-gram start that leaves m tokens after it
        slb = self.size_last_begin

        match = 0
        hit = self.slots.get(_map_hash(key, 0, n), 0)
        if hit != 0 and hit < top and inp[hit:hit + n] == key:
            match = hit
        if match == 0 and slb > n + m + 1:
            match = _find_backwards(inp, key, slb - n - m - 1, self.slots_last)
        if match == 0:
            match = _find_backwards(inp, key, top, max(slb, self.slots_last))

        # enter the n-grams not yet hashed (same order as the searches: newest first wins a slot)
        slots = self.slots
        ranges = []
        if slb > n + m + 1:
            ranges.append(range(slb - n - m - 1, self.slots_last, -1))
        ranges.append(range(top, max(slb, self.slots_last), -1))
        for r in ranges:
            for j in r:
                slots.setdefault(_map_hash(inp, j, n), j)
        self.slots_last = max(top, self.slots_last)

        if match == 0:
            return []
        tkey = tuple(key)
        off = self._index.get(tkey, len(self.keys))  # keys are unique by content (llama.cpp scans them)
        if off == len(self.keys):
            self.keys.append(_MapKey(match, m, tkey))
            self._index[tkey] = off
        entry = self.keys[off]
        entry.num = min(entry.num + 1, _MAP_COUNT_MAX)

        if self.key_only:
            count = min(m, entry.values[0].n_accepted)
            self._last = (off, 0)
            return inp[match + n:match + n + count]

        if entry.num < self.min_hits:
            return []
        first = key[0]
        for i in range(entry.stat_idx, match + 1):
            if inp[i] != first or inp[i:i + n] != key:
                continue
            vb = i + n
            slot = -1
            for v, val in enumerate(entry.values):
                if val.idx == 0:
                    entry.values[v] = _MapValue(vb, 0, m)
                    slot = v
                    break
                if inp[vb:vb + m] == inp[val.idx:val.idx + m]:
                    slot = v
                    break
            if slot >= 0:
                entry.values[slot].num = min(entry.values[slot].num + 1, _MAP_COUNT_MAX)
        entry.stat_idx = match

        best, best_slot = 0, 0
        for v, val in enumerate(entry.values):
            if val.num > best:
                best, best_slot = val.num, v
        rest = sum(val.num for v, val in enumerate(entry.values) if v != best_slot)
        if rest > 0 and best < 2 * rest:
            return []  # no continuation dominates
        count = min(m, entry.values[best_slot].n_accepted)
        self._last = (off, best_slot)
        return inp[match + n:match + n + count]

    def accept(self, n_accepted: int) -> None:
        if self._last is not None:
            off, slot = self._last
            self.keys[off].values[slot].n_accepted = int(n_accepted)


# --------------------------------------------------------------------------------------------
# ngram-mod
# --------------------------------------------------------------------------------------------

_MOD_SLOTS = 4 * 1024 * 1024
_MOD_MUL = 6364136223846793005
_MOD_FILL_RESET = 0.25


class NgramMod(DrafterBase):
    """``ngram-mod``: a hash table (collisions overwrite) from ``n_match``-grams to the next token."""

    kind = "ngram-mod"

    def __init__(self, n_match: int, n_max: int, n_min: int) -> None:
        self.n, self.n_max_tokens, self.n_min = int(n_match), int(n_max), int(n_min)
        self.n_max = self.n_max_tokens
        self._pow = pow(_MOD_MUL, self.n - 1, 1 << 64)  # drops the oldest token of a rolling hash
        self.entries: dict[int, int] = {}
        self.i_last = 0
        self.n_draft_last = 0
        self.n_low = 0

    def reset(self) -> None:
        self.entries = {}
        self.i_last = self.n_draft_last = self.n_low = 0

    def _add_range(self, tokens: Sequence[int], start: int, stop: int) -> None:
        """Enter the n-grams starting at ``start..stop-1`` (each needs its next token)."""
        n, mul, pw, ent = self.n, _MOD_MUL, self._pow, self.entries
        if stop <= start:
            return
        h = 0
        for t in tokens[start:start + n]:
            h = (h * mul + t) & _U64
        for i in range(start, stop):
            ent[h % _MOD_SLOTS] = tokens[i + n]
            if i + 1 < stop:
                h = (((h - tokens[i] * pw) & _U64) * mul + tokens[i + n]) & _U64

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = self.n_draft_last = 0
        n = self.n
        if len(prompt) < n:
            return
        self._add_range(prompt, 0, len(prompt) - n)
        self.i_last = len(prompt) - n
        if len(self.entries) / _MOD_SLOTS > _MOD_FILL_RESET:
            self.entries = {}

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        self.n_draft_last = 0
        n = self.n
        cur = len(prompt)
        if cur < n:
            return []
        if self.i_last + 32 < cur:  # new n-grams are entered in chunks
            self._add_range(prompt, self.i_last, cur - n)
            self.i_last = cur - n
        window = prompt[cur - n + 1:] + [id_last]
        mul, pw, ent = _MOD_MUL, self._pow, self.entries
        h = 0
        for t in window:
            h = (h * mul + t) & _U64
        out: list[int] = []
        for i in range(self.n_max_tokens):
            tok = ent.get(h % _MOD_SLOTS)
            if tok is None:
                if i < self.n_min:
                    return []
                break
            out.append(tok)
            h = (((h - window[i] * pw) & _U64) * mul + tok) & _U64
            window.append(tok)
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last <= 0:
            return
        if n_accepted / self.n_draft_last < 0.25:
            self.n_low += 1
            if self.n_low >= 5:
                self.entries = {}
                self.n_low = 0
                self.i_last = 0
        else:
            self.n_low = 0


# --------------------------------------------------------------------------------------------
# ngram-cache
# --------------------------------------------------------------------------------------------

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2
_LAX_SAMPLES = (2, 2, 1, 1)
_LAX_PERCENT = (66, 50, 50, 50)
_STRICT_SAMPLES = (4, 3, 2, 2)
_STRICT_PERCENT = (75, 66, 66, 66)

NgramCounts = dict[tuple[int, ...], dict[int, int]]


def _cache_update(cache: NgramCounts, tokens: Sequence[int], n_new: int,
                  picks: dict[tuple[int, ...], int | None] | None = None) -> None:
    """Count the continuations of the n-grams ending in the last ``n_new`` tokens; ``picks`` (the
    memo of :func:`_pick_primary` over ``cache``) forgets the n-grams whose counts changed."""
    size = len(tokens)
    get = cache.get
    forget = picks.pop if picks else None  # an empty memo has nothing to forget
    for k in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(max(size - n_new, k), size):
            gram = tuple(tokens[i - k:i])
            t = tokens[i]
            part = get(gram)
            if part is None:
                cache[gram] = {t: 1}
            else:
                part[t] = part.get(t, 0) + 1
            if forget is not None:
                forget(gram, None)


def load_ngram_cache(path: str | os.PathLike[str]) -> NgramCounts:
    """Read a llama.cpp n-gram cache file (``llama-lookup-create`` / ``--lookup-cache-*``)."""
    try:
        data = read_regular_file(path)  # a FIFO named as the cache would block forever
    except (OSError, ValueError) as e:
        raise SpeculativeError(f"cannot read the n-gram cache {os.fspath(path)!r}: {e}") from None
    out: NgramCounts = {}
    off, size = 0, len(data)
    head = struct.Struct(f"<{NGRAM_MAX}ii")
    while off < size:
        if off + head.size > size:
            raise SpeculativeError(f"{os.fspath(path)}: truncated n-gram cache at byte {off}")
        *gram, n_tok = head.unpack_from(data, off)
        off += head.size
        if n_tok <= 0 or off + 8 * n_tok > size:
            raise SpeculativeError(f"{os.fspath(path)}: corrupt n-gram cache entry at byte {off - head.size}")
        key = tuple(t for t in gram if t != -1)
        if not key or any(t < 0 for t in key):
            raise SpeculativeError(f"{os.fspath(path)}: invalid n-gram {gram} at byte {off - head.size}")
        part = out.setdefault(key, {})
        for tok, cnt in struct.iter_unpack("<ii", data[off:off + 8 * n_tok]):
            if tok < 0 or cnt <= 0:
                raise SpeculativeError(f"{os.fspath(path)}: invalid token count ({tok}, {cnt}) near byte {off}")
            part[tok] = part.get(tok, 0) + cnt
        off += 8 * n_tok
    return out


#: libstdc++'s bucket counts of a ``std::unordered_map`` as it grows: it rehashes to the next one
#: when an insertion would exceed the current count (max_load_factor 1).
_STL_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061)


def stl_order(keys: Sequence[int]) -> list[int]:
    """The iteration order of a libstdc++ ``std::unordered_map<llama_token, int>`` into which
    ``keys`` (distinct, non-negative) were inserted in this order.

    llama.cpp's n-gram cache keeps each n-gram's continuations in such a map and, among equally
    counted ones, drafts the first it iterates over: a tie is decided by this order, which is not
    the insertion order (a node goes to the front of its bucket's run, or of the whole list when
    its bucket is empty; a rehash relinks the nodes)."""
    if len(keys) > _STL_BUCKETS[-1]:
        return list(keys)  # beyond any vocabulary llama.cpp loads
    head = object()
    nxt: dict[Any, Any] = {head: None}
    buckets: dict[int, Any] = {}
    grow = iter(_STL_BUCKETS)
    n_bkt = next(grow)
    for n, k in enumerate(keys):
        if n == n_bkt:  # rehash before inserting (std::_Hashtable::_M_rehash_aux, unique keys)
            n_bkt = next(grow)
            p, nxt[head], buckets, first_bkt = nxt[head], None, {}, 0
            while p is not None:
                after, b = nxt[p], p % n_bkt
                if b in buckets:
                    prev = buckets[b]
                    nxt[p], nxt[prev] = nxt[prev], p
                else:
                    nxt[p], nxt[head] = nxt[head], p
                    buckets[b] = head
                    if nxt[p] is not None:
                        buckets[first_bkt] = p
                    first_bkt = b
                p = after
        b = k % n_bkt
        if b in buckets:  # std::_Hashtable::_M_insert_bucket_begin
            prev = buckets[b]
            nxt[k], nxt[prev] = nxt[prev], k
        else:
            nxt[k], nxt[head] = nxt[head], k
            if nxt[k] is not None:
                buckets[nxt[k] % n_bkt] = k
            buckets[b] = head
    out = []
    p = nxt[head]
    while p is not None:
        out.append(p)
        p = nxt[p]
    return out


def _first_best(part: dict[int, int], best: int, weight: Callable[[int, int], int]) -> int:
    """Among ``part``'s tokens of weight ``best``, the one llama.cpp's map iterates over first."""
    tied = [tok for tok, cnt in part.items() if weight(tok, cnt) == best]
    if len(tied) == 1:
        return tied[0]
    rank = {tok: i for i, tok in enumerate(stl_order(list(part)))}
    return min(tied, key=rank.__getitem__)


def _pick_part(part: dict[int, int] | None, static_part: dict[int, int], min_samples: int,
               min_percent: int) -> int | None:
    """The continuation ``part`` drafts after one n-gram (weighted by the static cache), or None."""
    if part is None:
        return None

    def weight(tok: int, cnt: int) -> int:
        return cnt * (100 * static_part[tok] if tok in static_part else 1)

    best_w = total = 0
    for tok, cnt in part.items():
        best_w = max(best_w, weight(tok, cnt))
        total += cnt
    best = _first_best(part, best_w, weight)
    if total < min_samples or 100 * part[best] < min_percent * total:
        return None
    return best


_UNSET = object()
_EMPTY: dict[int, int] = {}


def _pick_primary(cache: NgramCounts, seq: Sequence[int], static_part: dict[int, int],
                  min_samples: Sequence[int], min_percent: Sequence[int],
                  picks: dict[tuple[int, ...], int | None] | None = None) -> int | None:
    """The continuation of the longest n-gram ending ``seq`` (``NGRAM_MIN..NGRAM_MAX`` tokens) that
    qualifies in ``cache``. ``picks`` memoizes the answer per n-gram while no static weights apply
    (whoever updates ``cache`` drops the n-grams whose counts changed)."""
    end = len(seq)
    memo = picks is not None and not static_part
    for k in range(min(NGRAM_MAX, end), NGRAM_MIN - 1, -1):  # longest n-gram first
        g = tuple(seq[end - k:end])
        if memo:
            tok = picks.get(g, _UNSET)  # type: ignore[union-attr, arg-type]
            if tok is _UNSET:
                tok = picks[g] = _pick_part(cache.get(g), static_part, min_samples[k - 1],  # type: ignore[index]
                                            min_percent[k - 1])
        else:
            tok = _pick_part(cache.get(g), static_part, min_samples[k - 1], min_percent[k - 1])
        if tok is not None:
            return tok  # type: ignore[return-value]
    return None


def _pick_static(cache: NgramCounts, gram: tuple[int, ...]) -> int | None:
    part = cache.get(gram)
    if not part:
        return None
    best_c = max(part.values())
    total = sum(part.values())
    if total < _LAX_SAMPLES[NGRAM_STATIC - 1] or 100 * best_c < _LAX_PERCENT[NGRAM_STATIC - 1] * total:
        return None
    return _first_best(part, best_c, lambda tok, cnt: cnt)


class NgramCache(DrafterBase):
    """``ngram-cache``: continuation counts of the context's 1..4-grams (plus optional file caches)."""

    kind = "ngram-cache"

    def __init__(self, n_draft: int = 8, static: NgramCounts | None = None,
                 dynamic: NgramCounts | None = None) -> None:
        self.n_draft = int(n_draft)
        self.n_max = self.n_draft
        self.static = static or {}
        self.dynamic = dynamic or {}
        self.reset()

    def reset(self) -> None:
        self.context: NgramCounts = {}
        self.cache_size = 0
        # memoized picks per n-gram (see _pick_primary); the dynamic cache never changes here
        self._picks_context: dict[tuple[int, ...], int | None] = {}
        self._picks_dynamic: dict[tuple[int, ...], int | None] = {}

    def rewind(self, n_keep: int) -> None:
        self.reset()  # the context counts are rebuilt from the history at the next draft

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        n_prompt = len(prompt)
        if self.cache_size < n_prompt + 1:
            # like llama.cpp, only n-grams within each newly appended chunk are counted
            new = prompt[self.cache_size:] + [id_last]
            _cache_update(self.context, new, len(new), self._picks_context)
            self.cache_size = n_prompt + 1
        if n_prompt + 1 < NGRAM_STATIC:
            return []
        # the lookups read the last NGRAM_MAX tokens of the input and the drafted ones after it
        # (a window holds at least k tokens exactly when the whole input does)
        seq = prompt[max(n_prompt - (NGRAM_MAX - 1), 0):]
        seq.append(id_last)
        static = self.static
        out: list[int] = []
        while len(out) < self.n_draft:
            s_gram = tuple(seq[len(seq) - NGRAM_STATIC:])
            static_part = static.get(s_gram, _EMPTY) if static else _EMPTY
            tok = _pick_primary(self.context, seq, static_part, _LAX_SAMPLES, _LAX_PERCENT, self._picks_context)
            if tok is None and self.dynamic:
                tok = _pick_primary(self.dynamic, seq, static_part, _STRICT_SAMPLES, _STRICT_PERCENT,
                                    self._picks_dynamic)
            if tok is None and static:
                tok = _pick_static(static, s_gram)
            if tok is None:
                break
            out.append(tok)
            seq.append(tok)
        return out

    def accept(self, n_accepted: int) -> None:
        pass


class PromptLookup(StatelessDrafter):
    """A prompt-lookup callable (``LlamaPromptLookupDecoding``, or anything with its call
    signature) as a drafter: its proposals are exactly what the object returns for the history
    including the pending token, cut to ``n_max`` tokens."""

    kind = "prompt-lookup"

    def __init__(self, fn: Callable[[np.ndarray], Any], n_max: int) -> None:
        self.fn = fn
        self.n_max = int(n_max)

    def draft(self, prompt: list[int], id_last: int) -> list[int]:
        out = self.fn(np.asarray([*prompt, id_last], dtype=np.intc))
        return [int(t) for t in np.asarray(out).reshape(-1)[:self.n_max]]


__all__ = ["NgramCache", "NgramCounts", "NgramMap", "NgramMod", "NgramSimple", "PromptLookup", "load_ngram_cache",
           "stl_order"]

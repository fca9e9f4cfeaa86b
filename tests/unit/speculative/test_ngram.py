"""The n-gram drafters on hand-made histories (no model): what each type drafts and when."""

from __future__ import annotations

import struct

from llama_cpp.speculative.ngram import NgramCache, NgramMap, NgramMod, NgramSimple, load_ngram_cache


def test_simple_copies_the_latest_earlier_match():
    d = NgramSimple(size_n=2, size_m=3)
    hist = [9, 1, 2, 3, 4, 5, 1, 2, 7, 8, 6, 6, 1]
    # key = [1, id_last=2]; latest earlier match at index 6 -> continuation 7, 8, 6
    assert d.draft(hist, 2) == [7, 8, 6]
    assert d.draft(hist, 99) == []          # no match
    assert d.draft([1, 2, 1], 2) == []      # too short: needs more than size_n + size_m + 1 tokens
    # the copy is cut at the end of the history and dropped when shorter than size_n
    assert NgramSimple(2, 8).draft([5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 1, 2, 3, 4, 5, 6, 1], 2) == [3, 4, 5, 6, 1]


def test_map_k_limits_the_draft_to_what_was_accepted_last():
    d = NgramMap(size_n=2, size_m=4, min_hits=1, key_only=True)
    hist = [0, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 1]
    d.begin(hist)
    assert d.draft(hist, 2) == [3, 4, 5, 6]
    d.accept(1)
    assert d.draft(hist, 2) == [3]          # the key's last draft kept one token
    d.accept(0)
    assert d.draft(hist, 2) == []           # like llama.cpp: an empty draft from then on
    assert d.draft(hist, 77) == []


def test_map_k4v_needs_a_dominant_continuation():
    d = NgramMap(size_n=1, size_m=2, min_hits=1, key_only=False)
    # key 1 is followed by (2, 3) twice and by (4, 5) twice: no continuation dominates
    hist = [0, 1, 2, 3, 1, 4, 5, 1, 2, 3, 1, 4, 5, 0, 0, 0]
    d.begin(hist)
    assert d.draft(hist, 1) == []
    # (2, 3) three times against (4, 5) once: drafts the latest match's continuation
    hist2 = [0, 1, 2, 3, 1, 2, 3, 1, 4, 5, 1, 2, 3, 0, 0, 0]
    d2 = NgramMap(size_n=1, size_m=2, min_hits=1, key_only=False)
    d2.begin(hist2)
    assert d2.draft(hist2, 1) == [2, 3]
    d3 = NgramMap(size_n=1, size_m=2, min_hits=3, key_only=False)
    d3.begin(hist2)
    assert d3.draft(hist2, 1) == []  # the first lookup of the key is one hit of three needed


def test_map_forgets_what_a_rewind_removed():
    d = NgramMap(size_n=2, size_m=2, min_hits=1, key_only=True)
    hist = [0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 1]
    d.begin(hist)
    assert d.draft(hist, 2) == [3, 4]
    d.rewind(3)
    d.begin(hist[:3])
    assert d.keys == [] and all(i < 3 for i in d.slots.values())


def test_mod_chains_lookups_and_resets_after_low_acceptance():
    d = NgramMod(n_match=2, n_max=4, n_min=2)
    hist = [1, 2, 3, 4, 5, 6, 7, 1]
    d.begin(hist)
    assert d.draft(hist, 2) == [3, 4, 5, 6]  # (1,2)->3, (2,3)->4, ...
    assert NgramMod(2, 4, 2).draft([9, 9, 1], 5) == []  # nothing known: below n_min
    for _ in range(5):
        d.draft(hist, 2)
        d.accept(0)
    assert d.entries == {}  # five drafts in a row under 25 % accepted


def test_cache_counts_and_thresholds(tmp_path):
    d = NgramCache(n_draft=3)
    hist = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    assert d.draft(hist, 2) == [3, 1, 2]
    assert NgramCache(n_draft=3).draft([1, 2, 3, 4], 5) == []  # each 1-gram seen once: too few samples
    # a static cache (llama.cpp's file format) alone can draft
    path = tmp_path / "static.bin"
    with open(path, "wb") as f:
        f.write(struct.pack("<4ii", 7, 8, -1, -1, 1) + struct.pack("<ii", 9, 5))
        f.write(struct.pack("<4ii", 8, 9, -1, -1, 2) + struct.pack("<ii", 10, 3) + struct.pack("<ii", 11, 1))
    static = load_ngram_cache(path)
    assert static == {(7, 8): {9: 5}, (8, 9): {10: 3, 11: 1}}
    assert NgramCache(n_draft=4, static=static).draft([0, 7], 8) == [9, 10]

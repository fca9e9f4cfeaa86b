"""Resource behaviour: repeated multimodal embedding calls do not grow memory."""

from __future__ import annotations

import gc

from llama_cpp.mtmd import Image, MarkerPrompt


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS missing from /proc/self/status")


def test_500_calls_do_not_grow_memory(handler, png_path, png2):
    data = png_path.read_bytes()
    inputs = [["a photo", Image(data)], MarkerPrompt("<__media__> and text", [png2])]
    for _ in range(50):  # warm up allocator pools and graph caches
        handler.embed(inputs)
    gc.collect()
    before = _rss_kib()
    for _ in range(500):
        handler.embed(inputs)
    gc.collect()
    grown = _rss_kib() - before
    # each call creates and frees 2 bitmaps, 2 chunk lists, an mtmd batch and decode batches;
    # a leak of any of them (>= tens of KiB per call) would exceed this bound many times over
    assert grown < 4096, f"RSS grew by {grown} KiB over 500 calls"

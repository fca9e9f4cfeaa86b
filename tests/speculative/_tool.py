"""Driving a decoder the way ``llama-speculative-simple`` drives llama.cpp's, and reading the
tool's per-type statistics, so that drafts and acceptance can be compared exactly."""

from __future__ import annotations

import re


def drive_like_tool(dec, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Generate as the tool does with ``-n n``: each step's draft is cut to the budget ``n - done - 1``
    (a budget of 0 or less cuts nothing), and generation stops after the step that passes ``n``.

    Returns the tokens and the acceptance per draft position as the tool reports it: per accept
    call, which llama.cpp counts from the first non-empty draft on (empty drafts after it count)."""
    from .util import greedy_sampler

    drafter = dec.drafters[-1]
    lengths: list[int] = []
    inner = drafter.draft

    def draft(*args):
        out = inner(*args)
        lengths.append(len(out))
        return out

    drafter.draft = draft
    dec.prefill(prompt)
    st = dec.stats
    while st.generated <= n:
        budget = n - st.generated - 1
        gen = dec.generate(greedy_sampler(), budget + 1 if budget > 0 else 10 * n)
        next(gen)  # one step: its tokens are in the history once the first is yielded
        gen.close()
    calls = len(lengths) - next((i for i, k in enumerate(lengths) if k), len(lengths))
    rates = [round(a / calls, 3) for a in st.accepted_at if a] if calls else []
    return dec.history[len(prompt):], rates


def tool_stats(stderr: bytes, kind: str) -> tuple[int, int, list[float]]:
    """(drafts, accepted tokens, acceptance per draft position) of ``kind`` from the tool's log."""
    err = stderr.decode(errors="replace")
    m = re.search(kind + r": .*#gen drafts =\s*(\d+).*#acc tokens =\s*(\d+)", err)
    assert m, err[-2000:]
    rates = re.search(kind + r": .*#acc rate/pos = \(([0-9., ]*)\)", err)
    return int(m.group(1)), int(m.group(2)), [float(x) for x in rates.group(1).split(",")] if rates and rates.group(1) else []


def tool_drafted_tokens(stderr: bytes, kind: str) -> int:
    """The tokens ``kind`` drafted in all (the tool's ``#gen tokens``), accepted or not."""
    err = stderr.decode(errors="replace")
    m = re.search(kind + r": .*#gen tokens =\s*(\d+)", err)
    assert m, err[-2000:]
    return int(m.group(1))

"""Reading a server engine job to its end, for tests that drive ``SlotEngine`` without HTTP."""

from __future__ import annotations

from typing import Any


async def job_text(job: Any, timeout: float = 120) -> str:
    """The completion text a job produced: its result's, or its streamed chunks joined; an error raises."""
    text = []
    while True:
        kind, value = await job.get(timeout=timeout)
        if kind == "chunk":
            text.append(value["choices"][0]["text"])
        elif kind == "result":
            return value["choices"][0]["text"]
        elif kind == "error":
            raise value
        elif kind == "end":
            return "".join(text)

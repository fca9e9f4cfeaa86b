"""A request's side of an engine: its channel (:class:`Job`), the events of a step (:class:`Outbox`),
what a slot runs (:class:`GenRequest`) and the errors that refuse or end it."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from ...llama_grammar import LlamaGrammar


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full (HTTP 429)."""

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("the server is busy: every slot is generating and the queue is full; retry later")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The engine no longer accepts requests (HTTP 503)."""


class Cancelled(Exception):
    """The request was cancelled by shutdown."""


class Job:
    """One request's channel from an engine thread to its asyncio handler.

    The engine calls :meth:`put` (any thread); the handler awaits :meth:`get`. Events are
    ``("started", None)``, ``("chunk", dict)``, ``("result", obj)``, ``("error", exc)`` and
    ``("end", None)``. :meth:`cancel` (a client went away) is seen by the engine at its next step.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.done = False
        self.interruptible = False  # a stream that interrupt_requests may end early
        self.owner: object = None  # the request this job is one choice of (its siblings never interrupt it)

    def put(self, kind: str, value: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._deliver, kind, value)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def _deliver(self, kind: str, value: Any) -> None:
        """Runs in the job's event loop."""
        self._queue.put_nowait((kind, value))

    async def get(self, timeout: float | None = None) -> tuple[str, Any]:
        if timeout is None:
            return await self._queue.get()
        return await asyncio.wait_for(self._queue.get(), timeout)

    def cancel(self) -> None:
        self.cancelled.set()


class Outbox:
    """Events of one engine step, handed to each event loop in one call (one wake-up per step, not
    one per token and request)."""

    def __init__(self) -> None:
        self.items: list[tuple[Job, str, Any]] = []

    def put(self, job: Job, kind: str, value: Any = None) -> None:
        self.items.append((job, kind, value))

    def flush(self) -> None:
        if not self.items:
            return
        by_loop: dict[Any, list[tuple[Job, str, Any]]] = {}
        for item in self.items:
            by_loop.setdefault(item[0]._loop, []).append(item)
        self.items = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # that loop is closed: nobody is listening any more
                for job, _, _ in items:
                    job.cancelled.set()


def _deliver_all(items: list[tuple[Job, str, Any]]) -> None:
    for job, kind, value in items:
        job._deliver(kind, value)


@dataclasses.dataclass
class GenRequest:
    """One completion for the slot engine: the prompt as tokens and everything sampling needs."""

    prompt_tokens: list[int]
    max_tokens: int
    sampling: dict[str, Any]  # keyword arguments of Llama.make_sampler
    grammar: LlamaGrammar | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    logprobs: int | None = None
    echo: bool = False
    completion_id: str = ""
    created: int = 0
    model_name: str = ""
    prompt_chars: int | None = None  # the text prompt's length: logprob offsets start after it
    lora: tuple[float, ...] = ()  # one scale per LoRA adapter of the model (the server's lora.LoraSet)
    # the prompt's image/audio chunks (engine.media.MediaSpan): their entries in prompt_tokens are keys, not tokens
    media: list[Any] = dataclasses.field(default_factory=list)



def completion_chunk(req: GenRequest, data: bytes, reason: str | None, lps: Any) -> dict[str, Any]:
    """A ``text_completion`` chunk, shaped as :func:`llama_cpp._generation.loop.completion_chunks` makes them."""
    return {"id": req.completion_id, "object": "text_completion", "created": req.created, "model": req.model_name,
            "choices": [{"text": data.decode("utf-8", errors="ignore"), "index": 0, "logprobs": lps,
                         "finish_reason": reason}]}


__all__ = ["Cancelled", "GenRequest", "Job", "Outbox", "QueueFull", "ShuttingDown", "completion_chunk"]

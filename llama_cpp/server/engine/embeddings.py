"""Embedding and reranking requests batched across clients: the inputs of every waiting request (up to
``n_parallel`` requests) packed into shared decodes, one sequence per input, as llama-server's slots
embed concurrent requests.

Packing is :func:`llama_cpp.llama_embedding.embed_token_lists`'s (within ``n_batch`` and
``n_seq_max``; a non-causal model's input whole in one micro-batch), so a request's vectors are the
ones it gets alone, where its inputs would be packed with each other anyway. Work that is not a
text :class:`EmbedRequest` (inputs with media, through the projector's own context) runs alone,
as on :class:`~.serial.SerialEngine`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...llama import Llama
from ...llama_cpp import LLAMA_POOLING_TYPE_NONE
from ...llama_embedding import embed_token_lists
from .jobs import Job, QueueFull, ShuttingDown
from .serial import SerialEngine


@dataclasses.dataclass
class EmbedRequest:
    """A request's inputs as token lists (checked against the context and vocabulary before it queues)."""

    token_lists: list[list[int]]


class EmbeddingEngine(SerialEngine):
    """Batches :class:`EmbedRequest` jobs of up to ``n_parallel`` requests per pass (see the module docstring)."""

    serial = False

    def __init__(self, llama: Llama, n_parallel: int, max_queue: int, lora: Any = None, media: Any = None) -> None:
        self._n_parallel = n_parallel
        self.passes = 0  # embedding passes over the shared context (each one or more packed decodes)
        super().__init__(llama, max_queue, lora=lora, media=media)

    @property
    def capacity(self) -> int:
        return self._n_parallel + self.max_queue

    @property
    def n_slots(self) -> int:
        return self._n_parallel

    def submit(self, job: Job, work: EmbedRequest | Callable[[Llama], Any]) -> None:
        with self._cv:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if self._running + len(self._waiting) >= self.capacity:
                raise QueueFull(retry_after=1)
            self._waiting.append((job, work))
            self._cv.notify()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {"engine": "embeddings", "slots": self._n_parallel, "active": self._running,
                    "waiting": len(self._waiting)}

    def slots(self) -> list[dict[str, Any]]:
        with self._cv:
            return [{"id": i, "n_ctx": self.llama.n_ctx(), "speculative": False, "is_processing": i < self._running}
                    for i in range(self._n_parallel)]

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._wait_for_work():
                    return
                job, work = self._waiting.popleft()
                group = [(job, work)]
                if isinstance(work, EmbedRequest):  # every other text request waiting joins it, in order
                    rest = []
                    for item in self._waiting:
                        if isinstance(item[1], EmbedRequest) and len(group) < self._n_parallel:
                            group.append(item)
                        else:
                            rest.append(item)
                    self._waiting.clear()
                    self._waiting.extend(rest)
                self._running = len(group)
                self._current = job
            try:
                live = [(j, w) for j, w in group if not j.cancelled.is_set()]
                if isinstance(work, EmbedRequest):
                    if live:
                        self._embed(live)
                elif live:
                    self._execute(job, work)  # type: ignore[arg-type]
            finally:
                for j, _ in group:
                    j.done = True
                with self._cv:
                    self._running = 0
                    self._current = None

    def _embed(self, group: list[tuple[Job, EmbedRequest]]) -> None:
        t0 = time.perf_counter()
        lists = [toks for _, req in group for toks in req.token_lists]
        llama = self.llama
        try:
            llama.reset()
            try:
                rows, counts = embed_token_lists(llama.native_context(), llama.native_model(), lists, normalize=-1,
                                                 truncate=False)
            finally:
                llama.reset()
        except Exception as exc:  # noqa: BLE001 - each request of the pass gets it
            for job, _ in group:
                job.put("error", exc)
            return
        self.passes += 1
        none = llama.native_context().pooling_type() == LLAMA_POOLING_TYPE_NONE
        seconds = time.perf_counter() - t0
        at = 0
        for job, req in group:
            k = len(req.token_lists)
            mine = [np.asarray(r) for r in rows[at:at + k]] if none else list(rows[at:at + k])
            total = int(sum(counts[at:at + k]))
            at += k
            job.put("result", {"rows": mine, "usage": {"prompt_tokens": total, "total_tokens": total}})
            self.counters.add(total, 0, seconds * total / max(sum(counts), 1), 0, 0.0)


__all__ = ["EmbedRequest", "EmbeddingEngine"]

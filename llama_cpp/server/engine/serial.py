"""One request at a time through ``Llama`` itself, behind a bounded queue."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...llama import Llama
from .counters import Counters
from .jobs import Cancelled, Job, QueueFull, ShuttingDown
from .lifecycle import Lifecycle


class SerialEngine(Lifecycle):
    """One request at a time through ``Llama`` in a worker thread, behind a bounded queue.

    A work item is ``work(llama)`` returning a result object or an iterator of chunks; a
    cancelled job's iterator is closed at its next chunk. With ``interrupt`` (upstream's
    ``interrupt_requests``) a stream also ends, after its current chunk and without a final
    ``finish_reason``, as soon as another request is waiting; whole responses always finish.
    """

    serial = True

    def __init__(self, llama: Llama, max_queue: int, interrupt: bool = False, lora: Any = None,
                 speculative: bool = False, media: Any = None) -> None:
        self.llama = llama
        self.media = media  # the model's media embedder (an MTMDEmbeddingHandler), freed before the model
        self.speculative = speculative  # its Llama drafts: its requests' statistics are counted
        self.lora = lora  # the model's LoraSet (work items switch its scales), freed with the model
        self.max_queue = max_queue
        self.interrupt = interrupt
        self._cv = threading.Condition()
        self._waiting: collections.deque[tuple[Job, Callable[[Llama], Any]]] = collections.deque()
        self._running = 0
        self._current: Job | None = None
        self._accepting = True
        self._stop = False
        self.counters = Counters()
        self._thread = threading.Thread(target=self._run, name="llama-serial", daemon=True)
        self._thread.start()

    @property
    def capacity(self) -> int:
        """Requests that can be running or waiting at once."""
        return 1 + self.max_queue

    def submit(self, job: Job, work: Callable[[Llama], Any]) -> None:
        with self._cv:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if self._running + len(self._waiting) >= 1 + self.max_queue:
                raise QueueFull(retry_after=1)
            self._waiting.append((job, work))
            self._cv.notify()

    @property
    def busy(self) -> int:
        with self._cv:
            return self._running + len(self._waiting)

    def stats(self) -> dict[str, Any]:
        with self._cv:
            out: dict[str, Any] = {"engine": "serial", "slots": 1, "active": self._running,
                                   "waiting": len(self._waiting)}
        if self.speculative:
            c = self.counters
            out["speculative"] = {"steps": c.spec_steps, "drafted": c.spec_drafted, "accepted": c.spec_accepted,
                                  "acceptance_rate": c.spec_accepted / c.spec_drafted if c.spec_drafted else 0.0}
        return out

    @property
    def n_slots(self) -> int:
        return 1

    @property
    def n_ctx_slot(self) -> int:
        return self.llama.n_ctx()

    def kv_tokens(self) -> int:
        """Tokens the context holds (the last request's, kept for prefix reuse)."""
        return self.llama.n_tokens

    def slots(self) -> list[dict[str, Any]]:
        """The one slot, as llama-server's ``/slots`` lists it."""
        with self._cv:
            return [{"id": 0, "n_ctx": self.llama.n_ctx(), "speculative": False, "is_processing": self._running > 0}]

    def _wait_for_work(self) -> bool:
        """With the lock held: wait until a job is queued; False when the engine stops instead."""
        while not self._stop and not self._waiting:
            self._cv.wait()
        return not self._stop

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._wait_for_work():
                    return
                job, work = self._waiting.popleft()
                self._running = 1
                self._current = job
            try:
                if not job.cancelled.is_set():
                    self._execute(job, work)
            finally:
                job.done = True
                with self._cv:
                    self._running = 0
                    self._current = None

    @property
    def n_decode(self) -> int | None:
        """Decodes of the model's context (and of its media embedder's), as llama-server's ``n_decode_total``;
        None where a speculative decoder decodes the target itself (its verify batches are not counted)."""
        if self.speculative:
            return None
        n = self.llama.native_context().n_decode
        if self.media is not None and not self.media.closed:
            n += self.media.context.n_decode
        return n

    def _execute(self, job: Job, work: Callable[[Llama], Any]) -> None:
        t0 = time.perf_counter()
        t_first = None
        usage: dict[str, Any] = {}
        self.llama.last_prompt_cached = None  # set where Llama evaluates the prompt itself (prefix reuse)
        try:
            out = work(self.llama)
            if isinstance(out, Iterator):
                job.put("started")
                try:
                    for chunk in out:
                        if job.cancelled.is_set():
                            job.put("error", Cancelled("the request was cancelled"))
                            return
                        t_first = t_first or time.perf_counter()
                        usage = chunk.get("usage") or usage if isinstance(chunk, dict) else usage
                        job.put("chunk", chunk)
                        if self.interrupt and job.interruptible and self._someone_else_waits(job):
                            break
                finally:
                    close = getattr(out, "close", None)
                    if close is not None:
                        close()
                job.put("end")
            else:
                usage = (out.get("usage") if isinstance(out, dict) else None) or {}
                job.put("result", out)
        except Exception as exc:
            job.put("error", exc)
            return
        now = time.perf_counter()
        first = t_first or now
        n_prompt = int(usage.get("prompt_tokens", 0) or 0)
        cached = usage.get("prompt_tokens_cached")
        if cached is None:
            cached = self.llama.last_prompt_cached or 0
        self.counters.add(n_prompt, min(int(cached), n_prompt), first - t0, int(usage.get("completion_tokens", 0)),
                          now - first)
        if self.speculative and isinstance(usage.get("speculative"), dict):
            self.counters.add_speculative(usage["speculative"])

    def _someone_else_waits(self, job: Job) -> bool:
        with self._cv:
            return any(not j.cancelled.is_set() and (j.owner is None or j.owner is not job.owner)
                       for j, _ in self._waiting)

    def _cancel_running(self) -> None:
        if self._current is not None:
            self._current.cancel()  # a running request sees it at its next chunk

    def _free(self) -> None:
        if self.media is not None:
            self.media.close()
        if self.lora is not None:
            self.lora.close()
        self.llama.close()


def collect_stats_stream(llama: Llama, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``chunks`` with the MTP decoder's statistics added to the last one's ``usage``."""
    last = None
    for c in chunks:
        if last is not None:
            yield last
        last = c
    if last is not None:
        st = llama.last_speculative_stats
        if st is not None and "usage" in last:
            last["usage"]["speculative"] = st.as_dict()
        yield last


__all__ = ["SerialEngine", "collect_stats_stream"]

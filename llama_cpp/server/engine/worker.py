"""The serial engine over a model in a worker process: what serves a model split over RPC servers.

llama.cpp's RPC client aborts the process that holds the model when a server's connection is lost,
so such a model is a :class:`~llama_cpp.LlamaWorker` (the ``Llama`` API forwarded to a child
process, streams included) run one request at a time. A stream that had sent output when a server
went away ends with an error event naming the server (:class:`~llama_cpp.WorkerLostError`); a request
that had sent nothing yet runs once more after the model loads again in a new worker (every server
probed first: a restarted one is found), and fails with a 503 naming the server where that cannot
load. A lost worker is likewise loaded again before the next request.

The prompt work the routes do before a request runs (tokenizing, the chat template, grammars) uses
the model's vocabulary, which the server opens in its own process (``vocab_only``: no weights, no
RPC), so the routes see a ``Llama`` as for any served model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..._errors import LlamaError, WorkerLostError
from ...llama import Llama, LlamaWorker
from .jobs import Job
from .serial import SerialEngine

log = logging.getLogger("llama_cpp.server")


class WorkerEngine(SerialEngine):
    """A :class:`SerialEngine` whose ``Llama`` is a :class:`LlamaWorker`; ``vocab`` is the model's
    in-process vocabulary (closed with it). A lost worker is reloaded before the next request runs."""

    def __init__(self, llama: LlamaWorker, vocab: Llama, max_queue: int, alias: str, interrupt: bool = False,
                 speculative: bool = False) -> None:
        self.vocab = vocab
        self.alias = alias
        self._n_ctx = llama.n_ctx()
        self._kv_tokens = 0  # read after each request: a read during one would wait for it (or be refused)
        super().__init__(llama, max_queue, interrupt=interrupt, speculative=speculative)

    @property
    def n_ctx_slot(self) -> int:
        return self._n_ctx

    def kv_tokens(self) -> int:
        """Tokens the worker's context held after the last request."""
        return self._kv_tokens

    @property
    def n_decode(self) -> None:
        """Not reported: the decodes happen in the worker process (``n_decode_total`` is left out, as for a
        model that speculates)."""
        return None

    def slots(self) -> list[dict[str, Any]]:
        with self._cv:
            return [{"id": 0, "n_ctx": self._n_ctx, "speculative": False, "is_processing": self._running > 0}]

    def _execute(self, job: Job, work: Callable[[Llama], Any]) -> None:
        # a worker whose server went away while it was idle learns it at its next computation: a
        # request that fails so before anything of it was sent runs once more in a reloaded worker
        held = _Held(job)
        self._run_once(held, work)
        if held.lost_unsent:
            log.warning("model %s: its worker process was lost before the request produced anything: running it "
                        "again after loading the model again", self.alias)
            self._run_once(job, work)

    def _run_once(self, job: Any, work: Callable[[Llama], Any]) -> None:
        if not self.llama.alive and not self._reload(job):
            return
        try:
            super()._execute(job, work)
        finally:
            try:
                self._kv_tokens = self.llama.n_tokens
            except LlamaError:  # the worker was lost during the request
                self._kv_tokens = 0

    def _reload(self, job: Any) -> bool:
        """Load the model again in a new worker (every server probed first); False: the request failed."""
        lost = self.llama.lost
        log.warning("model %s: loading it again in a new worker process (%s)", self.alias,
                    lost if lost is not None else "its worker process is gone")
        try:
            self.llama.reload()
        except LlamaError as exc:  # a server still unreachable, or refused: this request fails by name
            log.error("model %s could not be loaded again: %s", self.alias, exc)
            job.put("error", WorkerLostError(f"the model {self.alias} is not available: loading it again "
                                             f"failed: {exc}"))
            return False
        log.info("model %s ready again (worker pid %s)", self.alias, self.llama.worker_pid)
        return True

    def _free(self) -> None:
        try:
            super()._free()
        finally:
            self.vocab.close()


class _Held:
    """A job whose "started" waits for its first output: a lost worker before any (``lost_unsent``)
    is not delivered, so that the request can run again."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.started = False  # "started" held back
        self.sent = False
        self.lost_unsent = False

    def __getattr__(self, name: str) -> Any:  # cancelled, interruptible, owner
        return getattr(self.job, name)

    def put(self, kind: str, value: Any = None) -> None:
        if kind == "started" and not self.sent:
            self.started = True
            return
        if not self.sent and kind == "error" and isinstance(value, WorkerLostError):
            self.lost_unsent = True
            return
        if not self.sent and self.started:
            self.job.put("started")
        self.sent = True
        self.job.put(kind, value)


__all__ = ["WorkerEngine"]

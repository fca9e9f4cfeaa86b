"""The serial engine over a model in a worker process: what serves a model split over RPC servers.

llama.cpp's RPC client aborts the process that holds the model when a server's connection is lost,
so such a model is a :class:`~llama_cpp.LlamaWorker` (the ``Llama`` API forwarded to a child
process, streams included) run one request at a time. The request it was computing when a server
went away fails with :class:`~llama_cpp.WorkerLostError` naming the server (a 503, or an error event
on a stream that started); the next request loads the model again, every server probed first (a
restarted one is found; one still gone fails that request by name, and the next tries again).

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
        super().__init__(llama, max_queue, interrupt=interrupt, speculative=speculative)

    @property
    def n_ctx_slot(self) -> int:
        return self._n_ctx

    def kv_tokens(self) -> int:
        return self.llama.n_tokens if self.llama.alive else 0

    def slots(self) -> list[dict[str, Any]]:
        with self._cv:
            return [{"id": 0, "n_ctx": self._n_ctx, "speculative": False, "is_processing": self._running > 0}]

    def _execute(self, job: Job, work: Callable[[Llama], Any]) -> None:
        if not self.llama.alive:
            lost = self.llama.lost
            log.warning("model %s: loading it again in a new worker process (%s)", self.alias,
                        lost if lost is not None else "its worker process is gone")
            try:
                self.llama.reload()
            except LlamaError as exc:  # a server still unreachable, or refused: this request fails by name
                log.error("model %s could not be loaded again: %s", self.alias, exc)
                job.put("error", WorkerLostError(f"the model {self.alias} is not available: loading it again "
                                                 f"failed: {exc}"))
                return
            log.info("model %s ready again (worker pid %s)", self.alias, self.llama.worker_pid)
        super()._execute(job, work)

    def _free(self) -> None:
        try:
            super()._free()
        finally:
            self.vocab.close()


__all__ = ["WorkerEngine"]

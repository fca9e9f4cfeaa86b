"""``LlamaWorker``: a :class:`~llama_cpp.Llama` whose model runs in a worker process it owns.

What ``Llama(..., rpc_servers=...)`` returns: llama.cpp's RPC client aborts the process that holds
the model when a server's connection is lost (``RPC_STATUS_ASSERT`` and the ``GGML_ABORT`` calls in
ggml-rpc.cpp), so the model lives in a child process and a lost server becomes a
:class:`~llama_cpp.WorkerLostError` naming it; ``reload()`` loads again. The class is defined beside
``Llama`` (it is one); the forwarding is :mod:`llama_cpp._placement.isolation`, the process boundary
:mod:`llama_cpp._safety.worker`.
"""

from __future__ import annotations

from ._placement.isolation import ATTRIBUTES, METHODS
from .llama import LlamaWorker

__all__ = ["ATTRIBUTES", "METHODS", "LlamaWorker"]

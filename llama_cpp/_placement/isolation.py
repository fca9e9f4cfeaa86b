"""A ``Llama`` whose model runs in a worker process: the default for models split over RPC servers.

llama.cpp's RPC client aborts the process that holds the model when a server's connection is lost
(see :mod:`llama_cpp._safety.worker`), so ``Llama(..., rpc_servers=...)`` loads in a worker process
the object owns (:class:`InWorker`, mixed into :class:`llama_cpp.LlamaWorker`, a ``Llama``):
the generation, chat, embedding, tokenizer and state calls are forwarded; a lost server raises
:class:`~llama_cpp.WorkerLostError` naming the endpoint, and :meth:`InWorker.reload` loads again
(every endpoint probed afresh: a restarted server is found, or refused with its version).
In-process handles (``model``, ``ctx``, ``native_model()``...) raise :class:`NotInProcessError`;
``Llama(..., rpc_isolation=False)`` loads in the calling process instead.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Mapping
from typing import Any, ClassVar

from .._errors import ClosedError, ModelLoadError, NotInProcessError, WorkerLostError
from .._safety.worker import WorkerProcess
from . import rpc as _rpc

#: the methods forwarded to the model in the worker (arguments and results must pickle; iterators stream)
METHODS = ("__call__", "create_completion", "create_chat_completion", "create_embedding", "embed", "tokenize",
           "detokenize", "generate", "eval", "sample", "reset", "n_ctx", "n_embd", "n_vocab", "token_bos",
           "token_eos", "token_nl", "pooling_type", "set_seed", "set_cache", "save_state", "load_state")
#: the attributes read from the model in the worker (``n_tokens`` is also written: a rewind)
ATTRIBUTES = ("metadata", "n_tokens", "input_ids", "scores", "n_batch", "eval_tokens", "eval_logits",
              "last_speculative_stats", "cache", "n_threads", "n_threads_batch", "last_n_tokens_size", "logits_all",
              "sampling_convention", "chat_options", "speculative", "draft_model", "lora_base", "lora_path",
              "lora_scale", "numa", "kv_overrides", "tensor_split", "spm_infill")
#: the calls a Llama answers while one of its streams is open
DURING_STREAM = frozenset({"tokenize", "detokenize"})
#: LlamaEmbedding's
EMBEDDING_METHODS = ("embed", "embed_multimodal", "rank", "rank_inputs", "create_embedding", "tokenize", "n_ctx")
EMBEDDING_ATTRIBUTES = ("metadata", "pooling_type", "n_embd_out", "max_input_tokens", "pack_tokens")


#: what the in-process attributes are, for their NotInProcessError
_IN_PROCESS = {"model": "llm.model (the native llama_model pointer)",
               "ctx": "llm.ctx (the native llama_context pointer)",
               "context_params": "context_params (the native llama_context_params)",
               "model_params": "model_params (the native llama_model_params)",
               "sequence": "llm.sequence (the context's generation state)"}


def _opt_out(cls: type) -> str:
    return (f"{cls.__name__}(..., rpc_isolation=False) loads the model in this process instead (then a lost RPC "
            "server aborts this interpreter, as llama.cpp's client does)")


def wanted(kwargs: Mapping[str, Any]) -> bool:
    """Whether ``Llama(**kwargs)`` runs its model in a worker: RPC servers, unless ``rpc_isolation=False``."""
    return bool(kwargs.get("rpc_servers")) and kwargs.get("rpc_isolation", True) is not False


def _forward(name: str) -> Any:
    def method(self: InWorker, *args: Any, **kwargs: Any) -> Any:
        return self._live().call(name, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def _attribute(name: str) -> property:
    def fget(self: InWorker) -> Any:
        return self._live().get(name)

    def fset(self: InWorker, value: Any) -> None:
        self._live().set(name, value)

    return property(fget, fset if name == "n_tokens" else None)


class InWorker:
    """A model object in a worker process; mixed in before the class it forwards to (``_factory``, which
    the worker builds with ``rpc_isolation=False``): its ``_methods`` are called there, its
    ``_attributes`` read there (:data:`METHODS`, :data:`ATTRIBUTES` for ``Llama``)."""

    _factory: ClassVar[Any]
    _methods: ClassVar[tuple[str, ...]] = METHODS
    _attributes: ClassVar[tuple[str, ...]] = ATTRIBUTES
    _worker: WorkerProcess | None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        base = cls._factory
        for name in cls._methods:  # the in-process method's signature and docstring, for help()
            if name not in cls.__dict__:
                setattr(cls, name, functools.wraps(getattr(base, name))(_forward(name)))
        for name in cls._attributes:
            if name not in cls.__dict__:
                setattr(cls, name, _attribute(name))

    def __init__(self, model_path: str | os.PathLike[str], **kwargs: Any) -> None:
        isolation = kwargs.pop("rpc_isolation", True)
        if isolation is not True:
            raise TypeError(f"rpc_isolation must be True for {type(self).__name__} (it always runs the model in a "
                            f"worker process), got {isolation!r}; {_opt_out(self._factory)}")
        self._worker = None
        self.model_path = os.fspath(model_path)
        self.endpoints = _rpc.parse_servers(kwargs["rpc_servers"]) if kwargs.get("rpc_servers") else []
        for key, value in kwargs.items():
            try:
                pickle.dumps(value)
            except Exception as exc:  # noqa: BLE001
                raise TypeError(f"{key}={value!r} cannot be sent to the worker process that holds this model "
                                f"({exc}); pass a value that pickles (a module-level function, not a lambda), or "
                                f"{_opt_out(self._factory)}") from None
        self._init_args: dict[str, Any] = {"model_path": self.model_path, **kwargs}
        # read here, never written to the worker: setting them changes only this object
        self.verbose = kwargs.get("verbose", True)
        self.chat_format = kwargs.get("chat_format")
        self.chat_handler = kwargs.get("chat_handler")
        self._start()

    # -- the worker ---------------------------------------------------------------------------------
    def _start(self) -> None:
        for ep in self.endpoints:  # before the worker starts: unreachable or refused, by name, at once
            _rpc.probe(ep)
        kwargs = {k: v for k, v in self._init_args.items() if k != "model_path"}
        self._worker = WorkerProcess(self._factory, (self.model_path,), {**kwargs, "rpc_isolation": False},
                                     describe=self._describe_death, advice=f"; {_opt_out(self._factory)}",
                                     during_stream=DURING_STREAM)

    def _describe_death(self, how: str) -> str:
        gone = []  # what the probe says of each endpoint that no longer answers as it should
        for ep in self.endpoints:
            try:
                _rpc.probe(ep, timeout=2.0)
            except ModelLoadError as exc:
                gone.append(str(exc))
        if gone:
            why = (f": {'; '.join(gone)}. llama.cpp's RPC client aborts the process on a lost connection; start "
                   "the server again and call reload()")
        elif self.endpoints:
            why = (f"; every RPC server ({', '.join(self.endpoints)}) answers now: one may have restarted, which "
                   "breaks the worker's connection (or the worker died of something else: see how); call reload()")
        else:
            why = "; call reload() to load the model again"
        return f"the worker process of {self.model_path} died ({how}){why}"

    def _live(self) -> WorkerProcess:
        if self._worker is None:
            raise ClosedError(f"this {type(self).__name__} is closed; create a new one or call reload()")
        return self._worker

    def reload(self) -> None:
        """Load the model again in a new worker process (after a :class:`WorkerLostError`, say); every
        RPC server is probed again first. The evaluated tokens and the KV cache start empty."""
        self.close()
        self._start()

    def close(self) -> None:
        """Stop the worker process (idempotent; waits for a running call)."""
        worker, self._worker = getattr(self, "_worker", None), None
        if worker is not None:
            worker.close()

    @property
    def alive(self) -> bool:
        """Whether the worker process answers calls (False once it died or was closed: see :attr:`lost`)."""
        return self._worker is not None and self._worker.alive

    @property
    def lost(self) -> WorkerLostError | None:
        """How the worker process died (what its calls raise until :meth:`reload`), or None."""
        return None if self._worker is None else self._worker.lost

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id (None once closed)."""
        return None if self._worker is None else self._worker.pid

    # -- what only exists in the calling process ----------------------------------------------------
    def _not_here(self, what: str) -> NotInProcessError:
        return NotInProcessError(f"{what} is not available: this {type(self).__name__} runs its model in a worker "
                                 f"process (rpc_servers= isolates it, so a lost RPC server cannot abort this "
                                 f"interpreter); {_opt_out(self._factory)}")

    def native_model(self) -> Any:
        raise self._not_here("native_model()")

    def native_context(self) -> Any:
        raise self._not_here("native_context()")

    def tokenizer(self) -> Any:
        raise self._not_here("tokenizer() (the in-process tokenizer object; tokenize()/detokenize() work)")

    def chat_formatter(self) -> Any:
        raise self._not_here("chat_formatter() (the in-process template formatter; create_chat_completion() works)")

    def make_sampler(self, **kw: Any) -> Any:
        raise self._not_here("make_sampler()")

    @property
    def model(self) -> Any:
        raise self._not_here(_IN_PROCESS["model"])

    @property
    def ctx(self) -> Any:
        raise self._not_here(_IN_PROCESS["ctx"])

    @property
    def context_params(self) -> Any:
        raise self._not_here(_IN_PROCESS["context_params"])

    @property
    def model_params(self) -> Any:
        raise self._not_here(_IN_PROCESS["model_params"])

    def __getattr__(self, name: str) -> Any:
        # reached for what neither this class nor the base defines or sets, and after a property raised
        # an AttributeError (the NotInProcessError of model, ctx... above): worded here, once
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._not_here(_IN_PROCESS.get(name, repr(name)))

    # -- pickling, repr -----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The constructor's arguments: unpickling loads the model again in a new worker process."""
        return dict(self._init_args)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __repr__(self) -> str:
        w = self._worker
        if w is None:
            state = "closed"
        elif w.lost is not None:
            state = "worker lost: call reload()"
        else:
            state = f"worker pid {w.pid}"
        where = f", rpc_servers={','.join(self.endpoints)!r}" if self.endpoints else ""
        return f"{type(self).__name__}({self.model_path!r}{where}, {state})"


"""A :class:`~llama_cpp.Llama` in a worker process: the boundary for models split over RPC servers.

llama.cpp's RPC client aborts the whole process when a server's connection is lost mid-computation
(``RPC_STATUS_ASSERT`` and the ``GGML_ABORT`` calls in ggml-rpc.cpp). :class:`LlamaWorker` runs the
model in a child process (``multiprocessing`` spawn) and forwards calls to it, streams one item per
request; when the child dies the call raises :class:`~llama_cpp.WorkerLostError` naming how it died
and which RPC servers are unreachable now, and the caller can create a new worker to reload. This is
the same boundary as :mod:`llama_cpp._safety.isolated_load` draws around untrusted model files (a
child whose death by a signal becomes an exception naming it), kept alive for the model's lifetime.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ._errors import BusyError, ClosedError, LlamaError, WorkerLostError

#: the Llama methods a worker forwards (results and arguments must pickle; iterators stream)
METHODS = frozenset({
    "__call__", "create_completion", "create_chat_completion", "create_embedding", "embed", "tokenize",
    "detokenize", "generate", "reset", "n_ctx", "n_vocab", "token_bos", "token_eos", "metadata",
})
_STARTUP_TIMEOUT = 600.0


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
        return LlamaError(f"{type(exc).__name__}: {exc}")


def _serve(conn: Any, model_path: str, kwargs: dict[str, Any]) -> None:
    """The child: load, then answer ("call", name, args, kwargs); an iterator result is sent one item
    per ("next",) request, ("stop",) closes it."""
    from .llama import Llama

    try:
        llm = Llama(model_path, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", _portable(exc)))
        return
    conn.send(("ready", None))
    try:
        while True:
            try:
                op, name, args, kw = conn.recv()
            except EOFError:
                return
            if op == "close":
                return
            try:
                attr = getattr(llm, name)
                res = attr(*args, **kw) if callable(attr) else attr
            except BaseException as exc:  # noqa: BLE001
                conn.send(("error", _portable(exc)))
                continue
            if not isinstance(res, Iterator):
                conn.send(("result", res))
                continue
            conn.send(("stream", None))
            while True:
                if conn.recv()[0] != "next":
                    res.close()  # type: ignore[attr-defined]
                    conn.send(("end", None))
                    break
                try:
                    conn.send(("item", next(res)))
                except StopIteration:
                    conn.send(("end", None))
                    break
                except BaseException as exc:  # noqa: BLE001
                    conn.send(("error", _portable(exc)))
                    break
    finally:
        llm.close()


class LlamaWorker:
    """``Llama(model_path, **kwargs)`` in a worker process; the calls in :data:`METHODS` are forwarded.

    A dead worker (an RPC server lost mid-generation aborts llama.cpp's client) raises
    :class:`~llama_cpp.WorkerLostError` naming the unreachable endpoints, within the time the
    operating system takes to report the closed connection; every later call raises it too, and a
    new ``LlamaWorker`` reloads. One call or stream at a time (:class:`BusyError` otherwise).
    """

    def __init__(self, model_path: str | os.PathLike[str], **kwargs: Any) -> None:
        from ._placement.rpc import parse_servers

        servers = kwargs.get("rpc_servers")
        self.endpoints = parse_servers(servers) if servers else []
        self.model_path = os.fspath(model_path)
        self._lock = threading.Lock()
        self._lost: WorkerLostError | None = None
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.model_path, kwargs), daemon=True,
                                 name="llama-worker")
        self._proc.start()
        child.close()
        if not self._conn.poll(_STARTUP_TIMEOUT):
            self._proc.kill()
            raise WorkerLostError(f"the worker loading {self.model_path} did not answer in {_STARTUP_TIMEOUT:g} s")
        kind, value = self._recv()
        if kind == "error":
            self._proc.join(10)
            raise value

    # -- transport ----------------------------------------------------------------------------
    def _died(self) -> WorkerLostError:
        from ._errors import ModelLoadError
        from ._placement.rpc import probe

        self._proc.join(10)
        code = self._proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit status {code}"
        gone = []
        for ep in self.endpoints:
            try:
                probe(ep, timeout=2.0)
            except ModelLoadError:
                gone.append(ep)
        where = (f": RPC server {', '.join(gone)} is unreachable (llama.cpp's RPC client aborts on a lost "
                 "connection)") if gone else ""
        self._lost = WorkerLostError(f"the worker process of {self.model_path} died ({how}){where}; create a new "
                                     "LlamaWorker to reload the model")
        return self._lost

    def _recv(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            raise self._died() from None

    def _send(self, msg: tuple[Any, ...]) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, OSError):
            raise self._died() from None

    def _check(self) -> None:
        if self._lost is not None:
            raise self._lost
        if not self._proc.is_alive() and self._conn.closed:
            raise ClosedError("this LlamaWorker is closed; create a new one")

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._check()
        if not self._lock.acquire(blocking=False):
            raise BusyError("this LlamaWorker is serving another call or stream")
        try:
            self._send(("call", name, args, kwargs))
            kind, value = self._recv()
        except BaseException:
            self._lock.release()
            raise
        if kind != "stream":
            self._lock.release()
            if kind == "error":
                raise value
            return value
        return self._stream()

    def _stream(self) -> Iterator[Any]:
        done = False
        try:
            while True:
                self._send(("next",))
                kind, value = self._recv()
                if kind == "end":
                    done = True
                    return
                if kind == "error":
                    done = True
                    raise value
                yield value
        finally:
            try:
                if not done and self._lost is None:
                    self._send(("stop",))
                    while self._recv()[0] not in ("end", "error"):
                        pass
            finally:
                self._lock.release()

    # -- the forwarded API --------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in METHODS:
            return lambda *args, **kwargs: self._call(name, *args, **kwargs)
        raise AttributeError(f"LlamaWorker forwards {', '.join(sorted(METHODS))}; not {name!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("__call__", *args, **kwargs)

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self._proc.is_alive():
            try:
                self._conn.send(("close", None, (), {}))
            except OSError:
                pass
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        self._conn.close()

    def __enter__(self) -> LlamaWorker:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

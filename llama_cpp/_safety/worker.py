"""An object in a worker process: the boundary around native code that may abort the process.

llama.cpp's RPC client aborts the whole process when a server's connection is lost mid-computation
(``RPC_STATUS_ASSERT`` and the ``GGML_ABORT`` calls in ggml-rpc.cpp). :class:`WorkerProcess` builds
``factory(*args, **kwargs)`` in a child interpreter (a fresh ``python``) and forwards calls,
attribute reads and writes to it over a pipe, an iterator result one item per request; the child's
log records come back on the same pipe and are handled by the parent's loggers, in order. When the
child dies the call raises :class:`~llama_cpp.WorkerLostError` naming how it died (``describe``
adds what the owner knows, such as which RPC servers are unreachable now); every later call raises
it too. This is the same boundary :mod:`.isolated_load` draws around an untrusted model file (a
child whose death by a signal becomes an exception naming it), kept alive for the object's lifetime.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import logging.handlers
import multiprocessing.spawn
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from .._errors import BusyError, ClosedError, LlamaError, WorkerLostError

#: how long the child may take to build the object (a large model loading over the network)
STARTUP_TIMEOUT = 600.0
#: the loggers whose levels the child copies from the parent (llama.cpp's log is formatted only when enabled)
LOGGERS = ("llama_cpp", "llama_cpp.native", "llama_cpp.native.mtmd")


def exit_reason(code: int | None) -> str:
    """A child's exit status in words: 'killed by SIGABRT', 'exit status 1'."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
        return LlamaError(f"{type(exc).__name__}: {exc}")


class _PipeLogHandler(logging.handlers.QueueHandler):
    """The child's log records, sent to the parent on the call pipe (prepared as QueueHandler does)."""

    def __init__(self, send: Callable[[tuple[str, Any]], None]) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self._send = send

    def enqueue(self, record: logging.LogRecord) -> None:
        self._send(("log", record))


def _answer(obj: Any, msg: tuple[Any, ...], send: Callable[[tuple[str, Any]], None]) -> Any:
    """Run one ("call"|"get"|"set", name, args, kwargs) request on ``obj`` and send its "result" or
    "error"; an iterator result is returned unsent (the caller streams it)."""
    op, name, a, kw = msg
    try:
        if op == "set":
            setattr(obj, name, a[0])
            res = None
        else:
            attr = getattr(obj, name)
            _interruptible.set()
            try:
                res = attr(*a, **kw) if op == "call" else attr
            finally:
                _interruptible.clear()
    except BaseException as exc:  # noqa: BLE001
        send(("error", _portable(exc)))
        return None
    if isinstance(res, Iterator):
        return res
    try:
        send(("result", res))
    except Exception as exc:  # noqa: BLE001 - a result that does not pickle
        send(("error", LlamaError(f"{name} returned a {type(res).__name__}, which cannot leave the worker "
                                  f"process: {exc}")))
    return None


def _serve(conn: Any, factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           levels: dict[str, int]) -> None:
    """The child: build the object, then answer ("call"|"get"|"set", name, args, kwargs); an
    iterator result is sent one item per ("next",) request, until its "end" or "error"; ("stop",)
    closes it and is answered by "stopped" (also when the stream had ended already)."""
    send_lock = threading.Lock()

    def send(msg: tuple[str, Any]) -> None:
        with send_lock:  # llama.cpp may log from its own threads
            conn.send(msg)

    root = logging.getLogger()
    root.handlers[:] = [_PipeLogHandler(send)]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        obj = factory(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        send(("error", _portable(exc)))
        return
    send(("ready", None))
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "close":
                return
            if msg[0] in ("next", "stop"):  # for a stream that already ended: the parent reads up to "stopped"
                send(("stopped", None))
                continue
            res = _answer(obj, msg, send)
            if not isinstance(res, Iterator):
                continue
            send(("stream", None))
            while True:
                msg = conn.recv()
                if msg[0] in ("call", "get"):  # a call allowed while a stream is open (tokenize)
                    extra = _answer(obj, msg, send)
                    if isinstance(extra, Iterator):
                        extra.close()  # type: ignore[attr-defined]
                        send(("error", BusyError("a stream of this model is open; finish or close it first")))
                    continue
                if msg[0] != "next":
                    res.close()  # type: ignore[attr-defined]
                    send(("stopped", None))
                    break
                try:
                    _interruptible.set()
                    try:
                        item = next(res)
                    finally:
                        _interruptible.clear()
                    send(("item", item))
                except StopIteration:
                    send(("end", None))
                    break
                except BaseException as exc:  # noqa: BLE001
                    send(("error", _portable(exc)))
                    break
    finally:
        close = getattr(obj, "close", None)
        if callable(close):
            close()


def child_interpreter() -> tuple[str, dict[str, str]]:
    """The interpreter the worker runs in and its environment.

    In a virtual environment on Windows ``python.exe`` is a launcher that starts the base interpreter
    as its own child, so the process id we would share the socket with (:func:`_start_child`) would
    be the launcher's: as ``multiprocessing`` does (bpo-35797), the base interpreter is started
    directly, told the venv's ``python.exe`` (``__PYVENV_LAUNCHER__``) so that it sets the venv up."""
    exe = multiprocessing.spawn.get_executable()
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # an abort reports at once (no debugger attached for a trace)
    base = getattr(sys, "_base_executable", None)
    if sys.platform == "win32" and base and os.path.normcase(exe) == os.path.normcase(sys.executable) \
            and os.path.normcase(base) != os.path.normcase(sys.executable):
        env["__PYVENV_LAUNCHER__"] = sys.executable
        exe = base
    return exe, env


def _start_child() -> tuple[Connection, subprocess.Popen]:
    """A fresh interpreter (``python -c``, not ``multiprocessing``: that would run the caller's
    ``__main__`` again in the child, which a script without a main guard cannot take) joined to this
    one by a socket pair; it takes this interpreter's ``sys.path``, then the object to build."""
    ours, theirs = socket.socketpair()
    exe, env = child_interpreter()
    with theirs:
        if sys.platform == "win32":  # no fd inheritance: the socket goes over stdin (WSADuplicateSocket)
            proc = subprocess.Popen([exe, "-c", _BOOTSTRAP, "stdin"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env)
            assert proc.stdin is not None
            with proc.stdin:
                proc.stdin.write(theirs.share(proc.pid))
        else:
            proc = subprocess.Popen([exe, "-c", _BOOTSTRAP, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                    stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    conn = Connection(ours.detach())
    try:
        conn.send(list(sys.path))
    except OSError:
        pass
    return conn, proc


_BOOTSTRAP = ("import socket, sys\n"
              "from multiprocessing.connection import Connection\n"
              "fd = socket.fromshare(sys.stdin.buffer.read()).detach() if sys.argv[1] == 'stdin' else int(sys.argv[1])\n"
              "conn = Connection(fd)\n"
              "sys.path[:] = conn.recv()\n"
              "from llama_cpp._safety.worker import child_main\n"
              "child_main(conn)\n")


# set while the child runs a forwarded call: the parent's interruption (INTERRUPT) stops it there only
_interruptible = threading.Event()
#: the signal the parent sends when its caller is interrupted (Ctrl-C) during a call (POSIX)
INTERRUPT = getattr(signal, "SIGUSR1", None)


def _on_interrupt(signum: int, frame: Any) -> None:
    if _interruptible.is_set():
        raise KeyboardInterrupt


def child_main(conn: Connection) -> None:
    """The worker interpreter's entry (see :data:`_BOOTSTRAP`): build the object, then serve it.

    A terminal's Ctrl-C (SIGINT to the process group) is the parent's to handle: the child ignores it,
    and stops the running call when the parent forwards it (:data:`INTERRUPT`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if INTERRUPT is not None:
        signal.signal(INTERRUPT, _on_interrupt)
    try:
        factory, args, kwargs, levels = conn.recv()
    except EOFError:
        return
    _serve(conn, factory, args, kwargs, levels)


class _StderrTail(threading.Thread):
    """Copies the child's stderr to ours and keeps its last lines: the text of a native abort
    (``GGML_ABORT`` prints file, line and reason before SIGABRT) for the error that reports it."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True, name="llama-worker-stderr")
        self._stream = stream
        self.lines: collections.deque[str] = collections.deque(maxlen=20)
        self.start()

    def run(self) -> None:
        for raw in iter(self._stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.lines.append(line.rstrip())
            try:
                sys.stderr.write(line)
            except (OSError, ValueError):
                pass
        self._stream.close()

    def last_error(self) -> str:
        """The native abort's reason, as ggml prints it ('file.cpp:569: reason'), or ''."""
        self.join(2)
        for line in reversed(self.lines):
            if re.search(r"\.(c|cc|cpp|h):\d+: ", line):
                return re.sub(r"^.*?([\w.-]+\.(?:c|cc|cpp|h):\d+: )", r"\1", line)
        return ""


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    _wait(proc, 5)


class WorkerProcess:
    """``factory(*args, **kwargs)`` in a child process; :meth:`call`, :meth:`get` and :meth:`set`
    reach it. One call or stream at a time: a call waits for a running call, and raises
    :class:`BusyError` while a stream is open (as :class:`~llama_cpp.Llama`'s own calls do), except
    the names in ``during_stream``, answered between two of its items.

    ``describe(how)`` words the :class:`WorkerLostError` of a dead child (``how``: its exit status in
    words); its message is the error's. ``advice`` ends the message of an argument that cannot be sent.
    """

    def __init__(self, factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
                 describe: Callable[[str], str], advice: str = "", during_stream: frozenset[str] = frozenset()) -> None:
        self._describe = describe
        self._advice = advice
        self._during_stream = during_stream
        self._lock = threading.Lock()  # one call or stream at a time
        self._io = threading.Lock()  # one request and its reply at a time (a stream step, a call during it)
        self._streaming = False
        self._closed = False
        self._unanswered = False
        self._interrupted = False  # a Ctrl-C deferred while a message was read or written
        self.lost: WorkerLostError | None = None
        levels = {n: logging.getLogger(n).getEffectiveLevel() for n in LOGGERS}
        self._conn, self._proc = _start_child()
        self._stderr = _StderrTail(self._proc.stderr)
        self._finalizer = weakref.finalize(self, _reap, self._proc)
        try:
            self._conn.send((factory, args, kwargs, levels))
        except OSError:
            pass  # the child is gone already: the first receive says how
        except Exception as exc:  # noqa: BLE001 - an argument that does not pickle
            _reap(self._proc)
            self._conn.close()
            self._closed = True
            raise TypeError(f"the arguments cannot be sent to the worker process: {exc}") from None
        try:
            kind, value = self._recv(timeout=STARTUP_TIMEOUT)
        except TimeoutError:
            _reap(self._proc)
            self._conn.close()
            self._closed = True
            raise WorkerLostError(describe(f"did not finish loading in {STARTUP_TIMEOUT:g} s")) from None
        if kind == "error":
            _wait(self._proc, 10)
            self._conn.close()
            self._closed = True
            raise value

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return not self._closed and self.lost is None and self._proc.poll() is None

    # -- transport ------------------------------------------------------------------------------
    def _died(self) -> LlamaError:
        if self._closed:  # close() from another thread ended the child under an open stream
            return ClosedError("this model's worker process was closed during the call")
        _wait(self._proc, 10)
        how, native = exit_reason(self._proc.returncode), self._stderr.last_error()
        self.lost = WorkerLostError(self._describe(f"{how}: {native}" if native else how))
        self._conn.close()
        return self.lost

    def _recv(self, timeout: float | None = None) -> tuple[str, Any]:
        """The next message that is not a log record (those are handled by the parent's loggers)."""
        while True:
            try:
                # wait in poll, which an interruption leaves the stream intact in, then read a whole message
                if not self._conn.poll(timeout):
                    raise TimeoutError
                with self._whole():
                    kind, value = self._conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if kind != "log":
                return kind, value
            logger = logging.getLogger(value.name)
            if logger.isEnabledFor(value.levelno):
                logger.handle(value)

    @contextlib.contextmanager
    def _whole(self) -> Iterator[None]:
        """Read or write one whole message: a Ctrl-C meanwhile would cut it and desynchronize the pipe,
        so it is deferred (:meth:`_raise_deferred` raises it at the next safe point)."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return
        previous = signal.signal(signal.SIGINT, self._defer)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _defer(self, signum: int, frame: Any) -> None:
        self._interrupted = True

    def _raise_deferred(self) -> None:
        if self._interrupted:
            self._interrupted = False
            raise KeyboardInterrupt

    def _send(self, msg: tuple[Any, ...]) -> None:
        try:
            with self._whole():
                self._conn.send(msg)
        except (BrokenPipeError, ConnectionError, EOFError) as exc:
            if isinstance(exc, OSError) or self._proc.poll() is not None:
                raise self._died() from None
            raise

    def _check(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self._closed:
            raise ClosedError("this model's worker process is closed; create a new one")

    def _exchange(self, op: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        """Send one request and read its reply, as one step under ``_io``."""
        try:
            data = pickle.dumps((op, name, args, kwargs))
        except Exception as exc:  # noqa: BLE001 - a callable or handle that cannot leave this process
            raise TypeError(f"{name}: an argument cannot be sent to the worker process ({exc}); the model runs "
                            "in a worker process, which only takes arguments that pickle (module-level "
                            f"functions and classes, not lambdas or closures){self._advice}") from None
        with self._io:
            self._check()
            self._drain()
            try:
                with self._whole():
                    self._conn.send_bytes(data)
            except OSError:
                raise self._died() from None
            try:
                reply = self._recv()
            except (WorkerLostError, ClosedError):
                raise
            except BaseException:
                # interrupted (Ctrl-C): the child stops the call too, and its reply is read before the next request
                self._unanswered = True
                if INTERRUPT is not None and self._proc.poll() is None:
                    os.kill(self._proc.pid, INTERRUPT)
                raise
            self._raise_deferred()  # a Ctrl-C during the reply's reading: the reply is read, the call done
            return reply

    def _request(self, op: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._check()
        if self._streaming:
            if name not in self._during_stream:
                raise BusyError("a stream of this model is open; finish or close it first")
            kind, value = self._exchange(op, name, args, kwargs)  # answered between two of its items
            if kind == "error":
                raise value
            return value
        self._lock.acquire()
        try:
            self._check()
            kind, value = self._exchange(op, name, args, kwargs)
        except BaseException:
            self._lock.release()
            raise
        if kind != "stream":
            self._lock.release()
            if kind == "error":
                raise value
            return value
        self._streaming = True
        return self._stream()

    def _drain(self) -> None:
        """Read the reply of a request whose caller was interrupted (an open stream is stopped)."""
        if not self._unanswered:
            return
        self._unanswered = False
        kind, _value = self._recv()
        if kind == "stream":
            self._stop_stream()

    def _stop_stream(self) -> None:
        """Close the child's open stream: one "stop", answered by one "stopped" (items, its end or its
        error may come before it)."""
        self._send(("stop",))
        while self._recv()[0] != "stopped":
            pass

    def _stream(self) -> Iterator[Any]:
        done = False
        try:
            while True:
                with self._io:
                    self._drain()
                    self._send(("next",))
                    kind, value = self._recv()
                self._raise_deferred()
                if kind == "end":
                    done = True
                    return
                if kind == "error":
                    done = True
                    raise value
                yield value
        finally:
            try:
                if not done and self.lost is None and not self._closed:
                    if INTERRUPT is not None and self._proc.poll() is None:
                        os.kill(self._proc.pid, INTERRUPT)  # a token being computed is not waited for
                    with self._io:
                        self._drain()
                        self._stop_stream()
                    self._raise_deferred()
            finally:
                self._streaming = False
                self._lock.release()
                if self._closed:
                    self._conn.close()

    # -- the forwarded object ---------------------------------------------------------------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``obj.name(*args, **kwargs)`` in the child; an iterator result streams."""
        return self._request("call", name, args, kwargs)

    def get(self, name: str) -> Any:
        """``obj.name`` in the child."""
        return self._request("get", name, (), {})

    def set(self, name: str, value: Any) -> None:
        """``obj.name = value`` in the child."""
        self._request("set", name, (value,), {})

    def close(self) -> None:
        """Stop the child (idempotent; waits for a running call)."""
        if self._closed:
            return
        if self._streaming:  # an open stream holds the lock: end the child under it
            self._closed = True
            _reap(self._proc)
            return
        with self._lock:
            self._closed = True
            if self._proc.poll() is None and self.lost is None:
                try:
                    self._conn.send(("close", None, (), {}))
                    while self._conn.poll(10):  # the child's last log records, then EOF
                        kind, value = self._conn.recv()
                        if kind == "log":
                            logging.getLogger(value.name).handle(value)
                except (EOFError, OSError):
                    pass
                _wait(self._proc, 10)
            _reap(self._proc)
            self._conn.close()

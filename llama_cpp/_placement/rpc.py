"""llama.cpp's RPC backend: remote devices for ``rpc_servers=`` and ggml's own RPC server.

The servers' devices are not put into ggml's registry (llama.cpp's ``--rpc`` does that): its default
device list is every registered device, so a server added for one model would serve every later
model of the process. A model names its servers' devices explicitly instead (``model_params.devices``).

llama.cpp's RPC client aborts the process when an endpoint cannot be reached or speaks another
protocol version (``GGML_ABORT`` in ggml-rpc.cpp), so every endpoint is probed here first: a TCP
connection with a timeout and the protocol's HELLO exchange, which tells the server's version. An
endpoint already registered in this process is probed again at each load (a restarted server may be
of another version), briefly: ggml keeps one connection per endpoint while a model uses it, and its
server serves one client at a time, so a silent server is taken to be busy with this process.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from .. import ggml_cpp as G
from .._errors import BackendUnavailableError, ModelLoadError
from .._native import loader as _loader
from . import devices as _devices

log = logging.getLogger(__name__)

#: RPC_PROTO_*_VERSION of the pinned ggml-rpc.h: a server with another major version, or a newer
#: minor one, is refused by llama.cpp's client (which then aborts)
PROTO_VERSION = (7, 0, 0)
_CMD_HELLO = 14  # RPC_CMD_HELLO ("must be always 14")
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: rpc_msg_hello_req is conn_caps[24]
_HELLO_RSP = struct.Struct("<BBBB24s")  # rpc_msg_hello_rsp: major, minor, patch, padding, conn_caps
DEFAULT_TIMEOUT = 5.0
#: a registered endpoint's probe: a server busy with this process's own connection never answers it
REPROBE_TIMEOUT = 0.5

UNAUTHENTICATED = ("the RPC server is unauthenticated and unencrypted: anyone who can reach its port can run "
                   "computations on this machine's devices and read what they hold; never expose it to an open "
                   "network (llama.cpp's own warning)")

_lock = threading.Lock()
_registered: dict[str, tuple[str, ...]] = {}  # endpoint -> the names of its devices


@dataclass(frozen=True)
class ServerVersion:
    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def parse_servers(value: str | Sequence[str]) -> list[str]:
    """``"host:port,host:port"`` (upstream's ``rpc_servers``) or a list of endpoints, checked."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise TypeError(f"rpc_servers entries must be 'host:port' strings, not {type(raw).__name__}")
        ep = raw.strip()
        host, sep, port = ep.partition(":")  # ggml's parse_endpoint splits at the first ':'
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"rpc_servers: {raw!r} is not 'host:port' (e.g. '127.0.0.1:50052')")
        if ep not in out:
            out.append(ep)
    if not out:
        raise ValueError("rpc_servers is empty: give 'host:port[,host:port...]'")
    return out


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the connection closed during the handshake")
        buf += chunk
    return buf


def _read_late_answer(sock: socket.socket) -> None:
    """Read a HELLO answer whenever it comes (the server serves its current client first), then close."""
    with sock:
        sock.settimeout(None)
        try:
            (size,) = struct.unpack("<Q", _recv_exactly(sock, 8))
            _recv_exactly(sock, min(size, _HELLO_RSP.size))
        except (OSError, struct.error):
            pass


def probe(endpoint: str, timeout: float = DEFAULT_TIMEOUT, *, silent_ok: bool = False) -> ServerVersion | None:
    """Connect to ``endpoint`` and exchange HELLO; :class:`ModelLoadError` naming it when it is
    unreachable, silent, not an RPC server, or of a protocol version llama.cpp's client refuses.
    ``silent_ok``: a server that accepts but does not answer returns None (it is serving a client,
    which may be this process's own connection)."""
    host, _, port = endpoint.partition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        raise ModelLoadError(f"RPC server {endpoint} is unreachable: {exc} (is `python -m llama_cpp rpc-server "
                             f"--host {host} --port {port}` or llama.cpp's rpc-server running there?)") from None
    try:
        sock.settimeout(timeout)
        sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS) + bytes(_CONN_CAPS))
        (size,) = struct.unpack("<Q", _recv_exactly(sock, 8))
        if size != _HELLO_RSP.size:
            sock.close()
            raise ModelLoadError(f"RPC server {endpoint} answered HELLO with {size} bytes, not the "
                                 f"{_HELLO_RSP.size} of RPC protocol {PROTO_VERSION[0]}.x: not a ggml RPC "
                                 "server of this protocol generation")
        major, minor, patch, _pad, _caps = _HELLO_RSP.unpack(_recv_exactly(sock, _HELLO_RSP.size))
        sock.close()
    except TimeoutError:
        # the server answers once it is free: the answer is read then, so that its send does not hit a
        # closed socket (llama.cpp's rpc-server does not ignore SIGPIPE)
        threading.Thread(target=_read_late_answer, args=(sock,), daemon=True, name=f"rpc-probe {endpoint}").start()
        if silent_ok:
            return None
        raise ModelLoadError(f"RPC server {endpoint} accepted the connection but did not answer HELLO within "
                             f"{timeout:g} s (ggml's RPC server serves one client at a time: is another process "
                             "using it?)") from None
    except OSError as exc:
        sock.close()
        raise ModelLoadError(f"RPC server {endpoint} broke off the handshake: {exc} (not a ggml RPC server, or "
                             "one of another protocol version)") from None
    version = ServerVersion(major, minor, patch)
    if major != PROTO_VERSION[0] or minor > PROTO_VERSION[1]:
        ours = ".".join(map(str, PROTO_VERSION))
        raise ModelLoadError(f"RPC server {endpoint} speaks RPC protocol {version}; this build's client speaks "
                             f"{ours} (a server of major version {PROTO_VERSION[0]} and minor <= {PROTO_VERSION[1]} "
                             "is needed): run an rpc-server built from the same llama.cpp as this package")
    return version


def _rpc_reg() -> int:
    _loader.load()
    reg = G.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise BackendUnavailableError("this build has no RPC backend (libggml-rpc, llama.cpp's GGML_RPC): "
                                      "install a wheel built with it to use rpc_servers or rpc-server")
    return int(reg)


def _proc(reg: int, name: str, proto: type) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    addr = G.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not addr:
        raise BackendUnavailableError(f"the RPC backend does not provide {name}: a libggml-rpc of another version")
    return proto(addr)


_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_void_p))


def registered() -> dict[str, tuple[str, ...]]:
    """The endpoints added in this process and the names of their devices."""
    with _lock:
        return dict(_registered)


def add_servers(endpoints: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Probe each endpoint, then add its devices (``ggml_backend_rpc_add_server``, as llama.cpp's
    ``--rpc``, but outside ggml's registry); returns the names of every remote device of ``endpoints``,
    in their order. An endpoint added before is probed again (it may have restarted, or be another
    server now), briefly: one that does not answer is taken to be serving this process's connection."""
    reg = _rpc_reg()
    add = _proc(reg, "ggml_backend_rpc_add_server", _ADD_SERVER)
    names: list[str] = []
    with _lock:
        for ep in endpoints:
            if ep in _registered:
                probe(ep, min(timeout, REPROBE_TIMEOUT), silent_ok=True)
            else:
                probe(ep, timeout)
                server_reg = add(ep.encode())
                if not server_reg:
                    raise ModelLoadError(f"RPC server {ep} offers no devices")
                # not ggml_backend_register (llama.cpp's --rpc does): models name these devices explicitly
                n = int(G.ggml_backend_reg_dev_count(server_reg))
                _devices.add_remote([int(G.ggml_backend_reg_dev_get(server_reg, i)) for i in range(n)])
                devices = _loader.devices_of(server_reg)
                _loader.add_backend(_loader.loaded_status("rpc", f"RPC[{ep}]", None, devices))
                _registered[ep] = tuple(d.name for d in devices)
                log.info("RPC server %s: %s", ep, ", ".join(f"{d.name} ({d.memory_total // 2**20} MiB)"
                                                             for d in devices))
            names.extend(_registered[ep])
    return names


def server_devices(names: Sequence[str] | None) -> list[int]:
    """The device handles an RPC server exposes: ``names`` (any device, the CPU included), else every
    accelerator, else the CPU (as llama.cpp's rpc-server chooses)."""
    devs = _devices.local_devices()
    if names:
        by_name = {d.name: d for d in devs}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"unknown device {', '.join(map(repr, unknown))}; this machine has: "
                             f"{', '.join(by_name) or 'none'}")
        return [by_name[n].handle for n in names]
    accel = [d.handle for d in devs if not d.is_cpu]
    return accel or [d.handle for d in devs if d.is_cpu][:1]


def start_server(host: str, port: int, *, devices: Sequence[str] | None = None, cache_dir: str | None = None,
                 n_threads: int = 1) -> None:
    """Serve this machine's devices on ``host:port`` with ggml's ``ggml_backend_rpc_start_server``;
    returns only if the server cannot start (it logs why)."""
    reg = _rpc_reg()
    start = _proc(reg, "ggml_backend_rpc_start_server", _START_SERVER)
    handles = server_devices(devices)
    arr = (ctypes.c_void_p * len(handles))(*handles)
    log.warning("%s", UNAUTHENTICATED)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("rpc-server binds %s, not 127.0.0.1: every machine that can reach %s:%d controls it", host,
                    host, port)
    start(f"{host}:{port}".encode(), None if cache_dir is None else cache_dir.encode(), max(1, int(n_threads)),
          len(handles), arr)

"""The devices and buffer types ggml has registered, by the names llama.cpp's options take."""

from __future__ import annotations

from dataclasses import dataclass

from .. import ggml_cpp as G
from .._native import loader as _loader

#: ``enum ggml_backend_dev_type`` values that llama.cpp's ``-dev`` refuses (the CPU is always used)
_CPU_TYPES = (G.GGML_BACKEND_DEVICE_TYPE_CPU,)


@dataclass(frozen=True)
class Device:
    """A registered device: its handle, name, description and type (``ggml_backend_dev_type``)."""

    handle: int
    name: str
    description: str
    type: int

    @property
    def is_cpu(self) -> bool:
        return self.type in _CPU_TYPES


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", "replace")


# Remote (RPC) devices are kept here, not in ggml's process-wide registry: llama.cpp's default device
# list is every registered device, so a registered server would serve every later model of the process.
_remote: list[Device] = []


def describe(handle: int) -> Device:
    return Device(int(handle), _text(G.ggml_backend_dev_name(handle)), _text(G.ggml_backend_dev_description(handle)),
                  int(G.ggml_backend_dev_type(handle)))


def add_remote(handles: list[int]) -> list[Device]:
    """Record the devices of an RPC server (``rpc_servers=``); returns them."""
    devs = [describe(h) for h in handles]
    _remote.extend(devs)
    return devs


def local_devices() -> list[Device]:
    """The devices in ggml's registry: this machine's."""
    _loader.load()
    return [describe(G.ggml_backend_dev_get(i)) for i in range(int(G.ggml_backend_dev_count()))]


def all_devices() -> list[Device]:
    """This machine's devices, then the RPC servers' devices added in this process."""
    return local_devices() + list(_remote)


def offload_devices() -> list[Device]:
    """The devices ``devices=`` may name: every device but the CPU (as llama.cpp's ``-dev``)."""
    return [d for d in all_devices() if not d.is_cpu]


def buffer_types() -> dict[str, int]:
    """Buffer type name -> handle: each device's default buffer type, the names ``-ot`` accepts."""
    out: dict[str, int] = {}
    for d in all_devices():
        buft = G.ggml_backend_dev_buffer_type(d.handle)
        if buft:
            out.setdefault(_text(G.ggml_backend_buft_name(buft)), int(buft))
    return out

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


def all_devices() -> list[Device]:
    """Every device ggml has registered now (remote RPC devices included once added)."""
    _loader.load()
    out = []
    for i in range(int(G.ggml_backend_dev_count())):
        dev = G.ggml_backend_dev_get(i)
        out.append(Device(int(dev), _text(G.ggml_backend_dev_name(dev)), _text(G.ggml_backend_dev_description(dev)),
                          int(G.ggml_backend_dev_type(dev))))
    return out


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

"""``devices=``, ``cpu_moe``, ``n_cpu_moe``, ``override_tensor`` and ``rpc_servers``: checked before
loading and resolved to ``llama_model_params.devices`` / ``tensor_buft_overrides``, as llama.cpp's
``-dev``, ``-cmoe``, ``-ncmoe``, ``-ot`` and ``--rpc`` do (common/arg.cpp, common/common.h).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import devices as _devices
from . import rpc as _rpc

log = logging.getLogger(__name__)

#: LLM_FFN_EXPS_REGEX (common/common.h): every MoE expert tensor
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"

OverrideSpec = str | Sequence[str] | Mapping[str, str]


def cpu_moe_overrides(cpu_moe: bool, n_cpu_moe: int) -> list[tuple[str, str]]:
    """llama.cpp's ``--cpu-moe`` (``llm_ffn_exps_cpu_override``) and ``--n-cpu-moe N``
    (``llm_add_n_cpu_ffn_overrides``: ``blk\\.i`` + the expert regex for the first N layers)."""
    out = [(FFN_EXPS_REGEX, "CPU")] if cpu_moe else []
    out += [(rf"blk\.{i}{FFN_EXPS_REGEX}", "CPU") for i in range(n_cpu_moe)]
    return out


def parse_override_tensor(value: OverrideSpec | None) -> list[tuple[str, str]]:
    """``-ot`` text (``"pattern=BUFT,pattern=BUFT"``), a list of such texts, or a ``{pattern: BUFT}``
    mapping (for a pattern with a comma) -> ``[(pattern, buffer type name)]`` in order. Texts are split
    at commas, as llama.cpp splits ``-ot``."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    else:
        texts = [value] if isinstance(value, str) else list(value)
        pairs = []
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"override_tensor entries must be 'pattern=buffer type' strings, not "
                                f"{type(text).__name__}")
        for item in (part for text in texts for part in text.split(",")):
            pattern, sep, buft = item.partition("=")
            if not sep:
                raise ValueError(f"override_tensor: {item!r} is not 'tensor name pattern=buffer type' "
                                 "(e.g. 'exps=CPU')")
            pairs.append((pattern, buft))
    for pattern, _buft in pairs:
        if not pattern:
            raise ValueError("override_tensor: an empty tensor name pattern")
        try:
            re.compile(pattern)  # llama.cpp's std::regex (ECMAScript) reads the same syntax for these
        except re.error as exc:
            raise ValueError(f"override_tensor: {pattern!r} is not a valid regular expression: {exc}") from None
    return pairs


@dataclass
class Placement:
    """What :func:`resolve` found: the fields for :class:`~llama_cpp._core.model.LlamaModel`."""

    device_names: list[str] | None = None  # None: llama.cpp's default (every device)
    device_handles: list[int] | None = None
    overrides: list[tuple[str, str]] = field(default_factory=list)  # (pattern, buffer type name)
    override_handles: list[tuple[str, int]] = field(default_factory=list)
    rpc_devices: list[str] = field(default_factory=list)

    def model_kwargs(self) -> dict[str, Any]:
        return {"devices": self.device_handles, "tensor_buft_overrides": self.override_handles or None}


def _check_devices(devices: str | Sequence[str] | None) -> list[str] | None:
    if devices is None:
        return None
    names = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else list(devices)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"devices must be device names (e.g. ['CUDA0'], or ['none'] for no offload), got {devices!r}")
    if "none" in names and len(names) > 1:
        raise ValueError("devices: 'none' (no offload) cannot be combined with device names")
    return names


def resolve(*, devices: str | Sequence[str] | None = None, cpu_moe: bool = False, n_cpu_moe: int = 0,
            override_tensor: OverrideSpec | None = None, rpc_servers: str | Sequence[str] | None = None,
            rpc_timeout: float = _rpc.DEFAULT_TIMEOUT) -> Placement:
    """Check every placement argument, add the RPC servers' devices, and resolve names to handles.

    Raises ValueError (unknown device or buffer type, bad pattern: each listing the valid names),
    TypeError, or :class:`ModelLoadError` for an RPC endpoint that is unreachable or of another
    protocol version.
    """
    if not isinstance(cpu_moe, bool):
        raise TypeError(f"cpu_moe must be a bool, not {type(cpu_moe).__name__}")
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int) or n_cpu_moe < 0:
        raise ValueError(f"n_cpu_moe must be an int >= 0 (the first N layers' experts stay on the CPU), got {n_cpu_moe!r}")
    names = _check_devices(devices)
    pairs = parse_override_tensor(override_tensor) + cpu_moe_overrides(cpu_moe, n_cpu_moe)
    endpoints = _rpc.parse_servers(rpc_servers) if rpc_servers is not None else []
    out = Placement(overrides=pairs)
    if names is None and not pairs and not endpoints:
        return out  # nothing to resolve: no native call
    if endpoints:
        out.rpc_devices = _rpc.add_servers(endpoints, rpc_timeout)
        if names is None:
            # the servers' devices first, as llama.cpp orders them (fewer network transfers), then the
            # local ones llama.cpp would use
            names = out.rpc_devices + [d.name for d in _devices.local_devices() if not d.is_cpu]
    if names is not None:
        out.device_names = [] if names == ["none"] else list(names)
        offload = {d.name: d for d in _devices.offload_devices()}
        unknown = [n for n in out.device_names if n not in offload]
        if unknown:
            cpu = [n for n in unknown if n in {d.name for d in _devices.all_devices() if d.is_cpu}]
            why = " (the CPU is always used and is not named)" if cpu else ""
            raise ValueError(f"unknown device {', '.join(map(repr, unknown))}{why}; devices to offload to: "
                             f"{', '.join(offload) or 'none in this build (no GPU or RPC device)'}")
        out.device_handles = [offload[n].handle for n in out.device_names]
    if pairs:
        bufts = _devices.buffer_types()
        for pattern, buft in pairs:
            if buft not in bufts:
                raise ValueError(f"override_tensor: unknown buffer type {buft!r} for {pattern!r}; available: "
                                 f"{', '.join(bufts)}")
            out.override_handles.append((pattern, bufts[buft]))
    return out

"""A served model's LoRA adapters, as llama-server handles them.

The adapters load once per model (``lora_path`` then ``lora_adapters``, ids 0, 1, ... in that
order). Each has a global scale (``GET/POST /lora-adapters``); a request's ``lora`` field
(``[{"id": N, "scale": s}, ...]``) replaces them for that request, the adapters it does not name at
scale 0, as llama-server's ``construct_lora_list`` does. A request's effective set is a tuple of
scales, one per adapter: the slot engine decodes only slots with equal tuples in one batch step
(adapters are per context in llama.cpp) and reuses cached KV only under the same tuple.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .._core.model import LlamaLoraAdapter, LlamaModel
from .errors import APIError

log = logging.getLogger("llama_cpp.server")

Scales = tuple[float, ...]


class LoraSet:
    """The adapters of one model, their global scales, and what is applied to its context now."""

    def __init__(self, model: LlamaModel, specs: list[tuple[str, float]], init_without_apply: bool = False) -> None:
        self.adapters: list[LlamaLoraAdapter] = []
        try:
            for path, _ in specs:
                self.adapters.append(LlamaLoraAdapter(model, path))
        except BaseException:
            self.close()
            raise
        self.paths = [a.path for a in self.adapters]
        self._scales: list[float] = [0.0 if init_without_apply else float(s) for _, s in specs]
        self._lock = threading.Lock()
        self.applied: Scales | None = None  # the scales the context decodes with now (None: not set yet)

    def __len__(self) -> int:
        return len(self.adapters)

    @property
    def scales(self) -> Scales:
        """The global scales (requests without a ``lora`` field use them)."""
        with self._lock:
            return tuple(self._scales)

    def info(self) -> list[dict[str, Any]]:
        """``GET /lora-adapters``: llama-server's list of ``{id, path, scale, task_name, prompt_prefix}``."""
        return [{"id": i, "path": str(p), "scale": s, "task_name": "", "prompt_prefix": ""}
                for i, (p, s) in enumerate(zip(self.paths, self.scales))]

    def parse(self, entries: Any, param: str = "lora") -> Scales:
        """A ``[{"id": N, "scale": s}, ...]`` list as one scale per adapter (unnamed ones 0); a 400 naming
        the bad entry otherwise."""
        if not isinstance(entries, list):
            raise APIError(400, f"{param} must be a list of {{\"id\": N, \"scale\": s}} objects", param=param,
                           code="invalid_value")
        if entries and not self.adapters:
            raise APIError(400, f"{param}: this model has no LoRA adapters (serve it with lora_adapters or "
                           "lora_path)", param=param, code="invalid_value")
        out = [0.0] * len(self.adapters)
        for k, e in enumerate(entries):
            if not isinstance(e, dict):
                raise APIError(400, f"{param}[{k}] must be an object {{\"id\": N, \"scale\": s}}", param=param,
                               code="invalid_value")
            i, s = e.get("id"), e.get("scale", 0.0)
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.adapters):
                raise APIError(400, f"{param}[{k}].id {i!r} is not an adapter of this model: the ids are 0 to "
                               f"{len(self.adapters) - 1} (GET /lora-adapters lists them)", param=param,
                               code="invalid_value")
            if isinstance(s, bool) or not isinstance(s, (int, float)) or s != s or s in (float("inf"), -float("inf")):
                raise APIError(400, f"{param}[{k}].scale {s!r} is not a finite number", param=param,
                               code="invalid_value")
            out[i] = float(s)
        return tuple(out)

    def resolve(self, entries: Any) -> Scales:
        """A request's effective scales: its ``lora`` field, or the global scales when it has none."""
        if entries is None:
            return self.scales
        return self.parse(entries)

    def set_global(self, entries: Any) -> None:
        """``POST /lora-adapters``: new global scales (adapters the list does not name go to 0)."""
        scales = self.parse(entries, param="body")
        with self._lock:
            self._scales = list(scales)
        log.info("LoRA adapter scales now %s", list(scales))

    def apply(self, ctx: Any, scales: Scales) -> None:
        """Make ``ctx`` decode with ``scales`` (a no-op when it already does)."""
        if scales == self.applied:
            return
        on = [(a, s) for a, s in zip(self.adapters, scales) if s != 0.0]
        ctx.set_adapters_lora([a for a, _ in on], [s for _, s in on])
        self.applied = scales

    def use(self, llama: Any, scales: Scales) -> None:
        """Switch a ``Llama`` run one request at a time to ``scales``: its evaluated tokens were computed
        under the old ones, so they are forgotten first."""
        if scales != self.applied:
            llama.reset()
            self.apply(llama.native_context(), scales)

    def close(self) -> None:
        for a in self.adapters:
            a.close()
        self.adapters = []


__all__ = ["LoraSet", "Scales"]

"""The served models: settings → a loaded ``Llama`` and its engine; routing by name.

A request names a model by its ``model_alias`` (or path when it has none); no name means the
first configured model; an unknown name is a 404. Models load at start (or on first use with
``lazy_load``) with their progress in the log.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..llama import Llama
from ..llama_speculative import LlamaPromptLookupDecoding
from ..mtmd import MTMDEmbeddingHandler
from ..mtmd_chat import MTMDChatHandler
from ..speculative.slots import SlotSpeculation
from .engine import SerialEngine, SlotEngine
from .engine.embeddings import EmbeddingEngine
from .engine.worker import WorkerEngine
from .errors import APIError
from .lora import LoraSet
from .settings import ModelSettings

log = logging.getLogger("llama_cpp.server")

# the context parameters a media embedder copies from its model's context, so that a text embeds alike on both
_SAME_NUMERICS = ("rope_scaling_type", "attention_type", "flash_attn_type", "rope_freq_base", "rope_freq_scale",
                  "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx",
                  "type_k", "type_v", "offload_kqv", "op_offload", "swa_full")


# the Llama keywords of a model's weights and devices, left out where only its vocabulary is opened
_WEIGHTS_ONLY = ("rpc_servers", "rpc_isolation", "devices", "cpu_moe", "n_cpu_moe", "override_tensor", "fit",
                 "fit_target", "fit_ctx", "speculative", "draft_model", "n_gpu_layers", "split_mode", "main_gpu",
                 "tensor_split")


def parse_kv_overrides(items: list[str] | None) -> dict[str, bool | int | float | str] | None:
    """``["key=type:value", ...]`` (type bool, int, float or str) as a dict for ``Llama(kv_overrides=)``."""
    if not items:
        return None
    out: dict[str, bool | int | float | str] = {}
    for item in items:
        key, sep, rest = item.partition("=")
        kind, sep2, value = rest.partition(":")
        if not key or not sep or not sep2:
            raise ValueError(f"kv_overrides entry {item!r}: write it as key=type:value (type bool, int, float, str)")
        if kind == "bool":
            out[key] = value.strip().lower() in ("true", "1")
        elif kind == "int":
            out[key] = int(value)
        elif kind == "float":
            out[key] = float(value)
        elif kind == "str":
            out[key] = value
        else:
            raise ValueError(f"kv_overrides entry {item!r}: unknown type {kind!r} (use bool, int, float or str)")
    return out


class ServedModel:
    """One configured model; :meth:`load` creates its ``Llama`` and engine (thread-safe, once)."""

    def __init__(self, settings: ModelSettings, interrupt_requests: bool = False) -> None:
        self.settings = settings
        self.interrupt_requests = interrupt_requests
        self.alias = settings.alias
        self.llama: Llama | None = None
        self.engine: SlotEngine | SerialEngine | EmbeddingEngine | None = None
        self.n_ctx_slot = 0
        self.lora: LoraSet | None = None  # its LoRA adapters (None: it has none)
        self.media_embedder: MTMDEmbeddingHandler | None = None  # embeddings of image/audio parts (a projector)
        self.serial = settings.serial  # one request at a time (else slots)
        # why a speculating model is served one request at a time (None: it speculates in its slots)
        self.spec_note: str | None = settings.spec_serial_reason
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self.llama is not None

    def load(self) -> Llama:
        with self._lock:
            if self.llama is None:
                self._load()
            assert self.llama is not None
            return self.llama

    def _llama_kwargs(self, serial: bool) -> dict[str, Any]:
        s = self.settings
        kw: dict[str, Any] = dict(
            n_gpu_layers=s.n_gpu_layers, split_mode=s.split_mode, main_gpu=s.main_gpu, tensor_split=s.tensor_split,
            vocab_only=s.vocab_only, use_mmap=s.use_mmap, use_mlock=s.use_mlock,
            kv_overrides=parse_kv_overrides(s.kv_overrides), seed=s.seed, n_batch=s.n_batch, n_ubatch=s.n_ubatch,
            n_threads=s.n_threads, n_threads_batch=s.n_threads_batch, rope_scaling_type=s.rope_scaling_type,
            rope_freq_base=s.rope_freq_base, rope_freq_scale=s.rope_freq_scale, yarn_ext_factor=s.yarn_ext_factor,
            yarn_attn_factor=s.yarn_attn_factor, yarn_beta_fast=s.yarn_beta_fast, yarn_beta_slow=s.yarn_beta_slow,
            yarn_orig_ctx=s.yarn_orig_ctx, embedding=s.embedding, offload_kqv=s.offload_kqv,
            flash_attn=s.flash_attn, last_n_tokens_size=s.last_n_tokens_size, lora_base=s.lora_base,
            numa=bool(s.numa), chat_format=s.chat_format, type_k=s.type_k, type_v=s.type_v,
            verbose=False, isolate_load=s.isolate_load, devices=s.devices, cpu_moe=s.cpu_moe, n_cpu_moe=s.n_cpu_moe,
            override_tensor=s.override_tensor, rpc_servers=s.rpc_servers, fit=s.fit, fit_target=s.fit_target,
            fit_ctx=s.fit_ctx, rpc_isolation=s.in_worker,  # else the slot engine drives the native context here
            chat_template_kwargs=s.chat_template_kwargs, reasoning_format=s.reasoning_format,
            reasoning_budget=s.reasoning_budget)
        if s.clip_model_path and not s.embedding:  # an embedding model's projector: media_embedder

            kw["chat_handler"] = MTMDChatHandler(s.clip_model_path, n_threads=s.n_threads,
                                                 use_gpu=s.n_gpu_layers != 0, media_dirs=s.media_dirs)
        if serial:
            kw["n_ctx"] = s.n_ctx
        else:
            kw["n_ctx"] = s.n_ctx * s.n_parallel
            kw["n_seq_max"] = s.n_parallel
            kw["kv_unified"] = True
            spec = s.spec_config()
            if spec is not None and spec.needs_nextn:
                kw["load_mtp"] = True  # the slots' MTP draft context runs the model's NextN layers
            return kw  # the slot engine speculates itself (SlotSpeculation)
        spec = s.spec_config()
        if spec is not None:
            kw["speculative"] = spec
        if s.draft_model is not None:

            kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=s.draft_model_num_pred_tokens)
        return kw

    def _load(self) -> None:
        s = self.settings
        last = [-1]

        def progress(p: float) -> bool:
            tenth = int(p * 10)
            if tenth != last[0]:
                last[0] = tenth
                log.info("loading %s: %d%%", self.alias, tenth * 10)
            return True

        serial = s.serial
        log.info("loading model %s from %s (%s)", self.alias, s.model,
                 "one request at a time" if serial else f"{s.n_parallel} slots of {s.n_ctx} tokens")
        if s.in_worker:
            self._load_in_worker()
            return
        llama = Llama(s.model, progress_callback=progress, **self._llama_kwargs(serial))
        try:
            lora = self._load_lora(llama)
            media_embedder = self._load_media_embedder(llama)
        except BaseException:
            llama.close()
            raise
        if self.spec_note is not None:
            log.warning("model %s: speculation (%s) %s", self.alias, ", ".join(self.spec_types()), self.spec_note)
        spec = None
        try:
            if s.vocab_only:
                engine = None
            elif s.embedding and s.n_parallel > 0:  # concurrent requests' inputs packed into shared decodes
                self.n_ctx_slot = llama.n_ctx()
                engine = EmbeddingEngine(llama, s.n_parallel, s.max_queue, lora=lora, media=media_embedder)
            elif serial:
                self.n_ctx_slot = llama.n_ctx()
                engine = SerialEngine(llama, s.max_queue, interrupt=self.interrupt_requests, lora=lora,
                                      speculative=s.spec_config() is not None, media=media_embedder)
            else:
                self.n_ctx_slot = llama.n_ctx() // s.n_parallel
                spec = self._slot_speculation(llama)
                engine = SlotEngine(llama, s.n_parallel, self.n_ctx_slot, s.max_queue, cache_prompt=s.cache_prompt,
                                    spec=spec, cache_ram=s.cache_ram,
                                    slot_prompt_similarity=s.slot_prompt_similarity, lora=lora)
        except BaseException:
            if spec is not None:
                spec.close()
            if lora is not None:
                lora.close()
            if media_embedder is not None:
                media_embedder.close()
            llama.close()
            raise
        self.llama, self.engine, self.lora, self.media_embedder = llama, engine, lora, media_embedder
        log.info("model %s ready", self.alias)

    def _load_in_worker(self) -> None:
        """A model over RPC servers: a :class:`~llama_cpp.LlamaWorker` on a :class:`WorkerEngine` (a lost
        server fails its request and the model reloads on the next), its vocabulary opened here for the
        routes' prompt work."""

        s = self.settings
        kw = self._llama_kwargs(serial=True)
        vocab_kw = {k: v for k, v in kw.items() if k not in _WEIGHTS_ONLY}
        vocab = Llama(s.model, **{**vocab_kw, "vocab_only": True})
        try:
            llama = Llama(s.model, **kw)  # a LlamaWorker (rpc_isolation): the endpoints are probed first
        except BaseException:
            vocab.close()
            raise
        try:
            engine = WorkerEngine(llama, vocab, s.max_queue, self.alias, interrupt=self.interrupt_requests,
                                  speculative=s.spec_config() is not None)
        except BaseException:
            llama.close()
            vocab.close()
            raise
        self.n_ctx_slot = engine.n_ctx_slot
        self.llama, self.engine = vocab, engine
        log.info("model %s ready in worker process %s (RPC servers %s; one request at a time)", self.alias,
                 llama.worker_pid, s.rpc_servers)

    def _load_media_embedder(self, llama: Llama) -> MTMDEmbeddingHandler | None:
        """An embedding model's projector with an embedding context of its own (per-token outputs, pooled
        over text and media chunks as the model pools), for ``/v1/embeddings`` inputs with media."""
        s = self.settings
        if not (s.embedding and s.clip_model_path) or s.vocab_only:
            return None

        cp = llama.native_context().params  # the model context's numerics (attention, KV types, RoPE)
        same = {k: getattr(cp, k) for k in _SAME_NUMERICS}
        handler = MTMDEmbeddingHandler(llama.native_model(), s.clip_model_path, n_ctx=llama.n_ctx(), n_batch=s.n_batch,
                                       n_ubatch=s.n_ubatch, n_seq_max=1, n_threads=s.n_threads,
                                       use_gpu=s.n_gpu_layers != 0, context_params=same)
        log.info("model %s: embeds media through the projector %s", self.alias, s.clip_model_path)
        return handler

    def _load_lora(self, llama: Llama) -> LoraSet | None:
        """The model's LoRA adapters (``lora_path`` first), applied at their global scales."""
        s = self.settings
        specs = ([(s.lora_path, 1.0)] if s.lora_path else []) + [(a.path, a.scale) for a in s.lora_adapters or []]
        if not specs or s.vocab_only:
            return None
        lora = LoraSet(llama.native_model(), specs, s.lora_init_without_apply)
        try:
            lora.apply(llama.native_context(), lora.scales)
        except BaseException:
            lora.close()
            raise
        log.info("model %s: %d LoRA adapter(s) %s", self.alias, len(lora), lora.info())
        return lora

    def spec_types(self) -> list[str]:
        """The speculative types this model runs (upstream's prompt lookup as ``prompt-lookup``)."""
        spec = self.settings.spec_config()
        if spec is not None:
            return [t.value for t in spec.types]
        return ["prompt-lookup"] if self.settings.draft_model is not None else []

    def _slot_speculation(self, llama: Llama) -> Any:
        """The slot engine's drafters (None when the model does not speculate)."""
        s = self.settings
        if not s.speculates:
            return None

        lookup = None
        if s.draft_model is not None:

            lookup = LlamaPromptLookupDecoding(num_pred_tokens=s.draft_model_num_pred_tokens)
        log.info("model %s speculates (%s) in each of its %d slots", self.alias, ", ".join(self.spec_types()),
                 s.n_parallel)
        return SlotSpeculation(llama.native_model(), llama.native_context(), s.n_parallel, config=s.spec_config(), prompt_lookup=lookup)

    def speculative_info(self) -> dict[str, Any] | None:
        """How this model speculates, for ``/v1/models``: its types, the engine, and why it is serial."""
        types = self.spec_types()
        if not types:
            return None
        info: dict[str, Any] = {"types": types, "engine": "serial" if self.serial else "slots"}
        if self.spec_note is not None:
            info["serial_reason"] = self.spec_note
        return info

    def drain(self, timeout: float) -> None:
        if self.engine is not None:
            self.engine.drain(timeout)

    def close(self) -> None:
        with self._lock:
            self.media_embedder = None  # freed by its engine with the model
            if self.engine is not None:
                self.engine.close()
            elif self.llama is not None:
                self.llama.close()
            handler = self.llama.chat_handler if self.llama is not None else None
            if handler is not None and hasattr(handler, "close"):
                handler.close()
            if self.engine is None and self.lora is not None:
                self.lora.close()
            self.engine = None
            self.llama = None
            self.lora = None


class ModelRegistry:
    """The configured models by name; the first is the default."""

    def __init__(self, settings: list[ModelSettings], interrupt_requests: bool = False) -> None:
        if not settings:
            raise ValueError("no model configured: pass --model PATH or a --config_file with models")
        self.models: dict[str, ServedModel] = {}
        for s in settings:
            if s.alias in self.models:
                raise ValueError(f"two models share the name {s.alias!r}: give them distinct model_alias values")
            self.models[s.alias] = ServedModel(s, interrupt_requests)
        self.default = next(iter(self.models.values()))

    def __iter__(self):
        return iter(self.models.values())

    def get(self, name: str | None) -> ServedModel:
        if not name:
            return self.default
        m = self.models.get(name)
        if m is None:
            known = ", ".join(sorted(self.models))
            raise APIError(404, f"the model {name!r} does not exist: this server serves {known}",
                           type="invalid_request_error", code="model_not_found", param="model")
        return m

    def load_all(self) -> None:
        for m in self:
            m.load()

    def drain(self, timeout: float) -> None:
        threads = [threading.Thread(target=m.drain, args=(timeout,)) for m in self]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self) -> None:
        for m in self:
            m.close()


__all__ = ["ModelRegistry", "ServedModel", "parse_kv_overrides"]

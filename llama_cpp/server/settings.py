"""The server's settings: upstream's classes and field names, plus the slot engine's and limits.

Every field is also an environment variable of the same name (pydantic-settings, case-insensitive:
``MODEL``, ``N_CTX``, ``API_KEY``...); command-line flags (:mod:`.cli`) take precedence.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .._chat.native_completion import check_chat_options
from .._placement.fit import fit_margins

_CPUS = max(multiprocessing.cpu_count(), 1)

# llama.cpp's values, written out so that reading the settings loads no native library
_SPLIT_MODE_LAYER = 1
_ROPE_SCALING_UNSPECIFIED = -1
_DEFAULT_SEED = 0xFFFFFFFF


class _Base(BaseSettings):
    # "model" and "model_alias" are upstream's field names
    model_config = SettingsConfigDict(protected_namespaces=(), extra="ignore")


class LoraAdapterSetting(BaseModel):
    """One LoRA adapter of a model: its GGUF file and global scale."""

    path: str
    scale: float = 1.0

    @classmethod
    def from_arg(cls, text: str) -> LoraAdapterSetting:
        """``PATH``, ``PATH:SCALE`` or a JSON object (a command-line value)."""
        if text.lstrip().startswith("{"):
            return cls.model_validate_json(text)
        path, sep, tail = text.rpartition(":")
        if sep and path:
            try:
                return cls(path=path, scale=float(tail))
            except ValueError:
                pass
        return cls(path=text)


class ModelSettings(_Base):
    """How one model is loaded and served."""

    model: str = Field(description="The path to the model to use for generating completions.")
    model_alias: str | None = Field(default=None, description="The name requests use for this model "
                                    "(default: the path).")
    # model parameters
    n_gpu_layers: int = Field(default=0, ge=-1, description="Layers to offload to the GPU (-1: all).")
    split_mode: int = Field(default=_SPLIT_MODE_LAYER, description="How to split the model across GPUs.")
    main_gpu: int = Field(default=0, ge=0, description="Main GPU to use.")
    tensor_split: list[float] | None = Field(default=None, description="Split layers across GPUs in proportion.")
    vocab_only: bool = Field(default=False, description="Load only the vocabulary (tokenize endpoints only).")
    use_mmap: bool = Field(default=True, description="Use mmap.")
    use_mlock: bool = Field(default=False, description="Use mlock.")
    kv_overrides: list[str] | None = Field(default=None, description="Model metadata overrides, each "
                                           "key=type:value with type one of bool, int, float, str.")
    isolate_load: bool = Field(default=True, description="Load and decode the model file once in a child "
                               "process first (verdict cached per file), so a hostile file cannot take the "
                               "server down.")
    rpc_servers: str | None = Field(default=None, description="Comma-separated RPC servers (host:port) whose "
                                    "devices take layers (with n_gpu_layers), as llama.cpp's --rpc; each is "
                                    "probed before loading.")
    rpc_isolation: bool = Field(default=True, description="With rpc_servers: run the model in a worker process "
                                "served one request at a time, so that a lost RPC server fails the requests "
                                "it was computing (503 naming it) and the model reloads on the next request, "
                                "instead of llama.cpp's client aborting the server. false: batched slots in "
                                "the server process (a lost RPC server aborts the server).")
    devices: list[str] | None = Field(default=None, description="Devices to offload to, as llama.cpp's -dev "
                                      "(e.g. CUDA0 RPC0; 'none': no offload).")
    cpu_moe: bool = Field(default=False, description="Keep every MoE expert tensor on the CPU (--cpu-moe).")
    n_cpu_moe: int = Field(default=0, ge=0, description="Keep the MoE experts of the first N layers on the CPU "
                           "(--n-cpu-moe).")
    override_tensor: list[str] | None = Field(default=None, description="Tensor buffer overrides, each "
                                              "pattern=buffer type, as llama.cpp's -ot (e.g. exps=CPU).")
    fit: bool = Field(default=False, description="Fit n_gpu_layers, expert placement and n_ctx=0 to the devices' "
                      "free memory before loading, as llama.cpp's --fit.")
    fit_target: str | None = Field(default=None, description="With fit: the memory to leave free per device in MiB, "
                                   "one value or one per device ('512,2048'), as llama.cpp's -fitt (default 1024).")
    fit_ctx: int | None = Field(default=None, ge=0, description="With fit: the smallest n_ctx the fit may choose, "
                                "as llama.cpp's -fitc (default 4096).")

    @field_validator("fit_target")
    @classmethod
    def _check_fit_target(cls, value: str | None) -> str | None:
        fit_margins(value)
        return value
    # context parameters
    seed: int = Field(default=_DEFAULT_SEED, description="Random seed (4294967295: random).")
    n_ctx: int = Field(default=2048, ge=0, description="The context size of each request (each slot).")
    n_batch: int = Field(default=512, ge=1, description="Tokens decoded per step, all slots together.")
    n_ubatch: int = Field(default=512, ge=1, description="The physical batch size used by llama.cpp.")
    n_threads: int = Field(default=max(_CPUS // 2, 1), ge=-1, description="Threads for generation (-1: all).")
    n_threads_batch: int = Field(default=_CPUS, ge=-1, description="Threads for prompt batches (-1: all).")
    rope_scaling_type: int = Field(default=_ROPE_SCALING_UNSPECIFIED)
    rope_freq_base: float = Field(default=0.0, description="RoPE base frequency.")
    rope_freq_scale: float = Field(default=0.0, description="RoPE frequency scaling factor.")
    yarn_ext_factor: float = Field(default=-1.0)
    yarn_attn_factor: float = Field(default=1.0)
    yarn_beta_fast: float = Field(default=32.0)
    yarn_beta_slow: float = Field(default=1.0)
    yarn_orig_ctx: int = Field(default=0)
    mul_mat_q: bool = Field(default=True, description="Accepted for compatibility; llama.cpp chooses kernels.")
    logits_all: bool = Field(default=True, description="Accepted for compatibility; logprobs work either way.")
    embedding: bool = Field(default=False, description="Serve /v1/embeddings with this model.")
    offload_kqv: bool = Field(default=True, description="Offload the KV cache to the GPU.")
    flash_attn: bool = Field(default=False, description="Use flash attention.")
    # sampling
    last_n_tokens_size: int = Field(default=64, ge=0, description="Tokens the repeat penalty looks back at.")
    # LoRA
    lora_base: str | None = Field(default=None, description="Accepted for compatibility (ignored).")
    lora_path: str | None = Field(default=None, description="A LoRA adapter to apply at scale 1 (adapter id 0).")
    lora_adapters: list[LoraAdapterSetting] | None = Field(
        default=None, description="LoRA adapters (ids after lora_path's), each PATH or PATH:SCALE on the command "
        'line or {"path": ..., "scale": ...} in a config file (llama-server\'s --lora / --lora-scaled); '
        "requests pick scales with their lora field, GET/POST /lora-adapters the global ones.")
    lora_init_without_apply: bool = Field(default=False, description="Load the LoRA adapters at global scale 0 "
                                          "(llama-server's --lora-init-without-apply).")
    # backend
    numa: bool | int = Field(default=False, description="Enable NUMA support.")
    # chat
    chat_format: str | None = Field(default=None, description="A named chat format (default: the model's "
                                    "own template).")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="Template variables for every "
                                                        'chat (e.g. {"enable_thinking": false}); a request\'s own '
                                                        "are merged over them.")
    reasoning_format: str | None = Field(default=None, description="How thinking is returned: auto (default), none, "
                                         "deepseek or deepseek-legacy (llama-server's --reasoning-format).")
    reasoning_budget: int | None = Field(default=None, ge=-1, description="Thinking tokens before the end tag is "
                                         "forced: -1 unlimited, 0 no thinking (llama-server's --reasoning-budget).")
    clip_model_path: str | None = Field(default=None, description="A multimodal projector (mmproj GGUF): "
                                        "image chat with image_url parts; with embedding, /v1/embeddings of "
                                        "inputs with image and audio parts.")
    media_dirs: list[str] | None = Field(default=None, description="Local directories image_url paths may "
                                         "name (default: none, data: URLs only).")
    # cache (upstream's prompt cache; each slot keeps its own KV instead)
    cache: bool = Field(default=False, description="Not supported: setting it is an error.")
    cache_type: Literal["ram", "disk"] = Field(default="ram")
    cache_size: int = Field(default=2 << 30)
    # tokenizer / hub options upstream resolves from Hugging Face
    hf_tokenizer_config_path: str | None = Field(default=None, description="Not supported.")
    hf_pretrained_model_name_or_path: str | None = Field(default=None, description="Not supported.")
    hf_model_repo_id: str | None = Field(default=None, description="Not supported.")
    # speculative decoding
    draft_model: str | None = Field(default=None, description="Upstream's speculative method: "
                                    "'prompt-lookup-decoding' (LlamaPromptLookupDecoding).")
    draft_model_num_pred_tokens: int = Field(default=10, ge=1, description="Most tokens prompt lookup drafts.")
    spec_type: str | None = Field(default=None, description="Speculative decoding, as llama.cpp's --spec-type "
                                  "names it (several joined by commas): draft-mtp (the model's NextN head), "
                                  "draft-simple, draft-eagle3, draft-dflash, draft-dspark (each with "
                                  "draft_model_path), ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
                                  "ngram-cache. The n-gram types and draft-simple speculate in every slot; "
                                  "with the others the model serves one request at a time.")
    draft_model_path: str | None = Field(default=None, description="The draft model of draft-simple (sharing the "
                                         "target's vocabulary), draft-eagle3, draft-dflash or draft-dspark.")
    draft_n_max: int = Field(default=3, ge=1, description="Most tokens drafted per step.")
    draft_n_min: int = Field(default=0, ge=0, description="Shorter drafts are dropped.")
    draft_p_min: float = Field(default=0.0, ge=0.0, le=1.0, description="Stop drafting below this probability.")
    spec_ngram_simple: dict[str, int] | None = Field(default=None, description="ngram-simple parameters, as "
                                                     "llama.cpp's --spec-ngram-simple-*: size_n, size_m.")
    spec_ngram_map_k: dict[str, int] | None = Field(default=None, description="ngram-map-k parameters: size_n, "
                                                    "size_m, min_hits.")
    spec_ngram_map_k4v: dict[str, int] | None = Field(default=None, description="ngram-map-k4v parameters: "
                                                      "size_n, size_m, min_hits.")
    spec_ngram_mod: dict[str, int] | None = Field(default=None, description="ngram-mod parameters: n_match, "
                                                  "n_min, n_max.")
    spec_ngram_cache: dict[str, Any] | None = Field(default=None, description="ngram-cache parameters: n_draft, "
                                                    "lookup_cache_static, lookup_cache_dynamic (file paths).")
    # KV cache quantization
    type_k: int | None = Field(default=None, description="The K cache type (a ggml type id).")
    type_v: int | None = Field(default=None, description="The V cache type (a ggml type id).")
    # the slot engine
    n_parallel: int = Field(default=1, ge=0, le=64, description="Requests generated at once on one context "
                            "(slots); the KV cache holds n_ctx tokens per slot (an embedding model: requests "
                            "whose inputs are packed into shared decodes). 0: one request at a time "
                            "through Llama itself.")
    cache_prompt: bool = Field(default=True, description="Keep a finished request's tokens in its slot's KV "
                               "cache, so that a later prompt starting with them skips that prefix.")
    cache_ram: int = Field(default=8192, ge=-1, description="MiB of host memory for the prompt cache the slots "
                           "share (llama-server's --cache-ram): the states of prompts a slot gave up, restored "
                           "into whichever slot a later prompt starting with them lands on. -1: no limit, "
                           "0: off.")
    slot_prompt_similarity: float = Field(default=0.1, ge=0.0, le=1.0, description="How much of a request's "
                                          "prompt a free slot's cached tokens must cover for the request to "
                                          "take that slot (llama-server's --slot-prompt-similarity); else "
                                          "the least recently used slot. 0: always the least recently used.")
    max_queue: int = Field(default=32, ge=0, description="Requests that may wait for a slot; beyond that "
                           "the server answers 429 at once.")
    verbose: bool = Field(default=True, description="Accepted for compatibility; logs go to logging.")

    @model_validator(mode="before")
    @classmethod
    def _all_cpus(cls, values: Any) -> Any:
        if isinstance(values, dict):
            for k in ("n_threads", "n_threads_batch"):
                if values.get(k) in (-1, "-1"):
                    values[k] = _CPUS
        return values

    @model_validator(mode="after")
    def _unsupported(self) -> ModelSettings:
        refused = {"hf_tokenizer_config_path": self.hf_tokenizer_config_path,
                   "hf_pretrained_model_name_or_path": self.hf_pretrained_model_name_or_path,
                   "hf_model_repo_id": self.hf_model_repo_id,
                   "cache": self.cache or None}
        check_chat_options(self.chat_template_kwargs, self.reasoning_format, self.reasoning_budget)  # ValueError
        bad = sorted(k for k, v in refused.items() if v is not None)
        if bad:
            raise ValueError(f"{', '.join(bad)}: not supported by this server (nothing is downloaded and upstream's "
                             "prompt cache is replaced by per-slot KV); remove the setting")
        if self.draft_model is not None and self.draft_model != "prompt-lookup-decoding":
            raise ValueError(f"draft_model {self.draft_model!r}: the method upstream offers is "
                             "'prompt-lookup-decoding'; for a draft model file use spec_type=draft-simple with "
                             "draft_model_path")
        if self.draft_model is not None and self.spec_type not in (None, "none"):
            raise ValueError("draft_model and spec_type both set: choose one way to speculate")
        try:
            spec = self.spec_config()
            if spec is not None:
                from ..speculative import check_context_params

                check_context_params(spec, {"n_batch": self.n_batch, "n_ubatch": self.n_ubatch})
        except ValueError as exc:  # SpeculativeError is one too
            raise ValueError(f"spec_type {self.spec_type!r}: {exc}") from exc
        if self.draft_n_min > self.draft_n_max:
            raise ValueError(f"draft_n_min={self.draft_n_min} exceeds draft_n_max={self.draft_n_max}")
        if self.n_parallel > self.n_batch:
            raise ValueError(f"n_parallel={self.n_parallel} exceeds n_batch={self.n_batch}: every step decodes one "
                             "token of each slot, so n_batch must hold them all")
        return self

    @property
    def alias(self) -> str:
        return self.model_alias or self.model

    def spec_config(self) -> Any:
        """The :class:`~llama_cpp.speculative.SpecConfig` of ``spec_type`` (None: not speculating)."""
        if self.spec_type is None and self.draft_model_path is None:
            return None
        from ..speculative import SpecConfig

        ngram = {name: value for name in ("ngram_simple", "ngram_map_k", "ngram_map_k4v", "ngram_mod", "ngram_cache")
                 if (value := getattr(self, "spec_" + name)) is not None}
        cfg = SpecConfig(spec_type=self.spec_type, draft_n_max=self.draft_n_max, draft_n_min=self.draft_n_min,
                         draft_p_min=self.draft_p_min, draft_model_path=self.draft_model_path, **ngram)
        return cfg if cfg.enabled else None

    @property
    def speculates(self) -> bool:
        """Whether this model speculates (any type, or upstream's prompt-lookup ``draft_model``)."""
        return self.draft_model is not None or self.spec_config() is not None

    @property
    def spec_serial_reason(self) -> str | None:
        """Why this model's speculative types keep it on one request at a time (None: they run in slots)."""
        spec = self.spec_config()
        if spec is None:
            return None
        from ..speculative.slots import slot_unsupported

        return slot_unsupported(spec, self.model)

    @property
    def in_worker(self) -> bool:
        """Whether this model runs in a worker process (``rpc_servers`` with ``rpc_isolation``)."""
        return bool(self.rpc_servers) and self.rpc_isolation and not self.vocab_only

    @model_validator(mode="after")
    def _check_in_worker(self) -> ModelSettings:
        # what needs the model's native handles in the server process cannot reach one in a worker
        needs = [name for name, on in (("embedding", self.embedding), ("clip_model_path", self.clip_model_path),
                                       ("lora_path", self.lora_path), ("lora_adapters", self.lora_adapters)) if on]
        if self.in_worker and needs:
            raise ValueError(f"model {self.alias!r}: {', '.join(needs)} with rpc_servers needs the model in the "
                             "server process: set rpc_isolation to false (then a lost RPC server aborts the "
                             "server), or serve it without rpc_servers")
        return self

    @property
    def serial(self) -> bool:
        """Whether this model is served one request at a time (see the package docstring)."""
        # a projector model that speculates keeps the chat handler's media decoder (drafts over media)
        return (self.n_parallel == 0 or self.spec_serial_reason is not None
                or bool(self.clip_model_path and self.speculates) or self.embedding
                or self.in_worker)


class ServerSettings(_Base):
    """How the HTTP server listens and what it accepts."""

    host: str = Field(default="127.0.0.1", description="Listen address (default: loopback only).")
    port: int = Field(default=8000, ge=0, le=65535, description="Listen port.")
    ssl_keyfile: str | None = Field(default=None, description="SSL key file for HTTPS.")
    ssl_certfile: str | None = Field(default=None, description="SSL certificate file for HTTPS.")
    api_key: str | None = Field(default=None, min_length=1, description="If set, every request needs "
                                "'Authorization: Bearer <api_key>' or 'x-api-key: <api_key>' (an empty key is "
                                "refused, not 'no key').")
    api_key_file: str | None = Field(default=None, description="A file of API keys, one per line, each "
                                     "optionally with limits: 'KEY tpm=20000 concurrent=4' (tokens per minute, "
                                     "requests in flight; over a limit: 429 with Retry-After).")
    interrupt_requests: bool = Field(default=True, description="As upstream, on one-at-a-time models: a "
                                     "running stream ends (no finish_reason) when another request waits. "
                                     "Slot models serve new requests alongside, interrupting none.")
    disable_ping_events: bool = Field(default=False, description="Do not send SSE comment pings while a "
                                      "stream is idle.")
    root_path: str = Field(default="", description="The root path when running behind a reverse proxy.")
    allow_origins: list[str] | None = Field(default=None, description="Browser origins allowed to call the "
                                            "API (CORS), e.g. http://localhost:3000 or *; default: none.")
    max_body_bytes: int = Field(default=32 << 20, ge=1024, description="Largest request body accepted (413).")
    max_tokens_limit: int = Field(default=8192, ge=1, description="Largest max_tokens a request may ask for.")
    max_n: int = Field(default=8, ge=1, description="Largest n (choices per request).")
    max_prompts: int = Field(default=16, ge=1, description="Most prompts in one completion request.")
    max_stop: int = Field(default=16, ge=1, description="Most stop strings in one request.")
    max_stop_chars: int = Field(default=512, ge=1, description="Longest stop string, in characters.")
    shutdown_timeout: float = Field(default=10.0, ge=0.0, description="Seconds running requests may take to "
                                    "finish after SIGTERM before they are cancelled.")
    lazy_load: bool = Field(default=False, description="Load each model on its first request instead of at start.")
    ping_interval: float = Field(default=15.0, gt=0.0, description="Seconds between SSE pings on an idle stream.")
    responses_store: bool = Field(default=False, description="What /v1/responses does when a request omits "
                                  "'store': keep the response (true, OpenAI's default) or not (false: stateless "
                                  "unless the request asks).")
    responses_store_max: int = Field(default=1000, ge=0, description="Most responses kept for "
                                     "previous_response_id and GET /v1/responses/{id} (least recently used "
                                     "evicted first; 0: none are kept, and responses say store: false).")
    responses_store_mb: float = Field(default=64.0, ge=0.0, description="MiB the kept responses may take "
                                      "(their JSON; least recently used evicted first).")


class Settings(ServerSettings, ModelSettings):
    """Server and one model in one object (the command line without --config_file)."""


class ConfigFileSettings(ServerSettings):
    """A JSON or YAML config file: the server settings and a list of models."""

    models: list[ModelSettings] = Field(default=[], description="Model configs")

    @model_validator(mode="after")
    def _distinct(self) -> ConfigFileSettings:
        if not self.models:
            raise ValueError("the config file lists no models: add at least one under 'models'")
        seen: set[str] = set()
        for m in self.models:
            if m.alias in seen:
                raise ValueError(f"two models share the name {m.alias!r}: give them distinct model_alias values")
            seen.add(m.alias)
        return self


__all__ = ["ConfigFileSettings", "ModelSettings", "ServerSettings", "Settings"]

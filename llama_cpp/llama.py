"""``Llama``: the high-level text-generation API, compatible with llama-cpp-python's core.

Sampling runs in llama.cpp's native sampler chain (``llama_sampler_chain_*``); Python only moves
token ids. ``temperature=0`` is llama.cpp's greedy decoding, token for token. Prompts are
validated (token ids, length against ``n_ctx``) before any native call.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from . import llama_chat_format as _chat
from . import llama_types as T
from . import speculative as _spec
from ._chat import template_chat as _template_chat
from ._compat.hooks import (
    LogitsProcessor,
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)
from ._compat.keywords import unknown_keywords
from ._compat.state import LlamaState, longest_token_prefix
from ._core.context import LlamaBatch, LlamaContext
from ._core.model import LlamaLoraAdapter, LlamaModel, flash_attn_type
from ._core.sampler import LlamaSampler
from ._core.vocab_only import VocabOnlyContext
from ._errors import ClosedError, ContextError, LlamaError, ModelNotFoundError
from ._generation import completion as _completion
from ._generation import sampling as _sampling
from ._generation import snapshot as _snapshot
from ._generation.sequence import GenerationSequence
from ._placement import isolation as _isolation
from ._placement.load import prepare as _place
from ._safety import boundary as _boundary
from ._safety import checks as _checks
from ._safety.call_guard import CallGuard, serialized
from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache
from .llama_cpp import (
    LLAMA_ATTENTION_TYPE_UNSPECIFIED,
    LLAMA_DEFAULT_SEED,
    LLAMA_POOLING_TYPE_NONE,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
    LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
    LLAMA_SPLIT_MODE_LAYER,
)
from .llama_embedding import embed_token_lists
from .llama_grammar import LlamaGrammar
from .llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
from .llama_tokenizer import BaseLlamaTokenizer, LlamaHFTokenizer, LlamaTokenizer
from .llama_types import *  # noqa: F403 (upstream's llama module re-exports its types)

log = logging.getLogger("llama_cpp")


class Llama:
    """A llama.cpp model and context for completion, chat and embeddings.

    Keyword arguments follow llama-cpp-python. ``use_mmap``/``use_mlock`` map onto llama.cpp's
    ``load_mode`` (pass ``load_mode=`` to choose it directly); ``flash_attn`` accepts a bool or
    ``None`` (auto). Keywords this version does not know (``f16_kv``, ``n_parts``, ... which older
    releases took) are accepted and ignored with a warning naming them, as upstream ignores them.
    ``draft_model`` (a :class:`~llama_cpp.llama_speculative.LlamaDraftModel`) verifies drafted
    tokens in one batch and gives the same tokens as without it, through the speculative engine's one
    verify loop (any model, including recurrent and hybrid ones; ``last_speculative_stats``; combined
    with ``speculative=``): a ``LlamaPromptLookupDecoding`` drafts as the type ``prompt-lookup``, any
    other object as ``llama-draft-model``; assigning ``draft_model`` later rebuilds the decoder (a
    ``speculative=`` draft model is loaded again). ``embedding=True`` or ``n_seq_max > 1`` contexts
    cannot run the engine and decode without the draft (with a warning); ``tokenizer`` replaces the
    vocabulary's tokenizer for ``tokenize``/``detokenize`` and text prompts. ``load_mtp=True``
    loads the model's NextN (MTP) tensors without a speculative decoder, for a caller that drafts
    with them over this context itself (the server's slot engine); a file without NextN layers is
    refused before loading. Placement as llama.cpp's -dev/-cmoe/-ncmoe/-ot/--rpc/--fit/-fitt/-fitc: ``devices``,
    ``cpu_moe``, ``n_cpu_moe``, ``override_tensor`` ("exps=CPU"), ``rpc_servers`` ("host:port,..."), ``fit``,
    ``fit_target`` (MiB left free per device, default 1024) and ``fit_ctx`` (the smallest ``n_ctx`` the
    fit may choose, default 4096) (llama_cpp._placement).
    ``chat_template_kwargs``, ``reasoning_format`` and ``reasoning_budget`` are the defaults of
    ``create_chat_completion``'s (llama.cpp's chat layer, as llama-server's).

    With ``rpc_servers`` the model runs in a worker process this object owns (``Llama(...)`` returns a
    :class:`~llama_cpp.LlamaWorker`, a ``Llama``): llama.cpp's RPC client aborts the process that holds
    the model when a server is lost, so a lost server raises :class:`WorkerLostError` naming it instead,
    and ``reload()`` loads again. ``rpc_isolation=False`` loads in this process (a lost server then
    aborts the interpreter); a subclass of ``Llama`` always loads in-process.

    Thread safety: one ``Llama`` may be shared between threads. Calls are serialized (a call from
    another thread waits for the running one); a stream (``stream=True``, ``generate``) holds the
    object until it is exhausted or closed, and meanwhile any other call or stream raises
    :class:`BusyError` at once (``tokenize``/``detokenize`` still work). ``close()`` from another
    thread waits for the token being computed, then frees; the stream then raises ``ClosedError``.
    Parameters are checked before they reach llama.cpp (:class:`ParameterError`, a ``ValueError``).

    ``verbose`` is accepted for compatibility and prints nothing: llama.cpp's own log always goes to
    the ``llama_cpp.native`` :mod:`logging` logger (upstream prints it to stderr when ``verbose``);
    ``logging.basicConfig(level=logging.INFO)`` shows it.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Llama:
        if cls is Llama and _isolation.wanted(kwargs):
            cls = LlamaWorker
        return super().__new__(cls)

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_gpu_layers: int = 0,
        split_mode: int = LLAMA_SPLIT_MODE_LAYER,
        main_gpu: int = 0,
        tensor_split: list[float] | None = None,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        load_mode: int | None = None,
        kv_overrides: dict[str, bool | int | float | str] | None = None,
        seed: int = LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_seq_max: int | None = None,
        rope_scaling_type: int | None = LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
        pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED,
        attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        yarn_ext_factor: float = -1.0,
        yarn_attn_factor: float = 1.0,
        yarn_beta_fast: float = 32.0,
        yarn_beta_slow: float = 1.0,
        yarn_orig_ctx: int = 0,
        logits_all: bool = False,
        embedding: bool = False,
        offload_kqv: bool = True,
        flash_attn: bool | None = False,
        op_offload: bool | None = None,
        swa_full: bool | None = None,
        kv_unified: bool | None = None,
        no_perf: bool = False,
        last_n_tokens_size: int = 64,
        lora_base: str | None = None,
        lora_scale: float = 1.0,
        lora_path: str | None = None,
        numa: bool = False,
        chat_format: str | None = None,
        chat_handler: Callable[..., Any] | None = None,
        draft_model: LlamaDraftModel | None = None,
        tokenizer: BaseLlamaTokenizer | None = None,
        type_k: int | None = None,
        type_v: int | None = None,
        spm_infill: bool = False,
        verbose: bool = True,
        progress_callback: Callable[[float], Any] | None = None,
        speculative: _spec.SpecConfig | None = None,
        load_mtp: bool = False, sampling_convention: str = "upstream",  # see _generation.sampling.CONVENTIONS
        isolate_load: bool | None = None, devices: list[str] | None = None, cpu_moe: bool = False, n_cpu_moe: int = 0,
        override_tensor: str | list[str] | None = None, rpc_servers: str | None = None, fit: bool = False,
        fit_target: int | str | list[int] | None = None, fit_ctx: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None, reasoning_format: str | None = None,
        reasoning_budget: int | None = None, rpc_isolation: bool = True,
        **kwargs: Any,
    ) -> None:
        # the constructor's arguments, for pickling (__getstate__ re-creates the object from them)
        self._init_args = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        if kwargs:
            unknown_keywords(kwargs, self._init_args)
        if not isinstance(rpc_isolation, bool):
            raise TypeError(f"rpc_isolation must be a bool, not {type(rpc_isolation).__name__}")
        if draft_model is not None and not callable(draft_model):
            raise TypeError(f"draft_model must be a LlamaDraftModel (a callable), got {type(draft_model).__name__}")
        if tokenizer is not None and not isinstance(tokenizer, BaseLlamaTokenizer):
            raise TypeError(f"tokenizer must be a BaseLlamaTokenizer, got {type(tokenizer).__name__}")
        self._guard = CallGuard("Llama")
        self._model: LlamaModel | None = None
        self._ctx: LlamaContext | VocabOnlyContext | None = None
        self.cache: BaseLlamaCache | None = None
        self._draft_model = draft_model
        self.numa = numa
        self.lora_base, self.lora_scale, self.lora_path = lora_base, lora_scale, lora_path
        self.kv_overrides, self.tensor_split = kv_overrides, tensor_split
        self._lora: LlamaLoraAdapter | None = None
        #: the generation sequence: tokens in memory, their logits, the speculative decoder, the seed
        self.sequence: GenerationSequence
        self.last_speculative_stats: _spec.SpeculativeStats | None = None
        # prompt tokens the last prompt evaluation kept from memory (None: evaluated elsewhere, a decoder's own)
        self.last_prompt_cached: int | None = None
        self._embedding = bool(embedding)
        self.verbose = verbose
        self.model_path = os.fspath(model_path)
        if not os.path.exists(self.model_path):
            raise ModelNotFoundError(f"model file not found: {self.model_path} (check the path, or download it "
                                     "with Llama.from_pretrained)")
        seed, self.sampling_convention = int(seed), _sampling.check_convention(sampling_convention)
        self.chat_options = _chat.check_chat_options(chat_template_kwargs, reasoning_format, reasoning_budget)
        self.last_n_tokens_size = int(last_n_tokens_size)
        self.logits_all = bool(logits_all)
        self.spm_infill = spm_infill
        if lora_base is not None:
            log.warning("lora_base is ignored: llama.cpp applies LoRA adapters to the loaded model directly")

        cpu = os.cpu_count() or 1
        self.n_threads = int(n_threads) if n_threads is not None else max(cpu // 2, 1)
        self.n_threads_batch = int(n_threads_batch) if n_threads_batch is not None else cpu
        _checks.model_params(split_mode=split_mode, load_mode=load_mode, n_gpu_layers=n_gpu_layers,
                             main_gpu=main_gpu)
        _checks.context_sizes(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch)

        if speculative is not None and not isinstance(speculative, _spec.SpecConfig):
            raise TypeError(f"speculative must be a SpecConfig, got {type(speculative).__name__}")
        self.speculative = speculative
        self._vocab_only = bool(vocab_only)
        # upstream's draft_model objects draft as rows of the speculative engine (prompt-lookup,
        # llama-draft-model: rollback on recurrent memory, stats, combination with speculative=), where
        # the engine can run: one generation sequence
        self._spec_runs = not vocab_only and not embedding and (n_seq_max is None or int(n_seq_max) == 1)
        if draft_model is not None and not self._spec_runs and not vocab_only:
            warnings.warn("draft_model is not used with embedding=True or n_seq_max > 1: speculative decoding runs "
                          "one generation sequence (the output is the same without it)", UserWarning, stacklevel=2)
        spec_cfg = self._spec_config()
        spec_on = spec_cfg is not None
        # everything checkable without loading: the file's NextN layers, the batch sizes
        want_mtp = _spec.check_before_load(model_path, spec_cfg, kv_overrides, {
            "n_ctx": int(n_ctx), "n_batch": int(n_batch), "n_ubatch": int(n_ubatch),
            "n_seq_max": 1 if n_seq_max is None else int(n_seq_max), "embeddings": bool(embedding)},
            bool(load_mtp) and not vocab_only)
        _boundary.verify_load(self.model_path, isolate_load, kv_overrides, want_mtp, embedding, vocab_only)
        placed = _place(self._init_args)  # checked and resolved before loading; fit=True may choose n_ctx
        n_ctx = placed.n_ctx
        self._model = LlamaModel(
            model_path, load_mtp=want_mtp, split_mode=split_mode, main_gpu=main_gpu, **placed.model_kwargs(),
            vocab_only=vocab_only, use_mmap=use_mmap, use_mlock=use_mlock,
            load_mode=load_mode, kv_overrides=kv_overrides, progress_callback=progress_callback,
        )
        if want_mtp:
            self._model.load_mtp = True  # its NextN tensors are loaded (see speculative.load_mtp_model)
        self._n_vocab = self._model.n_vocab
        self.tokenizer_: BaseLlamaTokenizer = tokenizer if tokenizer is not None else LlamaTokenizer(self._model)
        self._is_recurrent = self._model.is_recurrent()
        self._is_hybrid = self._model.is_hybrid()
        try:
            self._init_context(vocab_only=vocab_only, embedding=embedding, flash_attn=flash_attn,
                               n_seq_max=n_seq_max, kv_unified=kv_unified, n_ctx=n_ctx, n_batch=n_batch,
                               n_ubatch=n_ubatch, rope_scaling_type=rope_scaling_type, pooling_type=pooling_type,
                               rope_freq_base=rope_freq_base, rope_freq_scale=rope_freq_scale,
                               yarn_ext_factor=yarn_ext_factor, yarn_attn_factor=yarn_attn_factor,
                               yarn_beta_fast=yarn_beta_fast, yarn_beta_slow=yarn_beta_slow,
                               yarn_orig_ctx=yarn_orig_ctx, offload_kqv=offload_kqv, op_offload=op_offload,
                               swa_full=swa_full, no_perf=no_perf, type_k=type_k, type_v=type_v,
                               lora_path=lora_path, lora_scale=lora_scale, attention_type=attention_type,
                               n_rs_seq=spec_cfg.rollback_snapshots if spec_on else None)
            ctx = self._ctx if isinstance(self._ctx, LlamaContext) else None
            self.sequence = GenerationSequence(self._model, ctx, seed=seed)
            # a media chat handler (MTMDChatHandler) builds a decoder that also takes its media prompts
            self._media_spec = getattr(chat_handler, "speculative_decoder", None)
            if spec_on:
                self.sequence.spec = self._make_spec(spec_cfg)
        except BaseException:
            self.close()
            raise

        self._n_ctx = self.n_ctx()
        self._token_eos, self._token_nl = self._model.token_eos(), self._model.token_nl()
        if chat_handler is None and chat_format is not None:
            # names that are handlers, not prompt formats: chatml-function-calling, functionary*
            chat_handler = _chat.chat_handler_for_format(chat_format)
        self.chat_handler = chat_handler
        self.chat_format = chat_format
        self._formatter: _chat.Jinja2ChatFormatter | None = None
        if chat_format is not None and chat_handler is None:
            try:
                _chat.get_chat_formatter(chat_format)  # a typo fails now, not at the first chat
            except ValueError:
                self.close()
                raise

    def _init_context(self, *, vocab_only: bool, embedding: bool, flash_attn: Any, n_seq_max: int | None,
                      kv_unified: bool | None, n_ctx: int, n_batch: int, n_ubatch: int,
                      rope_scaling_type: int | None, pooling_type: int, rope_freq_base: float,
                      rope_freq_scale: float, yarn_ext_factor: float, yarn_attn_factor: float,
                      yarn_beta_fast: float, yarn_beta_slow: float, yarn_orig_ctx: int, offload_kqv: bool,
                      op_offload: bool | None, swa_full: bool | None, no_perf: bool, type_k: int | None,
                      type_v: int | None, lora_path: str | None, lora_scale: float,
                      attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED, n_rs_seq: int | None = None) -> None:
        if vocab_only:
            self._ctx = VocabOnlyContext(self._model, n_ctx or self._model.n_ctx_train(), min(n_batch, n_ctx or n_batch))
        else:
            fa = flash_attn_type(flash_attn)
            if n_seq_max is None:
                n_seq_max = 16 if embedding else 1
            if kv_unified is None and n_seq_max > 1:
                kv_unified = True
            self._ctx = LlamaContext(
                self._model, n_ctx=int(n_ctx), n_batch=int(n_batch), n_ubatch=int(n_ubatch),
                n_seq_max=int(n_seq_max), n_threads=self.n_threads, n_threads_batch=self.n_threads_batch,
                rope_scaling_type=rope_scaling_type, pooling_type=int(pooling_type),
                rope_freq_base=float(rope_freq_base), rope_freq_scale=float(rope_freq_scale),
                yarn_ext_factor=float(yarn_ext_factor), yarn_attn_factor=float(yarn_attn_factor),
                yarn_beta_fast=float(yarn_beta_fast), yarn_beta_slow=float(yarn_beta_slow),
                yarn_orig_ctx=int(yarn_orig_ctx), embeddings=bool(embedding), offload_kqv=bool(offload_kqv),
                flash_attn_type=fa, op_offload=op_offload, swa_full=swa_full, kv_unified=kv_unified,
                no_perf=bool(no_perf), type_k=type_k, type_v=type_v, n_rs_seq=n_rs_seq,
                attention_type=None if attention_type == LLAMA_ATTENTION_TYPE_UNSPECIFIED else int(attention_type),
            )
            if lora_path:
                self._lora = LlamaLoraAdapter(self._model, lora_path)
                self._ctx.set_adapters_lora([self._lora], [lora_scale])

    # ------------------------------------------------------------------------------------------
    # lifetime
    # ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the context, adapter and model now (idempotent; waits for a running call)."""
        guard = getattr(self, "_guard", None)
        if guard is None:  # __init__ failed before the guard existed
            return
        with guard.lock:
            guard.invalidate()
            self._free()

    def _free(self) -> None:
        seq = getattr(self, "sequence", None)
        if seq is not None:
            seq.close()
        for attr in ("_ctx", "_lora", "_model"):
            obj = getattr(self, attr, None)
            if obj is not None:
                obj.close()
                setattr(self, attr, None)

    def __enter__(self) -> Llama:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def native_model(self) -> LlamaModel:
        """The loaded :class:`~llama_cpp._core.model.LlamaModel` (vocabulary, tokenizer, metadata) for code
        built on this ``Llama`` (the server, chat handlers); :class:`ClosedError` once closed."""
        if self._model is None:
            raise ClosedError("this Llama is closed; create a new one")
        return self._model

    @property
    def draft_model(self) -> LlamaDraftModel | None:
        """Upstream's draft model object (None: no draft); assigning one rebuilds the speculative decoder."""
        return self._draft_model

    @draft_model.setter
    def draft_model(self, value: LlamaDraftModel | None) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"draft_model must be a LlamaDraftModel (a callable), got {type(value).__name__}")
        with self._guard.call():
            if value is self._draft_model:
                return
            self._draft_model = value
            if self._model is None or not self._spec_runs:
                return  # closed, or a context the engine cannot run over (warned at construction)
            cfg = self._spec_config()
            self.sequence.replace_spec(None)
            if cfg is not None:
                spec = self._make_spec(cfg)
                spec.invalidate()  # the memory holds this Llama's tokens, not the new decoder's history
                self.sequence.replace_spec(spec)

    def _spec_config(self) -> _spec.SpecConfig | None:
        """The configuration the decoder runs: ``speculative`` plus the row of ``draft_model``; None: none."""
        sp = self.speculative
        cfg = sp if sp is not None and sp.enabled and not self._vocab_only else None
        if self._draft_model is not None and self._spec_runs:
            cfg = _spec.with_draft_model(cfg, self._draft_model)
        return cfg

    def _make_spec(self, cfg: _spec.SpecConfig) -> _spec.SpeculativeDecoder:
        """The decoder for ``cfg`` over this context (the media chat handler's when it has one)."""
        kw = _spec.draft_model_kwargs(self._draft_model if self._spec_runs else None)
        media = self._media_spec
        dec = media(self._model, cfg, target=self._ctx, **kw) if media is not None else None
        return dec if dec is not None else _spec.make_decoder(self._model, cfg, target=self._ctx, **kw)

    def native_context(self) -> LlamaContext:
        """The :class:`~llama_cpp._core.context.LlamaContext` (KV cache, decode, state) for code built on this
        ``Llama``; :class:`ContextError` for a ``vocab_only`` model."""
        self.native_model()
        ctx = self._ctx
        if not isinstance(ctx, LlamaContext):
            raise ContextError("this model was opened with vocab_only=True: it can tokenize but not generate "
                               "or embed; open it again without vocab_only")
        return self._ctx

    # ------------------------------------------------------------------------------------------
    # properties (llama-cpp-python names)
    # ------------------------------------------------------------------------------------------
    @property
    def model(self) -> Any:  # upstream's llama_model_p: the pointer, answering LlamaModel's attributes
        return self.native_model().pointer()

    @property
    def ctx(self) -> Any:  # upstream's llama_context_p: the pointer, answering LlamaContext's attributes
        return self.native_context().pointer()

    @property
    def metadata(self) -> dict[str, str]:
        return self.native_model().metadata

    @property
    def input_ids(self) -> np.ndarray:
        """The tokens in the context's memory (``np.intc``; upstream's buffer sliced to ``n_tokens``)."""
        return np.asarray(self.sequence.tokens, dtype=np.intc)

    # upstream's semi-private names, which code written against it (guidance, outlines...) reads
    @property
    def _input_ids(self) -> list[int]:
        return self.sequence.tokens

    @property
    def _seed(self) -> int:
        return self.sequence.seed

    @property
    def _batch(self) -> LlamaBatch | None:
        return self.sequence.batch

    @property
    def n_tokens(self) -> int:
        return len(self.sequence.tokens)

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        """Keep only the first ``n`` evaluated tokens (upstream code rewinds with ``llm.n_tokens = k``)."""
        with self._guard.call():
            if int(n) != len(self.sequence.tokens):
                self.native_context()
            self.sequence.rewind(int(n), self.logits_all)

    @property
    def n_batch(self) -> int:
        self.native_model()
        return self._ctx.n_batch()  # type: ignore[union-attr]

    @property
    def scores(self) -> np.ndarray:
        """The logits rows the context holds (``np.single``, shape ``(rows, n_vocab)``): the last
        evaluated token's row, or with ``logits_all`` every row of the last evaluated batch.
        Upstream keeps an ``(n_ctx, n_vocab)`` buffer; llama.cpp only keeps the last batch's."""
        self.native_model()
        return self.sequence.logits_rows()

    @property
    def _scores(self) -> np.ndarray:
        return self.scores

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self.sequence.tokens, maxlen=self.n_ctx())

    @property
    def eval_logits(self) -> deque[list[float]]:
        return deque(self.scores.tolist(), maxlen=self.n_ctx() if self.logits_all else 1)

    @property
    def context_params(self) -> Any:
        """A copy of the ``llama_context_params`` the context was created with, sizes as llama.cpp
        resolved them (defaults for a vocab-only model)."""
        ctx = self._ctx
        if isinstance(ctx, LlamaContext):
            cp = type(ctx.params).from_buffer_copy(ctx.params)
            cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = ctx.n_ctx(), ctx.n_batch(), ctx.n_ubatch(), ctx.n_seq_max()
            return cp
        cp = self.native_model().bindings.llama_context_default_params()
        if ctx is not None:
            cp.n_ctx, cp.n_batch = ctx.n_ctx(), ctx.n_batch()
        return cp

    @property
    def model_params(self) -> Any:
        """A ``llama_model_params`` with the values the model was loaded with."""
        m = self.native_model()
        a = self._init_args
        mp = m.bindings.llama_model_default_params()
        mp.n_gpu_layers = int(a["n_gpu_layers"])
        mp.split_mode = int(a["split_mode"])
        mp.main_gpu = int(a["main_gpu"])
        mp.vocab_only = bool(a["vocab_only"])
        return mp

    def n_ctx(self) -> int:
        self.native_model()
        if isinstance(self._ctx, VocabOnlyContext):
            return self._ctx.n_ctx()
        return self.native_context().n_ctx()

    def n_embd(self) -> int:
        return self.native_model().n_embd()

    def n_vocab(self) -> int:
        return self.native_model().n_vocab

    def token_bos(self) -> int:
        return self.native_model().token_bos()

    def token_eos(self) -> int:
        return self.native_model().token_eos()

    def token_nl(self) -> int:
        return self.native_model().token_nl()

    def pooling_type(self) -> int:
        return self.native_context().pooling_type()

    def tokenizer(self) -> BaseLlamaTokenizer:
        """The tokenizer ``tokenize``/``detokenize`` use (the vocabulary's, or ``Llama(tokenizer=...)``)."""
        self.native_model()
        return self.tokenizer_

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return longest_token_prefix(a, b)

    @serialized()
    def set_seed(self, seed: int) -> None:
        self.sequence.seed = int(seed)

    def set_cache(self, cache: BaseLlamaCache | None) -> None:
        """Use ``cache`` for prompt states (None turns caching off); see :mod:`llama_cpp.llama_cache`."""
        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise TypeError(f"cache must be a BaseLlamaCache (LlamaRAMCache, LlamaDiskCache), got {type(cache).__name__}")
        self.cache = cache

    # ------------------------------------------------------------------------------------------
    # tokens
    # ------------------------------------------------------------------------------------------
    @serialized(during_stream=True)
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Tokenize UTF-8 bytes; ``add_bos`` adds the model's BOS/EOS as configured, ``special``
        parses control-token text such as ``<|im_end|>``."""
        self.native_model()
        return self.tokenizer_.tokenize(text, add_bos, special)

    @serialized(during_stream=True)
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """Token ids back to UTF-8 bytes. The first piece keeps its leading space unless the tokens
        start with BOS, so detokenizing one token at a time (with or without ``prev_tokens``, the
        tokens before them) joins into the same text."""
        self.native_model()
        return self.tokenizer_.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    # ------------------------------------------------------------------------------------------
    # evaluation
    # ------------------------------------------------------------------------------------------
    @serialized()
    def reset(self) -> None:
        """Forget the evaluated tokens and clear the KV cache."""
        self.sequence.clear()

    @serialized()
    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` after those already in the context (llama-cpp-python's ``eval``)."""
        self.native_context()
        self.sequence.extend([int(t) for t in tokens], self.logits_all)

    # ------------------------------------------------------------------------------------------
    # sampling
    # ------------------------------------------------------------------------------------------
    def make_sampler(self, *, temperature: float, top_k: int, top_p: float, min_p: float, typical_p: float,
                     repeat_penalty: float, frequency_penalty: float, presence_penalty: float,
                     penalty_last_n: int | None, mirostat_mode: int, mirostat_tau: float,
                     mirostat_eta: float, seed: int | None,
                     logit_bias: dict[Any, float] | None) -> LlamaSampler:
        """A sampler chain with ``create_completion``'s sampling keywords, under this ``Llama``'s sampling
        convention (the server's slots sample each request with one)."""
        return _sampling.sampler_chain(
            self.native_model(), temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            typical_p=typical_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            penalty_last_n=_checks.penalty_last_n(
                self.last_n_tokens_size if penalty_last_n is None else penalty_last_n, self.native_context().n_ctx()),
            mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            seed=self.sequence.seed if seed is None else seed, logit_bias=logit_bias, convention=self.sampling_convention)

    @serialized()
    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: StoppingCriteriaList | StoppingCriteria | None = None,
        logits_processor: LogitsProcessorList | LogitsProcessor | None = None,
        grammar: str | LlamaGrammar | None = None,
        logit_bias: dict[int, float] | None = None,
        penalty_last_n: int | None = None,
    ) -> T.CreateCompletionResponse | Iterator[T.CreateCompletionStreamResponse]:
        """Complete ``prompt`` (text or token ids); returns an OpenAI-style dict, or an iterator of
        chunks with ``stream=True``.

        ``logits_processor(input_ids, scores) -> scores`` runs before the grammar and the sampler on
        every token (``input_ids``: prompt and generated tokens, ``np.intc``; ``scores``: a copy of
        the logits row, ``np.single``). ``stopping_criteria(input_ids, logits) -> bool`` sees each
        new token at the end of ``input_ids``; true ends the completion before that token
        (``finish_reason`` ``stop``). Without ``seed`` the object's seed advances per call.
        """
        _boundary.check_args(locals())
        return _completion.create_completion(self, locals(), self._guard.stream)  # type: ignore[no-any-return]

    __call__ = create_completion

    @serialized()
    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: LogitsProcessorList | LogitsProcessor | None = None,
                 stopping_criteria: StoppingCriteriaList | StoppingCriteria | None = None,
                 grammar: LlamaGrammar | None = None, seed: int | None = None,
                 logit_bias: dict[int, float] | None = None) -> Iterator[int]:
        """Yield sampled token ids after ``tokens`` until the context is full (EOG tokens included).

        The longest prefix of ``tokens`` already in the context is reused (an exact match with its
        logits evaluates nothing); ``reset=False`` continues after the tokens already evaluated.
        ``logits_processor``/``stopping_criteria`` as in :meth:`create_completion`. As upstream,
        ``send(more_tokens)`` instead of ``next()`` appends ``more_tokens`` after the token just
        yielded and returns the token sampled after them (the penalties see them; a grammar does not).
        """
        return _completion.generate(self, locals(), self._guard.stream)

    @serialized()
    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
               mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: LogitsProcessorList | LogitsProcessor | None = None,
               grammar: LlamaGrammar | None = None, idx: int | None = None, seed: int | None = None,
               logit_bias: dict[int, float] | None = None) -> int:
        """Sample one token after ``eval``: from the last evaluated position, or ``idx`` (a position
        in ``input_ids`` whose logits the last batch kept, e.g. any with ``logits_all``)."""
        return _completion.sample(self, locals())

    # ------------------------------------------------------------------------------------------
    # chat
    # ------------------------------------------------------------------------------------------
    def chat_formatter(self) -> _chat.Jinja2ChatFormatter:
        """The formatter chat renders prompts with where no handler does: ``chat_format``'s, else the
        model's own template, else llama-2's (made once)."""
        if self._formatter is None:
            self._formatter = _template_chat.chat_formatter_for(self.native_model(), self.chat_format)
        return self._formatter

    @serialized()
    def create_chat_completion(
        self,
        messages: list[T.ChatCompletionRequestMessage],
        functions: list[dict[str, Any]] | None = None,
        function_call: Any = None,
        tools: list[T.ChatCompletionTool] | None = None,
        tool_choice: T.ChatCompletionToolChoiceOption | None = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        response_format: T.ChatCompletionRequestResponseFormat | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: LogitsProcessorList | LogitsProcessor | None = None,
        grammar: str | LlamaGrammar | None = None,
        logit_bias: dict[int, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
        special_in_content: bool = False,
        stopping_criteria: StoppingCriteriaList | StoppingCriteria | None = None,
        chat_template_kwargs: dict[str, Any] | None = None, reasoning_format: str | None = None,
        reasoning_budget: int | None = None, parallel_tool_calls: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> T.CreateChatCompletionResponse | Iterator[T.CreateChatCompletionStreamResponse]:
        """Chat with the model's own template (sandboxed Jinja) or the named ``chat_format``; with tools
        and a template that knows them, through llama.cpp's chat layer (``tool_calls`` parsed). Special-
        token text in message content is tokenized as text (no forged turns) unless ``special_in_content``.
        ``parallel_tool_calls`` and ``reasoning_effort`` (OpenAI's) reach the template through that layer."""
        _boundary.check_args(locals(), {"logprobs": "bool?"})
        return _template_chat.create_chat_completion(self, locals())  # type: ignore[no-any-return]

    # ------------------------------------------------------------------------------------------
    # embeddings
    # ------------------------------------------------------------------------------------------
    @serialized()
    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """Embeddings as lists of floats (llama-cpp-python's shape; L2-normalised with ``normalize``).

        With pooling NONE each input gives one row per token.
        """
        ctx = self.native_context()
        if not self._embedding:
            raise LlamaError("this Llama was created without embedding=True: create Llama(..., embedding=True)")
        inputs = [input] if isinstance(input, str) else list(input)
        m = self._model
        token_lists = [m.tokenize(s.encode("utf-8"), add_special=True, parse_special=True) for s in inputs]
        self.reset()
        rows, counts = embed_token_lists(ctx, m, token_lists, normalize=2 if normalize else -1, truncate=truncate)
        self.sequence.tokens.clear()
        ctx.memory_clear(True)
        if ctx.pooling_type() == LLAMA_POOLING_TYPE_NONE:
            out: Any = [r.tolist() for r in rows]
        else:
            out = np.asarray(rows).tolist()
        if isinstance(input, str):
            out = out[0]
        total = int(sum(counts))
        return (out, total) if return_count else out

    @serialized()
    def create_embedding(self, input: str | list[str], model: str | None = None) -> T.CreateEmbeddingResponse:
        """OpenAI-style embedding response."""
        inputs = [input] if isinstance(input, str) else list(input)
        embeds, total = self.embed(inputs, return_count=True)
        return {"object": "list",
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
                "model": model or self.model_path,
                "usage": {"prompt_tokens": total, "total_tokens": total}}

    # ------------------------------------------------------------------------------------------
    # state
    # ------------------------------------------------------------------------------------------
    @serialized()
    def save_state(self) -> LlamaState:
        """Snapshot the KV cache and token history (``scores`` holds the last logits row)."""
        return _snapshot.save_state(self)

    @serialized()
    def load_state(self, state: LlamaState) -> None:
        """Restore a :meth:`save_state` snapshot (also one from a prompt cache).

        llama.cpp's state holds the memory, not the logits: the last token is evaluated again (for
        a recurrent or hybrid model only once its logits are needed, since that rebuilds the memory,
        and a prompt that extends the state evaluates only the new tokens).
        """
        _snapshot.load_state(self, state)

    # ------------------------------------------------------------------------------------------
    # compatibility: pickling, Hugging Face, OpenAI types
    # ------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The constructor's arguments (upstream pickles a Llama as the recipe to load it again)."""
        state = dict(self._init_args)
        state["seed"] = self.sequence.seed
        state["chat_format"], state["draft_model"] = self.chat_format, self._draft_model
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None,
                        local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Llama:
        """Download ``filename`` (a name or glob pattern) from the Hugging Face repository ``repo_id``
        with ``huggingface_hub`` and load it; ``additional_files`` (patterns too) are fetched beside
        it (the other shards of a split GGUF). Keyword arguments go to :class:`Llama`."""
        from ._compat.hub import download_model

        path = download_model(repo_id, filename, additional_files=additional_files, local_dir=local_dir,
                              local_dir_use_symlinks=local_dir_use_symlinks, cache_dir=cache_dir)
        return cls(model_path=path, **kwargs)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`create_chat_completion` as ``openai`` objects (``ChatCompletion``, or an iterator of
        ``ChatCompletionChunk`` with ``stream=True``); needs ``pip install openai``."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package: pip install openai") from None
        stream = kwargs.get("stream", False)
        if not isinstance(stream, bool):
            raise TypeError(f"stream must be a bool, got {type(stream).__name__}")
        result = self.create_chat_completion(*args, **kwargs)
        if stream:
            return (ChatCompletionChunk(**chunk) for chunk in result)  # type: ignore[union-attr]
        return ChatCompletion(**result)  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def logits_to_logprobs(logits: np.ndarray, axis: int = -1) -> np.ndarray:
        x = np.asarray(logits, dtype=np.float64)
        mx = np.max(x, axis=axis, keepdims=True)
        return (x - mx - np.log(np.sum(np.exp(x - mx), axis=axis, keepdims=True))).astype(np.float32)

    def __repr__(self) -> str:
        state = "closed" if self._model is None or self._ctx is None else f"n_ctx={self._ctx.n_ctx()}"
        return f"Llama({self.model_path!r}, {state})"


class LlamaWorker(_isolation.InWorker, Llama):
    """A :class:`Llama` whose model runs in a worker process it owns: what ``Llama(..., rpc_servers=...)``
    returns, or made directly for any model (``LlamaWorker(path, **llama_kwargs)``).

    Generation, chat (streams too), embeddings, tokenizer and state calls are forwarded (their
    arguments and results must pickle); one call at a time, as a ``Llama``'s, and while a stream is
    open every other call but ``tokenize``/``detokenize`` raises :class:`BusyError`. When the
    worker dies (llama.cpp's RPC client aborts it when a server is lost) the call raises
    :class:`WorkerLostError` naming the unreachable servers, as does every later call, until
    :meth:`reload`. In-process handles (``model``, ``ctx``, ``native_model()``...) raise
    :class:`NotInProcessError`. Pickling re-creates it from its arguments (a new worker).
    """

    _factory = Llama


__all__ = ["BaseLlamaCache", "BaseLlamaTokenizer", "Llama", "LlamaCache", "LlamaDiskCache", "LlamaDraftModel",
           "LlamaGrammar", "LlamaHFTokenizer", "LlamaPromptLookupDecoding", "LlamaRAMCache", "LlamaState",
           "LlamaTokenizer", "LogitsProcessor", "LogitsProcessorList", "MinTokensLogitsProcessor",
           "StoppingCriteria", "StoppingCriteriaList", "VocabOnlyContext", "LlamaWorker"]
__all__ += T.__all__  # noqa: PLE0605 (upstream's llama module re-exports its types)

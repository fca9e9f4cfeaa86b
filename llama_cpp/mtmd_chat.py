"""Multimodal chat: OpenAI-style messages with images/audio, rendered by the model's chat template.

The flow, per request:

1. every message's content is flattened to text with one media marker where each image/audio
   part was (``image_url`` parts take ``data:`` URLs, ``file://`` URLs and local paths; nothing is
   ever fetched from the network), and the model's chat template (sandboxed Jinja, see
   :mod:`llama_cpp.llama_chat_format`) renders the conversation;
2. mtmd tokenizes the prompt into text and media chunks; media chunks are encoded by the
   projector and decoded at the positions mtmd reports (M-RoPE sections where the model uses
   them, causal attention off for projectors that ask for it);
3. tokens are sampled and streamed as OpenAI chat chunks by the shared generation engine
   (:mod:`llama_cpp._generation.loop`), as for text-only ``Llama``.

With tools (where the model's template knows them), a ``response_format`` or llama.cpp's chat options
(``chat_template_kwargs``, ``reasoning_format``, ``reasoning_budget``, ``reasoning_effort``,
``parallel_tool_calls``), a chat that renders with the model's own template goes through llama.cpp's
chat layer instead, as ``Llama.create_chat_completion`` does (one implementation:
:class:`~llama_cpp._chat.native_completion.NativeChatHandler` over a :class:`MediaChatTarget`): the
template renders the tools, the answer is sampled under the format's lazy grammar and reasoning
budget, and the output comes back parsed (``message.tool_calls``, ``reasoning_content``; streamed, the
``delta.tool_calls``).

With ``speculative=SpecConfig(...)`` the prompt goes through a speculative decoder that takes
media chunks. ``draft-mtp``: :class:`MultimodalMTPDecoder` extends the text MTP engine
(:class:`~llama_cpp.speculative.MTPDecoder`) with media spans: the image rows are decoded on the
target at their mtmd positions, and the NextN drafter's draft context is caught up over the same
positions with the target's hidden states shifted by one (``h_{p-1}`` at position ``p``,
:class:`MediaNextNDrafter`), so drafting continues right after the image. The n-gram types and ``draft-simple``:
:class:`MultimodalDraftDecoder` extends the token-drafter engine
(:class:`~llama_cpp.speculative.engine.DraftDecoder`) the same way, as llama.cpp's server speculates on
media prompts: the n-gram drafters are told the text tokens only, a draft model mirrors the
target's memory (media rows at the target's positions), a DFlash or DSpark draft gets the
target's layer features of media rows that take a position each (:class:`MediaFeatureDrafter`).
In both, the history holds :data:`MEDIA_TOKEN` at each media position, so rollback, the room left
in ``n_ctx`` and statistics are the text engines'. ``draft-eagle3`` is refused.

``Llama(model, chat_handler=MTMDChatHandler(mmproj), speculative=SpecConfig(...))`` builds its
decoder through the handler (:meth:`MTMDChatHandler.speculative_decoder`), so the same decoder
serves the Llama's text prompts and the handler's media chats (the server's image chat included).

Media rows on the MTP draft: llama.cpp's extended batch cannot yet carry both a media embedding and
a hidden state for one entry (``llama_batch_ext_set_embd_state`` is a stub), and for an
embedding-only entry the MTP graph reads the same row as token embedding and hidden state. The
draft therefore sees ``h_{p-1}`` in both slots over a media span. This only affects how often
drafts are accepted near the image; the emitted tokens are always the target's (greedy output is
identical with and without MTP).
"""

# ruff: noqa: F401 (speculation over media and the evaluation helpers live in _multimodal; re-exported)

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._chat import base as _chat
from ._chat.native_chat import available as _chat_layer_available
from ._chat.native_completion import NativeChatHandler, check_chat_options
from ._compat.hooks import HookedSource, TokenHooks
from ._core.context import LlamaBatchExtNative, LlamaContext
from ._core.model import LlamaModel
from ._core.ownership import unwrap
from ._core.sampler import LlamaSampler
from ._errors import ClosedError, ContextOverflowError, MultimodalError, ParameterError, SpeculativeError
from ._generation import loop as _gen
from ._generation import responses as _responses
from ._generation import sampling as _sampling
from ._multimodal.decode import eval_chunks
from ._multimodal.speculation import (
    MEDIA_REFUSED_TYPES,
    MEDIA_TOKEN,
    MediaDraftModel,
    MediaFeatureDrafter,
    MediaHistory,
    MediaNextNDrafter,
    MediaSpan,
    MediaSpeculationError,
    MultimodalDraftDecoder,
    MultimodalMTPDecoder,
    TextHistoryDrafter,
    check_media_prompt,
    check_media_types,
    make_media_decoder,
    media_drafters,
)
from ._safety.call_guard import CallGuard, serialized
from ._safety.chat_tokens import message_texts, prompt_pieces
from ._safety.media_policy import MediaPolicy
from .llama_cpp import LLAMA_DEFAULT_SEED
from .mtmd import Audio, Chunk, Chunks, Image, MarkerPrompt, MTMDContext, Text
from .speculative import (
    MTPDecoder,
    SpecConfig,
    SpeculativeStats,
    SpeculativeType,
    check_model_file,
    draft_decoder_parts,
)
from .speculative.engine import DraftDecoder, close_drafters, tell_drafters

log = logging.getLogger("llama_cpp.mtmd_chat")

_AUDIO_FORMATS = {"wav", "mp3", "flac"}


# --------------------------------------------------------------------------------------------
# messages -> prompt + media
# --------------------------------------------------------------------------------------------

_NO_LOCAL_FILES = MediaPolicy()  # data: URLs only, until a caller names media_dirs


def image_from_url(url: Any, where: str = "image_url", policy: MediaPolicy = _NO_LOCAL_FILES) -> Image:
    """An :class:`Image` from an OpenAI ``image_url``: a ``data:`` URL, or a ``file://`` URL or local
    path inside one of ``policy``'s allowed directories (none by default); never fetched from the
    network. Size and pixel limits are checked before decoding."""
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise MultimodalError(f"{where}: expected a URL string or {{'url': ...}}, got {type(url).__name__}")
    return Image(policy.resolve(url, where))


def image_from_part(src: Any, where: str, policy: MediaPolicy = _NO_LOCAL_FILES) -> Image:
    """The image of an ``image``/``input_image`` part. An :class:`Image` or pixel array built by the
    calling program is used as given; a string or path is a URL or a local file, resolved under
    ``policy`` like ``image_url`` (a request cannot name an arbitrary file); bytes get the same
    size and pixel limits."""
    if isinstance(src, Image):
        return src
    if isinstance(src, np.ndarray):
        return Image(src)
    if isinstance(src, (str, dict)):
        return image_from_url(src, where, policy)
    if isinstance(src, os.PathLike):
        return image_from_url(os.fspath(src), where, policy)
    if isinstance(src, (bytes, bytearray, memoryview)):
        return Image(policy.check_bytes(bytes(src), where))
    raise MultimodalError(f"{where}: an image part needs a data: URL, an allowed path, image bytes or an Image, "
                          f"got {type(src).__name__}")


def _audio_part(part: dict, where: str) -> Audio:
    spec = part.get("input_audio")
    if not isinstance(spec, dict) or "data" not in spec:
        raise MultimodalError(f"{where}: input_audio needs {{'data': <base64>, 'format': 'wav'|'mp3'|'flac'}}")
    fmt = str(spec.get("format", "wav")).lower()
    if fmt not in _AUDIO_FORMATS:
        raise MultimodalError(f"{where}: audio format {fmt!r} is not supported; use one of {sorted(_AUDIO_FORMATS)}")
    data = spec["data"]
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise MultimodalError(f"{where}: input_audio.data is not valid base64 ({e})") from None
    return Audio(data)


def media_parts(pieces: Sequence[tuple[str, bool]], media: Sequence[Image | Audio], marker: str) -> list[Any]:
    """``(text, parse_special)`` pieces of a marker prompt as mtmd parts: each marker becomes its
    media item, in order, and each text keeps its own special-token parsing."""
    parts: list[Any] = []
    queue = list(media)
    for text, special in pieces:
        for k, seg in enumerate(text.split(marker)):
            if k:
                parts.append(queue.pop(0))
            if seg:
                parts.append(Text(seg, special))
    if queue:
        raise MultimodalError(f"{len(queue)} media item(s) have no marker in the prompt")
    return parts


def content_parts(content: Sequence[Any], i: int) -> Iterator[tuple[str, dict]]:
    """``(where, part)`` for each part of message ``i``'s content list; a bare string is a text part."""
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, dict):
            raise MultimodalError(f"{where}: a content part must be a dict, got {type(part).__name__}")
        yield where, part


def flatten_messages(messages: Sequence[dict], marker: str, policy: MediaPolicy = _NO_LOCAL_FILES,
                     ) -> tuple[list[dict], list[Image | Audio]]:
    """Messages with text-only contents (media parts replaced by ``marker``) and the media in order;
    ``image_url`` references are resolved under ``policy``."""
    out: list[dict] = []
    media: list[Image | Audio] = []
    for i, msg in enumerate(_chat.validate_messages(list(messages))):
        content = msg.get("content")
        if isinstance(content, list):
            pieces = []
            for where, part in content_parts(content, i):
                kind = part.get("type")
                if kind == "text":
                    text = str(part.get("text", ""))
                    if marker in text:
                        raise MultimodalError(f"{where}: the text contains the media marker {marker!r}; "
                                              "remove it or choose another media_marker")
                    pieces.append(text)
                elif kind == "image_url":
                    media.append(image_from_url(part.get("image_url"), where, policy))
                    pieces.append(marker)
                elif kind in ("image", "input_image"):
                    media.append(image_from_part(part.get("image", part.get("image_url")), where, policy))
                    pieces.append(marker)
                elif kind == "input_audio":
                    media.append(_audio_part(part, where))
                    pieces.append(marker)
                else:
                    raise MultimodalError(f"{where}: unsupported content part type {kind!r} (use text, "
                                          "image_url or input_audio)")
            msg = dict(msg)
            msg["content"] = "".join(pieces)
        elif isinstance(content, str) and marker in content:
            raise MultimodalError(f"messages[{i}].content contains the media marker {marker!r}; "
                                  "pass media as image_url/input_audio parts")
        out.append(msg)
    return out, media


# --------------------------------------------------------------------------------------------
# the chat engine
# --------------------------------------------------------------------------------------------

class MultimodalChatEngine:
    """Chat completions over a model, a projector and a context (or a speculative decoder) it borrows.

    Generation runs the shared engine (:mod:`llama_cpp._generation.loop`): the conversation is
    evaluated as mtmd chunks, then tokens come from :func:`~llama_cpp._generation.loop.decode_loop` (or
    :func:`~llama_cpp._generation.loop.speculative_loop` with a :class:`MultimodalMTPDecoder` or
    :class:`MultimodalDraftDecoder`) and are streamed as chat chunks.
    Every request re-evaluates the conversation (media prompts are not prefix-cached).

    Thread safety: as ``Llama``'s (:mod:`llama_cpp._safety.call_guard`): calls run one at a time, an open
    stream makes other calls raise ``BusyError``, ``close()`` waits for the token being computed.
    """

    def __init__(self, model: LlamaModel, mtmd: MTMDContext, formatter: _chat.Jinja2ChatFormatter, *,
                 context: LlamaContext | None = None,
                 decoder: MultimodalMTPDecoder | MultimodalDraftDecoder | None = None,
                 seed: int = LLAMA_DEFAULT_SEED, media_dirs: Sequence[str | os.PathLike[str]] | None = None,
                 chat_layer: NativeChatHandler | None = None) -> None:
        if (context is None) == (decoder is None):
            raise ValueError("give a context or a speculative decoder (exactly one)")
        self._guard = CallGuard(type(self).__name__)
        self.model = model
        self._mctx: MTMDContext | None = mtmd
        self._ctx = context
        self._spec = decoder
        self._formatter = formatter
        self.media_policy = MediaPolicy.with_dirs(media_dirs)
        self.seed = int(seed)
        self.chat_layer = chat_layer  # llama.cpp's chat layer over the model's own template (None: not this chat)
        self.last_speculative_stats: SpeculativeStats | None = None

    @property
    def mtmd(self) -> MTMDContext:
        if self._mctx is None:
            raise ClosedError(f"this {type(self).__name__} is closed; create a new one")
        return self._mctx

    # -- prompt ---------------------------------------------------------------------------------
    def render(self, messages: Sequence[dict]) -> tuple[str, list[Image | Audio], list[str], bool]:
        """The rendered prompt, its media, the template's stop strings and whether it has BOS."""
        marker = self.mtmd.marker
        msgs, media = flatten_messages(messages, marker, self.media_policy)
        res = self._formatter(messages=msgs)
        if res.prompt.count(marker) != len(media):
            raise MultimodalError(
                f"the chat template kept {res.prompt.count(marker)} of {len(media)} media markers (it drops or "
                "rewrites some message contents): use a template that renders every message's content")
        return res.prompt, media, list(res.stop), bool(res.added_special)

    def tokenize_messages(self, messages: Sequence[dict]) -> tuple[Chunks, list[str]]:
        """The prompt's chunks (message text parsed without special tokens) and the stop strings."""
        prompt, media, stops, has_bos = self.render(messages)
        marker = self.mtmd.marker

        def render(ms: list[Any]) -> str:  # the same template over messages whose texts are sentinels
            return self._formatter(messages=flatten_messages(ms, marker, self.media_policy)[0]).prompt

        return self.chat_prompt(media, prompt, messages, render=render, add_special=not has_bos), stops

    # -- generation -----------------------------------------------------------------------------
    @serialized()
    def generate_tokens(self, messages: Sequence[dict], *, max_tokens: int | None = None,
                        sampler: LlamaSampler | None = None, **sampling: Any) -> Iterator[int]:
        """Yield generated token ids (the end-of-generation token included, as the last one)."""
        return self._guard.stream(self._token_ids(messages, max_tokens, sampler, sampling))

    def _token_ids(self, messages: Sequence[dict], max_tokens: int | None, sampler: LlamaSampler | None,
                   sampling: dict[str, Any]) -> Iterator[int]:
        mctx = self.mtmd
        chunks, _ = self.tokenize_messages(messages)
        try:
            chain = sampler or _sampling.sampler_chain(self.model, seed=sampling.pop("seed", self.seed), **sampling)
        except BaseException:
            chunks.close()
            raise
        try:
            pick = _sampling.token_picker(self.model, chain, None, False)
            for tok, _ in self._tokens(mctx, chunks, pick, max_tokens):
                yield tok
        finally:
            chunks.close()
            if sampler is None:
                chain.close()

    def _tokens(self, mctx: MTMDContext, chunks: Chunks, pick: _sampling.Pick,
                max_tokens: int | None) -> Iterator[_gen.TokenRow]:
        if self._spec is not None:
            dec = self._spec
            dec.stats.reset()
            dec.prefill_chunks(mctx, chunks)
            self.last_speculative_stats = dec.stats
            # n_ctx: positions left to the history; the pending token takes one
            yield from _gen.speculative_loop(dec, pick, _limit(dec.n_ctx - dec.n_past - 1, max_tokens))
            return
        ctx = self._ctx
        if ctx is None:
            raise ClosedError(f"this {type(self).__name__} is closed; create a new one")
        ctx.memory_clear(True)
        n_past = eval_chunks(mctx, ctx, chunks)
        n_cells = n_past + chunks.n_tokens - chunks.n_pos  # M-RoPE image rows share positions
        step = _gen.TokenStep(ctx)
        try:
            yield from _gen.decode_loop(self.model, step, pick, n_past, _limit(ctx.n_ctx() - n_cells, max_tokens))
        finally:
            step.close()

    def chat_prompt(self, media: Sequence[Image | Audio], text: str, messages: Sequence[dict], *,
                    special_in_content: bool = False, render: Callable[[list[Any]], str] | None = None,
                    add_special: bool = True) -> Chunks:
        """The chunks of a prompt ``text`` rendered from ``messages`` (text-only contents, a media marker
        for each of ``media``): message content parsed without special tokens unless
        ``special_in_content`` (``render``: the same rendering of other messages, for exact spans)."""
        pieces = None
        if not special_in_content and render is not None:
            pieces = prompt_pieces(self.model, text, message_texts(messages), render=render, messages=messages)
        item: Any = MarkerPrompt(text, list(media)) if pieces is None else media_parts(pieces, media, self.mtmd.marker)
        return self.mtmd.tokenize(item, add_special=add_special, parse_special=True, where="prompt")

    def completion(self, chunks: Chunks, stops: Sequence[str], *, max_tokens: int | None = None,
                   temperature: float = 0.2, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                   typical_p: float = 1.0, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                   presence_penalty: float = 0.0, seed: int | None = None, model: str | None = None,
                   grammar: Any = None, logits_processor: Any = None,
                   stopping_criteria: Any = None) -> Iterator[dict[str, Any]]:
        """``text_completion`` chunks of the answer to ``chunks`` (which it closes), sampled under
        ``grammar`` (an :class:`~llama_cpp._generation.sampling.OutputConstraint`, such as a chat answer's)
        and ``logits_processor``, ended by ``stopping_criteria``; the sampler is made now."""
        mctx = self.mtmd
        try:
            chain = _sampling.sampler_chain(
                self.model, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty, seed=self.seed if seed is None else seed)
        except BaseException:
            chunks.close()
            raise
        hooks = None
        if logits_processor is not None or stopping_criteria is not None:  # they see MEDIA_TOKEN at media rows
            history = [np.full(c.n_tokens, MEDIA_TOKEN, np.intc) if c.tokens is None else c.tokens for c in chunks]
            hooks = TokenHooks.build(np.concatenate(history) if history else [], self.model.n_vocab,
                                     logits_processor, stopping_criteria)

        def gen() -> Iterator[dict[str, Any]]:
            constraint = None
            try:
                constraint = _sampling.grammar_sampler(self.model, grammar)
                pick = _sampling.token_picker(self.model, chain, constraint, False, hooks)
                rows: Any = self._tokens(mctx, chunks, pick, max_tokens)
                if hooks is not None:
                    rows = HookedSource(rows, hooks)
                yield from _gen.completion_chunks(
                    self.model, rows, n_prompt=chunks.n_tokens, stop=list(stops), logprobs=None, head=b"",
                    completion_id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()),
                    model_name=model or self.model.path.name, special_tokens=_sampling.special_tokens(grammar))
            finally:
                chunks.close()
                chain.close()
                if constraint is not None:
                    constraint.close()
        return gen()

    def chat_layer_for(self, tools: Any, response_format: Any, opts: dict[str, Any]) -> NativeChatHandler | None:
        """llama.cpp's chat layer where ``Llama.create_chat_completion`` would take it: chat options or a
        ``response_format``, or tools that the model's template knows; None for the template path."""
        if not (tools or response_format or opts):
            return None
        layer = self.chat_layer if _chat_layer_available() else None
        if layer is None:
            if opts:
                raise ParameterError(f"{', '.join(sorted(opts))} apply to llama.cpp's chat layer over the model's "
                                     "own template, which this chat does not render with (a named chat format or "
                                     "a preset's template, or a build without libllama-cpp-ext)")
            return None
        if opts or response_format:
            return layer
        return layer if layer.templates_for(self).caps.get("supports_tool_calls") else None

    @serialized()
    def create_chat_completion(self, messages: Sequence[dict], *, max_tokens: int | None = None,
                               temperature: float = 0.2, top_k: int = 40, top_p: float = 0.95,
                               min_p: float = 0.05, typical_p: float = 1.0, repeat_penalty: float = 1.0,
                               frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                               seed: int | None = None, stop: str | Sequence[str] | None = None,
                               stream: bool = False, model: str | None = None, tools: Any = None,
                               tool_choice: Any = None, functions: Any = None, function_call: Any = None,
                               response_format: Any = None, parallel_tool_calls: bool | None = None,
                               chat_template_kwargs: dict[str, Any] | None = None, reasoning_format: str | None = None,
                               reasoning_budget: int | None = None, reasoning_effort: str | None = None,
                               logits_processor: Any = None, stopping_criteria: Any = None,
                               special_in_content: bool = False) -> Any:
        """An OpenAI-style chat completion (a dict, or an iterator of chunks when ``stream``).

        With tools the template knows, a ``response_format`` or chat options, through llama.cpp's chat
        layer (see the module docstring): ``tool_calls`` and ``reasoning_content`` come back parsed."""
        opts = check_chat_options(chat_template_kwargs, reasoning_format, reasoning_budget)
        if parallel_tool_calls is not None:
            opts["parallel_tool_calls"] = parallel_tool_calls
        if reasoning_effort is not None:
            opts["reasoning_effort"] = reasoning_effort
        sampling = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        typical_p=typical_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, seed=seed, model=model, logits_processor=logits_processor,
                        stopping_criteria=stopping_criteria)
        layer = self.chat_layer_for(tools or functions, response_format, opts)
        if layer is not None:
            msgs, media = flatten_messages(messages, self.mtmd.marker, self.media_policy)
            out = layer(llama=MediaChatTarget(self, media), messages=msgs, functions=functions,
                        function_call=function_call, tools=tools, tool_choice=tool_choice, stream=stream, stop=stop,
                        response_format=response_format, special_in_content=special_in_content, **opts, **sampling)
            return self._guard.stream(out) if stream else out
        if tools or functions or response_format:
            raise MultimodalError("tools and response_format need llama.cpp's chat layer over the model's own "
                                  "template (and, for tools, a template that knows them); this chat renders with "
                                  "a named chat format or a preset's template")
        chunks, stops = self.tokenize_messages(messages)
        if stop:
            stops = stops + ([stop] if isinstance(stop, str) else list(stop))
        completion = self.completion(chunks, stops, **sampling)
        if stream:
            return self._guard.stream(_responses.chat_stream(completion))
        return _responses.chat_response(_responses.join_chunks(list(completion)))


class MediaChatTarget:
    """One media chat request as llama.cpp's chat layer generates it (a
    :class:`~llama_cpp._chat.native_completion.ChatTarget`): the prompt rendered by that layer is
    tokenized with the request's media at its markers, and completed on the engine."""

    def __init__(self, engine: MultimodalChatEngine, media: Sequence[Image | Audio]) -> None:
        self.engine = engine
        self.model = engine.model
        self.media = list(media)

    def chat_prompt(self, text: str, messages: Sequence[Any], *, special_in_content: bool,
                    render: Callable[[list[Any]], str]) -> Chunks:
        marker = self.engine.mtmd.marker
        if text.count(marker) != len(self.media):
            raise MultimodalError(f"the chat template kept {text.count(marker)} of {len(self.media)} media markers "
                                  "(it drops or rewrites some message contents)")
        return self.engine.chat_prompt(self.media, text, messages, special_in_content=special_in_content,
                                       render=render)

    def create_completion(self, prompt: Chunks, *, stream: bool, stop: list[str], grammar: Any,
                          **kwargs: Any) -> Any:
        bad = sorted(k for k, v in kwargs.items() if k not in _SAMPLING_KEYS and v not in (None, False, 0, 1.0))
        if bad:
            prompt.close()
            raise MultimodalError(f"the multimodal chat does not support {', '.join(bad)}")
        completion = self.engine.completion(prompt, stop, grammar=grammar,
                                            **{k: v for k, v in kwargs.items() if k in _SAMPLING_KEYS})
        return completion if stream else _responses.join_chunks(list(completion))


_SAMPLING_KEYS = frozenset({"max_tokens", "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                            "frequency_penalty", "presence_penalty", "seed", "model", "logits_processor",
                            "stopping_criteria"})


def _limit(room: int, max_tokens: int | None) -> int:
    """Tokens to generate: ``max_tokens`` (all the room when None or <= 0), at most the room left."""
    return room if max_tokens is None or max_tokens <= 0 else min(int(max_tokens), room)


class MultimodalChat(MultimodalChatEngine):
    """Chat completions over a text model + projector, with optional speculative decoding.

    ``MultimodalChat(model_path, mmproj_path, speculative=SpecConfig(draft_n_max=3))``; then
    :meth:`create_chat_completion` takes OpenAI-style messages (``image_url`` and
    ``input_audio`` parts) and returns a response dict, or an iterator of chunks with
    ``stream=True``. ``chat_template`` overrides the GGUF template, ``chat_format`` picks a named
    one. This object owns its projector and contexts (and the model when given a path).

    ``speculative`` takes ``draft-mtp`` (:class:`MultimodalMTPDecoder`), the n-gram types,
    ``draft-simple``, ``draft-dflash`` and ``draft-dspark`` (:class:`MultimodalDraftDecoder`), and
    lists of them, as llama.cpp's server speculates on media prompts; ``draft-eagle3`` is refused
    before anything loads (:func:`check_media_types`).
    """

    def __init__(self, model: str | os.PathLike[str] | LlamaModel, mmproj_path: str | os.PathLike[str], *,
                 n_ctx: int = 4096, n_batch: int = 512, n_ubatch: int | None = None,
                 n_threads: int | None = None, n_gpu_layers: int = 0, use_gpu: bool = True,
                 chat_template: str | None = None, chat_format: str | None = None,
                 speculative: SpecConfig | None = None, media_marker: str | None = None,
                 image_min_tokens: int | None = None, image_max_tokens: int | None = None,
                 seed: int = LLAMA_DEFAULT_SEED, media_dirs: Sequence[str | os.PathLike[str]] | None = None,
                 ) -> None:
        self._owned_model: LlamaModel | None = None
        self._mctx = None
        self._ctx = None
        self._spec = None
        if speculative is not None and not isinstance(speculative, SpecConfig):
            raise SpeculativeError(f"speculative must be a SpecConfig, got {type(speculative).__name__}")
        spec = self.speculative = speculative if speculative is not None and speculative.enabled else None
        model = unwrap(model)  # Llama.model (the pointer) stands for its LlamaModel
        if spec is not None:
            check_media_types(spec)
            check_model_file(model.path if isinstance(model, LlamaModel) else model, spec)
        if isinstance(model, LlamaModel):
            text_model = model
        else:
            self._owned_model = text_model = LlamaModel(model, n_gpu_layers=n_gpu_layers,
                                                        load_mtp=spec is not None and spec.needs_nextn)
        try:
            mctx = self._mctx = MTMDContext(mmproj_path, text_model, use_gpu=use_gpu, n_threads=n_threads,
                                            media_marker=media_marker, image_min_tokens=image_min_tokens,
                                            image_max_tokens=image_max_tokens)
            threads = {} if n_threads is None else {"n_threads": n_threads, "n_threads_batch": n_threads}
            params = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch or n_batch, n_seq_max=1, **threads)
            if spec is not None:
                self._spec = make_media_decoder(text_model, spec, ctx_params=params)
            else:
                self._ctx = LlamaContext(text_model, **params)
            formatter = _chat.model_chat_formatter(text_model, chat_format=chat_format, template=chat_template,
                                                    media=True)
            if formatter is None:
                raise MultimodalError("the model has no chat template: pass chat_template=... or chat_format=...")
        except BaseException:
            self.close()
            raise
        layer = NativeChatHandler(chat_template) if chat_format is None else None
        super().__init__(text_model, mctx, formatter, context=self._ctx, decoder=self._spec, seed=seed,
                         media_dirs=media_dirs, chat_layer=layer)

    def close(self) -> None:
        """Free the contexts (and the model if this object loaded it). Idempotent; waits for a running call."""
        guard = getattr(self, "_guard", None)  # None when __init__ failed: nothing else can hold it
        if guard is None:
            self._free()
            return
        with guard.lock:
            guard.invalidate()
            self._free()

    def _free(self) -> None:
        for name in ("_spec", "_ctx", "_mctx", "_owned_model"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    def __enter__(self) -> MultimodalChat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MTMDChatHandler:
    """A ``chat_handler`` for :class:`~llama_cpp.Llama`: ``Llama(model, chat_handler=MTMDChatHandler(mmproj))``.

    Uses the Llama's model and context (its KV cache is reset before and after each request, so
    the Llama's own prompt cache stays consistent). Given to ``Llama(..., speculative=SpecConfig(...))``
    it builds the Llama's speculative decoder (:meth:`speculative_decoder`), which then speculates
    on media chats too (where the type or draft cannot, :class:`MediaSpeculationError`, the Llama
    speculates on text prompts and media chats decode without drafts). A handler set on an existing
    Llama decodes media without drafts.
    """

    def __init__(self, clip_model_path: str | os.PathLike[str], verbose: bool = False, use_gpu: bool = True, *,
                 n_threads: int | None = None, media_marker: str | None = None,
                 media_dirs: Sequence[str | os.PathLike[str]] | None = None) -> None:
        if not os.path.exists(clip_model_path):
            raise MultimodalError(f"clip model path does not exist: {os.fspath(clip_model_path)!r}")
        self.clip_model_path = Path(clip_model_path)
        self.verbose = verbose
        self.media_dirs = media_dirs
        self.n_threads = n_threads
        self.use_gpu = use_gpu
        self.media_marker = media_marker
        self._mctx: MTMDContext | None = None
        self._model_ref: Any = None
        self._chat_layer = NativeChatHandler()  # the model's own template, loaded per model on first use

    #: Llama.create_chat_completion passes it the chat-layer options (see MultimodalChatEngine)
    takes_chat_options = True

    def close(self) -> None:
        if self._mctx is not None:
            self._mctx.close()
            self._mctx = None

    def _context_for(self, llama: Any) -> MTMDContext:
        model = llama.native_model()
        if self._mctx is None or self._model_ref is not model.native_ref:
            self.close()
            self._mctx = MTMDContext(self.clip_model_path, model, use_gpu=self.use_gpu,
                                     n_threads=self.n_threads, media_marker=self.media_marker)
            self._model_ref = model.native_ref
        return self._mctx

    def speculative_decoder(self, model: LlamaModel, config: SpecConfig, *, target: LlamaContext,
                            prompt_lookup: Any = None,
                            draft_model: Any = None) -> MultimodalMTPDecoder | MultimodalDraftDecoder | None:
        """The decoder a ``Llama`` given this handler speculates with (None: it builds its own):
        one that also takes media prompts, over the Llama's context; None where the type or draft
        cannot draft over media (the Llama's own decoder then speculates on its text prompts)."""
        try:
            return make_media_decoder(model, config, target=target, prompt_lookup=prompt_lookup,
                                      draft_model=draft_model)
        except MediaSpeculationError as e:
            log.info("media chats decode without speculation: %s", e)
            return None

    @staticmethod
    def _seed_of(llama: Any) -> int:
        seq = getattr(llama, "sequence", None)  # a Llama's; a stand-in may have none
        return seq.seed if seq is not None else LLAMA_DEFAULT_SEED

    @staticmethod
    def _runner(llama: Any) -> dict[str, Any]:
        """``decoder=`` the Llama's speculative decoder where it takes media, else ``context=`` its context."""
        dec = llama.sequence.spec
        return {"decoder": dec} if isinstance(dec, MediaHistory) else {"context": llama.native_context()}

    def engine_for(self, llama: Any) -> MultimodalChatEngine:
        """The engine one request runs on: the Llama's model, context (or speculative decoder) and
        chat template (the vision presets in :mod:`llama_cpp._multimodal.vision_handlers` give their own template)."""
        own = llama.chat_format is None and bool(llama.native_model().chat_template())
        return MultimodalChatEngine(llama.native_model(), self._context_for(llama), llama.chat_formatter(),
                                    seed=self._seed_of(llama), media_dirs=self.media_dirs,
                                    chat_layer=self._chat_layer if own else None, **self._runner(llama))

    def __call__(self, *, llama: Any, messages: Sequence[dict], max_tokens: int | None = None,
                 temperature: float = 0.2, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, seed: int | None = None, stop: Any = None, stream: bool = False,
                 model: str | None = None, **options: Any) -> Any:
        bad = sorted(k for k, v in options.items() if k not in _HANDLER_OPTIONS and v not in (None, False, [], {}))
        if bad:
            raise MultimodalError(f"the multimodal chat handler does not support {', '.join(bad)}")
        engine = self.engine_for(llama)
        llama.reset()
        result = engine.create_chat_completion(
            messages, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            typical_p=typical_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, seed=seed, stop=stop, stream=stream, model=model,
            **{k: v for k, v in options.items() if k in _HANDLER_OPTIONS})

        def done() -> None:
            llama.last_speculative_stats = engine.last_speculative_stats  # None: this chat did not speculate
            llama.reset()

        if not stream:
            done()
            return result

        def streaming() -> Iterator[dict]:
            try:
                yield from result
            finally:
                done()
        return streaming()


#: what MTMDChatHandler passes on to the engine beyond the sampling keywords
_HANDLER_OPTIONS = frozenset({
    "tools", "tool_choice", "functions", "function_call", "response_format", "parallel_tool_calls",
    "chat_template_kwargs", "reasoning_format", "reasoning_budget", "reasoning_effort", "logits_processor",
    "stopping_criteria", "special_in_content"})


__all__ = [
    "MTMDChatHandler",
    "MediaChatTarget",
    "MediaSpeculationError",
    "MultimodalChat",
    "MultimodalChatEngine",
    "MultimodalDraftDecoder",
    "MultimodalMTPDecoder",
    "check_media_types",
    "eval_chunks",
    "flatten_messages",
    "image_from_url",
    "make_media_decoder",
]

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

With ``speculative=SpecConfig(...)`` the prompt goes through a speculative decoder that takes
media chunks. ``draft-mtp``: :class:`MultimodalMTPDecoder` extends the text MTP engine
(:class:`~llama_cpp.speculative.MTPDecoder`) with media spans: the image rows are decoded on the
target at their mtmd positions, and the MTP draft context is caught up over the same positions
with the target's hidden states shifted by one (``h_{p-1}`` at position ``p``), so drafting
continues right after the image. The n-gram types and ``draft-simple``:
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
from ._core.context import LlamaBatchExtNative, LlamaContext
from ._core.model import LlamaModel
from ._core.sampler import LlamaSampler
from ._errors import ClosedError, ContextOverflowError, MultimodalError, SpeculativeError
from ._generation import loop as _gen
from ._generation import responses as _responses
from ._generation import sampling as _sampling
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
# evaluation helpers
# --------------------------------------------------------------------------------------------

def _decode_media(ctx: LlamaContext, batch: LlamaBatchExtNative, rows: np.ndarray, positions: np.ndarray,
                  non_causal: bool, *, output_last: bool,
                  after: Callable[[np.ndarray], None] | None = None) -> None:
    """Decode media rows at ``positions`` (split by n_batch unless attention is non-causal);
    ``after(positions[s:e])`` runs after each decode, while the context holds its per-row outputs."""
    n = rows.shape[0]
    step = ctx.n_batch()
    if non_causal:
        if n > min(ctx.n_ubatch(), step):
            raise ContextOverflowError(
                f"a media chunk of {n} embeddings must be decoded in one micro-batch (non-causal attention) "
                f"but n_ubatch={ctx.n_ubatch()}: raise n_batch and n_ubatch")
        step = n
    causal0 = ctx.causal_attn()
    if non_causal:
        ctx.set_causal_attn(False)
    try:
        for s in range(0, n, step):
            batch.clear()
            for j in range(s, min(n, s + step)):
                p = int(positions[j, 0]) if positions.shape[1] == 1 else [int(v) for v in positions[j]]
                batch.add_embd(rows[j], 0, p, output=output_last and j == n - 1)
            ctx.process(batch)
            if after is not None:
                after(positions[s:min(n, s + step)])
    finally:
        if non_causal:
            ctx.set_causal_attn(causal0)


def eval_chunks(mctx: MTMDContext, ctx: LlamaContext, chunks: Chunks, n_past: int = 0) -> int:
    """Evaluate every chunk on sequence 0 of ``ctx`` from ``n_past``; logits of the last entry stay
    available. Returns the new ``n_past`` (the mtmd_helper_eval_chunks equivalent)."""
    items = list(chunks)
    need = max(chunks.n_pos, chunks.n_tokens)  # M-RoPE image rows take a cell each, sharing positions
    if n_past + need > ctx.n_ctx():
        raise ContextOverflowError(f"the prompt needs {need} positions after {n_past}; n_ctx is "
                                   f"{ctx.n_ctx()}: shorten the conversation or raise n_ctx")
    batch = LlamaBatchExtNative(ctx)
    try:
        for k, ch in enumerate(items):
            last = k == len(items) - 1
            if ch.is_media:
                rows = mctx.encode(ch)
                _decode_media(ctx, batch, rows, mctx.positions(ch, n_past), mctx.use_non_causal(ch),
                              output_last=last)
            else:
                toks = ch.tokens
                step = ctx.n_batch()
                for s in range(0, len(toks), step):
                    batch.clear()
                    part = toks[s:s + step]
                    for j, t in enumerate(part):
                        batch.add_token(int(t), 0, n_past + s + j,
                                        output=last and s + j == len(toks) - 1)
                    ctx.process(batch)
            n_past += ch.n_pos
    finally:
        batch.close()
    return n_past


# --------------------------------------------------------------------------------------------
# speculation over media prompts
# --------------------------------------------------------------------------------------------

#: token id a decoder's history holds at each media position (never decoded)
MEDIA_TOKEN = -1
#: types multimodal chat refuses: an EAGLE3 draft pairs the features of each position with the
#: token at the next one, which a media position does not have
MEDIA_REFUSED_TYPES = frozenset((SpeculativeType.DRAFT_EAGLE3,))


class MediaSpeculationError(SpeculativeError):
    """A speculative type or draft that runs on text but cannot draft over media positions."""


@dataclasses.dataclass(frozen=True)
class MediaSpan:
    """One media chunk as the target decoded it: ``rows`` at ``positions``, taking history
    positions ``p0 .. p0 + n_pos - 1``."""

    p0: int
    n_pos: int
    rows: np.ndarray
    positions: np.ndarray


class TextHistoryDrafter:
    """A token drafter told the history's text tokens only: media positions are dropped, as
    llama.cpp's server hands its drafters ``server_tokens::get_text_tokens()`` (n-gram matches run
    across a media span as if it were not there)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._text: list[int] = []
        self._seen = 0                          # history positions folded into _text
        self._media: list[list[int]] = []       # [start, length] runs of media positions

    @property
    def kind(self) -> str | None:
        return getattr(self.inner, "kind", None)

    @property
    def n_max(self) -> int:
        return int(self.inner.n_max)

    @property
    def takes_limit(self) -> bool:
        return bool(getattr(self.inner, "takes_limit", False))

    def _clear(self) -> None:
        self._text, self._seen, self._media = [], 0, []

    def _absorb(self, history: Sequence[int]) -> None:
        new = history[self._seen:]
        if MEDIA_TOKEN not in new:
            self._text.extend(new)
        else:
            for i, t in enumerate(new, self._seen):
                if t != MEDIA_TOKEN:
                    self._text.append(t)
                elif self._media and sum(self._media[-1]) == i:
                    self._media[-1][1] += 1
                else:
                    self._media.append([i, 1])
        self._seen = len(history)

    def text_len(self, n: int) -> int:
        """How many of the first ``n`` history positions are text."""
        return n - sum(max(0, min(n, s + k) - s) for s, k in self._media)

    def reset(self) -> None:
        self.inner.reset()
        self._clear()

    def begin(self, prompt: Sequence[int]) -> None:
        self._clear()
        self._absorb(prompt)
        self.inner.begin(list(self._text))

    def rewind(self, n_keep: int) -> None:
        rewind = getattr(self.inner, "rewind", None)
        if rewind is not None:
            rewind(self.text_len(n_keep))

    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        if len(prompt) < self._seen:  # not a continuation of what begin() saw: fold it in again
            self._clear()
        if len(prompt) > self._seen:
            self._absorb(prompt)
        if self.takes_limit:
            return self.inner.draft(self._text, id_last, n_max)
        return self.inner.draft(self._text, id_last)

    def accept(self, n_accepted: int) -> None:
        self.inner.accept(n_accepted)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class MediaDraftModel:
    """``draft-simple`` over a media prompt: the draft memory holds what the target's holds, at the
    target's positions, as llama.cpp's ``common_speculative_impl_draft_simple::process`` mirrors
    every target batch: text tokens at their position; media rows at the first ``n_pos_per_embd``
    of their target positions, the target's rows where the draft's input width is theirs, else
    zero rows (drafts after the media are then poor: logged once). Media spans are decoded on the
    draft when it first drafts after them; the text is synced by the draft model itself."""

    kind = "draft-simple"
    takes_limit = True

    def __init__(self, inner: Any, target: LlamaContext) -> None:
        dctx = inner.ctx
        if target.n_pos_per_embd > 1 and dctx.n_pos_per_embd == 1:
            # an image's rows share one first position and the text after it jumps past them:
            # llama.cpp's draft context refuses that batch ("positions remain consecutive")
            raise MediaSpeculationError(
                "draft-simple in multimodal chat: the target uses M-RoPE and the draft model does not, so the "
                "draft cannot take the target's positions after an image (llama.cpp's draft context fails there "
                "too): use a draft model of the target's family, or an n-gram type")
        self.inner = inner
        self._batch: LlamaBatchExtNative | None = LlamaBatchExtNative(dctx)
        self._spans: list[MediaSpan] = []
        self._warned = False

    @property
    def n_max(self) -> int:
        return int(self.inner.n_max)

    def close(self) -> None:
        if self._batch is not None:  # before the draft context it points into
            self._batch.close()
            self._batch = None
        self.inner.close()

    def reset(self) -> None:
        self.inner.reset()
        self._spans = []

    def begin(self, prompt: Sequence[int]) -> None:
        self.inner.begin(prompt)

    def accept(self, n_accepted: int) -> None:
        self.inner.accept(n_accepted)

    def set_media(self, spans: Sequence[MediaSpan], history: Sequence[int]) -> None:
        """A new prompt's media; the draft memory keeps at most the text before the first span
        (another prompt's media rows hold the same placeholder ids)."""
        self._spans = list(spans)
        self.inner._sync(history[:spans[0].p0] if spans else history)

    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        try:
            self._catch_up(prompt)
        except BaseException:
            self.inner.reset()  # the draft memory is unknown after a failed decode
            raise
        return self.inner.draft(prompt, id_last, n_max)

    def _catch_up(self, history: Sequence[int]) -> None:
        """Decode the media spans (and the text before each) the draft memory lacks."""
        dm = self.inner
        if not self._spans:
            return
        last = self._spans[-1]
        end = last.p0 + last.n_pos
        if len(dm._kv) >= end and dm._kv[end - 1] == MEDIA_TOKEN:
            return  # spans are decoded whole and in order: the last one in means all are
        L = dm._sync(history)
        for sp in self._spans:
            if sp.p0 + sp.n_pos <= L:
                continue
            if sp.p0 < L:  # never half in; rebuild from before it if it ever is
                L = dm._sync(history[:sp.p0])
            if L < sp.p0:
                dm._decode(history[L:sp.p0], L)
            self._decode_media(sp)
            dm._kv.extend([MEDIA_TOKEN] * sp.n_pos)
            L = sp.p0 + sp.n_pos

    def _rows_for(self, sp: MediaSpan, width: int) -> np.ndarray | None:
        """The rows the draft gets for a span: the target's, or None (zero rows) when widths differ."""
        if sp.rows.shape[1] == width:
            return sp.rows
        if not self._warned:
            log.warning("media rows of width %d do not fit the draft input width %d: the draft receives zero rows "
                        "for them and drafts after media will be poor", sp.rows.shape[1], width)
            self._warned = True
        return None

    def _decode_media(self, sp: MediaSpan) -> None:
        b, dctx = self._batch, self.inner.ctx
        if b is None:
            raise ClosedError("this draft model is closed")
        width, npd = b.n_embd, b.n_pos_per_embd
        rows = self._rows_for(sp, width)
        zero = np.zeros(width, dtype=np.float32)
        pos = np.zeros((sp.positions.shape[0], max(npd, sp.positions.shape[1])), dtype=np.int64)
        pos[:, :sp.positions.shape[1]] = sp.positions  # llama.cpp copies the draft's count of them
        n, step = sp.rows.shape[0], dctx.n_batch()
        for s in range(0, n, step):
            b.clear()
            for j in range(s, min(n, s + step)):
                p: Any = int(pos[j, 0]) if npd == 1 else [int(v) for v in pos[j, :npd]]
                b.add_embd(rows[j] if rows is not None else zero, 0, p, output=False)
            dctx.process(b)


class MediaFeatureDrafter:
    """``draft-dflash``/``draft-dspark`` over a media prompt, as llama.cpp's
    ``common_speculative_impl_draft_dflash::process`` takes the target's batches: the target's
    layer features of media rows go into the draft memory at the rows' positions like a text
    token's, except an M-RoPE image's, whose rows share one position (llama.cpp skips those; the
    draft memory jumps over the image, which only an M-RoPE draft's positions allow). Text
    decodes reach the drafter through its own ``observe``."""

    def __init__(self, inner: Any, target: LlamaContext) -> None:
        if target.n_pos_per_embd > 1 and not inner._mrope:
            raise MediaSpeculationError(
                f"{inner.kind} in multimodal chat: the target uses M-RoPE and the draft does not, so the draft "
                "memory cannot jump over an image's positions (llama.cpp's draft context refuses that batch): use "
                "the DFlash draft made for this model family, or an n-gram type")
        self.inner = inner
        self.kind = inner.kind
        self.takes_limit = True

    @property
    def n_max(self) -> int:
        return int(self.inner.n_max)

    def observe(self, tokens: Sequence[int], pos0: int) -> None:
        self.inner.observe(tokens, pos0)

    def observe_media(self, positions: np.ndarray) -> None:
        """The target just decoded media rows at ``positions`` (``[n, n_pos_per_embd]``)."""
        p = positions[:, 0]
        n = p.shape[0]
        if n == 0 or (n > 1 and p[0] == p[-1]):
            return  # an M-RoPE image: every row at one position
        if n > 1 and not bool(np.all(np.diff(p) == 1)):
            return  # not one row per position: nothing llama.cpp would inject either
        self.inner.observe([MEDIA_TOKEN] * n, int(p[0]))

    def end_media(self, span: MediaSpan) -> None:
        """A media span is in the target's memory: what the draft memory did not take is jumped over."""
        self.inner.skip(span.p0, span.n_pos, MEDIA_TOKEN)

    def reset(self) -> None:
        self.inner.reset()

    def begin(self, prompt: Sequence[int]) -> None:
        self.inner.begin(prompt)

    def accept(self, n_accepted: int) -> None:
        self.inner.accept(n_accepted)

    def draft(self, prompt: list[int], id_last: int, n_max: int | None = None) -> list[int]:
        return self.inner.draft(prompt, id_last, n_max)

    def close(self) -> None:
        self.inner.close()


def media_drafters(drafters: Sequence[Any], target: LlamaContext) -> list[Any]:
    """``drafters`` (from :func:`~llama_cpp.speculative.build_drafters`) wrapped for a history with
    media positions; on failure every drafter is closed."""
    from .speculative.dflash import DFlashDrafter
    from .speculative.draft import DraftModel

    out: list[Any] = []
    try:
        for d in drafters:
            if isinstance(d, DraftModel):
                out.append(MediaDraftModel(d, target))
            elif isinstance(d, DFlashDrafter):
                out.append(MediaFeatureDrafter(d, target))
            else:
                out.append(TextHistoryDrafter(d))
    except BaseException:
        close_drafters(drafters)
        raise
    return out


def check_media_prompt(items: Sequence[Chunk], n_ctx: int) -> int:
    """Refuse a speculative prompt that does not end with text or does not fit ``n_ctx`` cells;
    return the cells its media take beyond their positions (M-RoPE images: rows share positions)."""
    if not items or items[-1].is_media or items[-1].n_tokens == 0:
        raise MultimodalError("a speculative prompt must end with text (the chat template's generation prompt); "
                              "add text after the last media item")
    n_cells = sum(c.n_tokens for c in items)
    if n_cells > n_ctx:
        raise ContextOverflowError(f"the prompt takes {n_cells} tokens of context (media rows included); n_ctx is "
                                   f"{n_ctx}: shorten the conversation or raise n_ctx")
    return sum(c.n_tokens - c.n_pos for c in items if c.is_media)


class _MediaHistory:
    """What both media decoders share: ``n_ctx`` as positions left to the history (the context's
    cells less what media rows take beyond their positions), the prompt's media spans, and the
    drafters that must be told about them."""

    MEDIA_TOKEN = MEDIA_TOKEN
    _n_cells = 0
    _excess = 0
    _spans: tuple[MediaSpan, ...] = ()

    @property
    def n_ctx(self) -> int:
        return self._n_cells - self._excess

    @n_ctx.setter
    def n_ctx(self, value: int) -> None:
        self._n_cells = int(value)

    def _forget_media(self) -> None:
        self._excess = 0
        self._spans = ()

    def _reset_state(self) -> None:
        super()._reset_state()  # type: ignore[misc]
        self._forget_media()

    def _fill(self, mctx: MTMDContext, items: Sequence[Chunk]) -> tuple[list[MediaSpan], int]:
        """Decode ``items`` in order through ``_add_media``/``_add_text``; the last text token stays
        pending (``_id_last``). Returns the media spans and the prompt's token count."""
        spans: list[MediaSpan] = []
        n_new = 0
        for k, ch in enumerate(items):
            if ch.is_media:
                spans.append(self._add_media(mctx, ch))  # type: ignore[attr-defined]
            else:
                toks = [int(t) for t in ch.tokens]
                if k == len(items) - 1:
                    self._id_last = toks[-1]
                    toks = toks[:-1]
                if toks:
                    self.model.check_tokens(toks, "prompt token")  # type: ignore[attr-defined]
                    self._add_text(toks)  # type: ignore[attr-defined]
            n_new += ch.n_tokens
        return spans, n_new

    def prefill(self, tokens: Sequence[int]) -> None:
        """A text prompt (:meth:`prefill_chunks` for one with media); after a media prompt it starts over."""
        if self._spans:
            self.reset()  # type: ignore[attr-defined]
        super().prefill(tokens)  # type: ignore[misc]

    def _tell_media(self, drafters: Sequence[Any], old: Sequence[int], history: list[int]) -> None:
        for d in drafters:
            set_media = getattr(d, "set_media", None)
            if set_media is not None:
                set_media(self._spans, history)
        tell_drafters(drafters, old, history)

    def save_state(self) -> Any:
        if self._spans:
            raise SpeculativeError("the state of a prompt with media is not saved (its media rows are not in "
                                   "kv_tokens): prefill it again instead")
        return super().save_state()  # type: ignore[misc]


class MultimodalMTPDecoder(_MediaHistory, MTPDecoder):
    """:class:`~llama_cpp.speculative.MTPDecoder` that also takes media chunks in its prompt (and
    the n-gram types or ``draft-simple`` alongside, told about the media as
    :class:`MultimodalDraftDecoder` tells them)."""

    def __init__(self, model: LlamaModel, ctx_params: dict[str, Any] | None, config: SpecConfig,
                 **kwargs: Any) -> None:
        super().__init__(model, ctx_params, config, **kwargs)
        try:
            self._extra = media_drafters(self._extra, self._live()[0])
        except BaseException:
            self._extra = []  # media_drafters closed them
            self.close()
            raise

    def prefill_chunks(self, mctx: MTMDContext, chunks: Chunks) -> None:
        """Make the sequence the chunks' contents; the last text token stays pending.

        Both memories are cleared first (a media prompt is not matched against the history).
        """
        tgt, dft = self._live()
        items = list(chunks)
        excess = check_media_prompt(items, self._n_cells)
        t0 = time.perf_counter()
        old = self.history
        tgt.memory_clear(True)
        dft.memory_clear(True)
        self._reset_state()
        spans, n_new = self._fill(mctx, items)
        self._excess, self._spans = excess, tuple(spans)
        if self._extra:
            self._tell_media(self._extra, old, self._kv)
        self.stats.prefill_tokens += n_new
        self.stats.t_prefill += time.perf_counter() - t0

    def _add_text(self, tokens: list[int]) -> None:
        self._extend(tokens)

    def _add_media(self, mctx: MTMDContext, ch: Chunk) -> MediaSpan:
        """Decode one media chunk on the target and mirror it (shifted h rows) into the draft."""
        tgt, dft = self._live()
        rows = mctx.encode(ch)
        P = len(self._kv)
        pos = mctx.positions(ch, P)
        _decode_media(tgt, self._tbatch, rows, pos, mctx.use_non_causal(ch), output_last=False)
        h = self._target_rows(rows.shape[0])
        shifted = [self._pending_h] + [h[j] for j in range(rows.shape[0] - 1)]
        b = self._dbatch
        width = b.n_embd
        if width != h.shape[1]:
            raise SpeculativeError(f"draft rows are {width} wide but the target's hidden states are {h.shape[1]}")
        n = rows.shape[0]
        for s in range(0, n, self.n_batch):
            b.clear()
            for j in range(s, min(n, s + self.n_batch)):
                p = int(pos[j, 0]) if pos.shape[1] == 1 else [int(v) for v in pos[j]]
                b.add_embd(np.ascontiguousarray(shifted[j], dtype=np.float32), 0, p, output=False)
            dft.process(b)
        self._pending_h = h[-1].copy()
        self._kv.extend([MEDIA_TOKEN] * ch.n_pos)
        self._n_dft = P + ch.n_pos
        return MediaSpan(P, ch.n_pos, rows, pos)


class MultimodalDraftDecoder(_MediaHistory, DraftDecoder):
    """:class:`~llama_cpp.speculative.engine.DraftDecoder` (the n-gram types, ``draft-simple``, and lists
    of them) whose prompt may hold media chunks, as llama.cpp's server speculates on them.

    Media rows are decoded on the target at their mtmd positions (M-RoPE sections and causal
    attention as :func:`eval_chunks` decodes them); the history holds :data:`MEDIA_TOKEN` at each
    media position, so the verify loop's positions, rollbacks and room stay the target's. The
    n-gram drafters are told the text tokens only (:class:`TextHistoryDrafter`), the draft model
    mirrors the target's memory media included (:class:`MediaDraftModel`). The target context is
    created from ``ctx_params`` and owned, or borrowed as ``target`` (a ``Llama``'s context).
    """

    def __init__(self, model: LlamaModel, ctx_params: dict[str, Any] | None, config: SpecConfig, *,
                 target: LlamaContext | None = None, prompt_lookup: Any = None) -> None:
        self._mbatch: LlamaBatchExtNative | None = None
        target, drafters, owns = draft_decoder_parts(model, config, target=target, ctx_params=ctx_params,
                                                     prompt_lookup=prompt_lookup, wrap=media_drafters)
        super().__init__(model, target, config, drafters, owns_target=owns)
        try:
            self._mbatch = LlamaBatchExtNative(target)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the drafters and the target context (if this decoder created it)."""
        if self._mbatch is not None:  # before the context it points into
            self._mbatch.close()
            self._mbatch = None
        super().close()

    def prefill_chunks(self, mctx: MTMDContext, chunks: Chunks) -> None:
        """Make the sequence the chunks' contents; the last text token stays pending.

        The target memory is cleared first (a media prompt is not matched against the history).
        """
        tgt = self._live()
        items = list(chunks)
        excess = check_media_prompt(items, self._n_cells)
        if self._mbatch is None:
            raise ClosedError("this speculative decoder is closed; create a new one")
        t0 = time.perf_counter()
        old = self.history
        tgt.memory_clear(True)
        self._reset_state()
        self._dirty = True  # until the whole prompt is in
        spans, n_new = self._fill(mctx, items)
        self._dirty = False
        self._excess, self._spans = excess, tuple(spans)
        self._tell_media(self._drafters, old, self._kv)
        self.stats.prefill_tokens += n_new
        self.stats.t_prefill += time.perf_counter() - t0

    def _add_text(self, tokens: list[int]) -> None:
        self._decode(tokens, len(self._kv), outputs=False)
        self._kv.extend(tokens)

    def _add_media(self, mctx: MTMDContext, ch: Chunk) -> MediaSpan:
        """Decode one media chunk on the target at its mtmd positions; the history holds MEDIA_TOKEN there."""
        kv = self._kv
        rows = mctx.encode(ch)
        pos = mctx.positions(ch, len(kv))
        feature = [d for d in self._drafters if isinstance(d, MediaFeatureDrafter)]

        def after(chunk: np.ndarray) -> None:
            for d in feature:
                d.observe_media(chunk)

        _decode_media(self._live(), self._mbatch, rows, pos, mctx.use_non_causal(ch), output_last=False,
                      after=after if feature else None)
        span = MediaSpan(len(kv), ch.n_pos, rows, pos)
        kv.extend([MEDIA_TOKEN] * ch.n_pos)
        for d in feature:
            d.end_media(span)
        return span


def check_media_types(config: SpecConfig) -> None:
    """Refuse the speculative types that cannot draft over media positions (``draft-eagle3``)."""
    refused = [t.value for t in config.types if t in MEDIA_REFUSED_TYPES]
    if refused:
        raise MediaSpeculationError(
            f"multimodal chat does not speculate with {', '.join(refused)} (its draft pairs the target's "
            "features at each position with the token at the next one, which a media position does not "
            "have): use draft-mtp, draft-simple, draft-dflash, draft-dspark or an n-gram type "
            "(ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache), or no speculation")


def make_media_decoder(model: LlamaModel, config: SpecConfig, *, target: LlamaContext | None = None,
                       ctx_params: dict[str, Any] | None = None,
                       prompt_lookup: Any = None) -> MultimodalMTPDecoder | MultimodalDraftDecoder:
    """:func:`~llama_cpp.speculative.make_decoder` for prompts that may hold media: a
    :class:`MultimodalMTPDecoder` when ``config`` includes ``draft-mtp``, else a
    :class:`MultimodalDraftDecoder`; over ``target`` (borrowed) or a context made from ``ctx_params``."""
    check_media_types(config)
    if config.needs_nextn:
        return MultimodalMTPDecoder(model, ctx_params, config, target=target, prompt_lookup=prompt_lookup)
    return MultimodalDraftDecoder(model, ctx_params, config, target=target, prompt_lookup=prompt_lookup)


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
                 ) -> None:
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

        pieces = prompt_pieces(self.model, prompt, message_texts(messages), render=render, messages=messages)
        if pieces is None:
            item: Any = MarkerPrompt(prompt, media)
        else:
            item = media_parts(pieces, media, self.mtmd.marker)
        chunks = self.mtmd.tokenize(item, add_special=not has_bos, parse_special=True, where="prompt")
        return chunks, stops

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

    @serialized()
    def create_chat_completion(self, messages: Sequence[dict], *, max_tokens: int | None = None,
                               temperature: float = 0.2, top_k: int = 40, top_p: float = 0.95,
                               min_p: float = 0.05, typical_p: float = 1.0, repeat_penalty: float = 1.0,
                               frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                               seed: int | None = None, stop: str | Sequence[str] | None = None,
                               stream: bool = False, model: str | None = None) -> Any:
        """An OpenAI-style chat completion (a dict, or an iterator of chunks when ``stream``)."""
        mctx = self.mtmd
        chunks, stops = self.tokenize_messages(messages)
        if stop:
            stops = stops + ([stop] if isinstance(stop, str) else list(stop))
        try:
            chain = _sampling.sampler_chain(
                self.model, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty, seed=self.seed if seed is None else seed)
        except BaseException:
            chunks.close()
            raise

        def completion() -> Iterator[dict[str, Any]]:
            try:
                pick = _sampling.token_picker(self.model, chain, None, False)
                yield from _gen.completion_chunks(
                    self.model, self._tokens(mctx, chunks, pick, max_tokens), n_prompt=chunks.n_tokens,
                    stop=stops, logprobs=None, head=b"", completion_id=f"cmpl-{uuid.uuid4().hex}",
                    created=int(time.time()), model_name=model or self.model.path.name)
            finally:
                chunks.close()
                chain.close()

        if stream:
            return self._guard.stream(_responses.chat_stream(completion()))
        return _responses.chat_response(_responses.join_chunks(list(completion())))


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
        super().__init__(text_model, mctx, formatter, context=self._ctx, decoder=self._spec, seed=seed,
                         media_dirs=media_dirs)

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

    def close(self) -> None:
        if self._mctx is not None:
            self._mctx.close()
            self._mctx = None

    def _context_for(self, llama: Any) -> MTMDContext:
        model = llama.model
        if self._mctx is None or self._model_ref is not model._ref:
            self.close()
            self._mctx = MTMDContext(self.clip_model_path, model, use_gpu=self.use_gpu,
                                     n_threads=self.n_threads, media_marker=self.media_marker)
            self._model_ref = model._ref
        return self._mctx

    def speculative_decoder(self, model: LlamaModel, config: SpecConfig, *, target: LlamaContext,
                            prompt_lookup: Any = None) -> MultimodalMTPDecoder | MultimodalDraftDecoder | None:
        """The decoder a ``Llama`` given this handler speculates with (None: it builds its own):
        one that also takes media prompts, over the Llama's context; None where the type or draft
        cannot draft over media (the Llama's own decoder then speculates on its text prompts)."""
        try:
            return make_media_decoder(model, config, target=target, prompt_lookup=prompt_lookup)
        except MediaSpeculationError as e:
            log.info("media chats decode without speculation: %s", e)
            return None

    @staticmethod
    def _seed_of(llama: Any) -> int:
        return getattr(llama, "_seed", LLAMA_DEFAULT_SEED)

    @staticmethod
    def _runner(llama: Any) -> dict[str, Any]:
        """``decoder=`` the Llama's speculative decoder where it takes media, else ``context=`` its context."""
        dec = llama._running_spec()
        return {"decoder": dec} if isinstance(dec, _MediaHistory) else {"context": llama.ctx}

    def _engine(self, llama: Any) -> MultimodalChatEngine:
        """The engine one request runs on: the Llama's model, context (or speculative decoder) and
        chat template (the vision presets in :mod:`llama_cpp._multimodal.vision_handlers` give their own template)."""
        return MultimodalChatEngine(llama.model, self._context_for(llama), llama._chat_formatter(),
                                    seed=self._seed_of(llama), media_dirs=self.media_dirs, **self._runner(llama))

    def __call__(self, *, llama: Any, messages: Sequence[dict], max_tokens: int | None = None,
                 temperature: float = 0.2, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, seed: int | None = None, stop: Any = None, stream: bool = False,
                 model: str | None = None, **unsupported: Any) -> Any:
        bad = sorted(k for k, v in unsupported.items() if v not in (None, False, [], {}))
        if bad:
            raise MultimodalError(f"the multimodal chat handler does not support {', '.join(bad)}")
        engine = self._engine(llama)
        llama.reset()
        result = engine.create_chat_completion(
            messages, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            typical_p=typical_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, seed=seed, stop=stop, stream=stream, model=model)

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


__all__ = [
    "MTMDChatHandler",
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

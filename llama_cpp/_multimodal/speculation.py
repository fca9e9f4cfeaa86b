"""Speculative decoding over media prompts: the decoders (:class:`MultimodalMTPDecoder`,
:class:`MultimodalDraftDecoder`) keep ``MEDIA_TOKEN`` in their history at media positions, and
the drafters see text only, copy the target's media rows, or get its layer features
(:func:`make_media_decoder` picks one for a configuration).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.context import LlamaBatchExtNative, LlamaContext
from .._core.model import LlamaModel
from .._errors import ClosedError, ContextOverflowError, MultimodalError, SpeculativeError
from ..mtmd import Chunk, Chunks, MTMDContext
from ..speculative import MTPDecoder, SpecConfig, draft_decoder_parts
from ..speculative.drafter import DrafterBase
from ..speculative.engine import DraftDecoder, close_drafters, tell_drafters
from ..speculative.registry import MEDIA_FEATURES, MEDIA_MIRROR, MEDIA_OWN, TypeSpec, find, rows_of, table
from .decode import decode_media

# --------------------------------------------------------------------------------------------
# speculation over media prompts
# --------------------------------------------------------------------------------------------

#: token id a decoder's history holds at each media position (never decoded)
MEDIA_TOKEN = -1
#: the built-in types multimodal chat refuses (the table's ``not_in_media`` rows)
MEDIA_REFUSED_TYPES = frozenset(r.type for r in table() if r.not_in_media)

log = logging.getLogger("llama_cpp.mtmd_chat")


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


class TextHistoryDrafter(DrafterBase):
    """A token drafter told the history's text tokens only: media positions are dropped, as
    llama.cpp's server hands its drafters ``server_tokens::get_text_tokens()`` (n-gram matches run
    across a media span as if it were not there)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._text: list[int] = []
        self._seen = 0                          # history positions folded into _text
        self._media: list[list[int]] = []       # [start, length] runs of media positions

    @property
    def kind(self) -> str:
        return self.inner.kind

    @property
    def n_max(self) -> int:
        return int(self.inner.n_max)

    @property
    def takes_limit(self) -> bool:  # type: ignore[override]
        return bool(self.inner.takes_limit)

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
        self.inner.rewind(self.text_len(n_keep))

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
        self.inner.close()


class MediaDraftModel(DrafterBase):
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
        self.inner.sync(history[:spans[0].p0] if spans else history)

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
        if len(dm.kv_tokens) >= end and dm.kv_tokens[end - 1] == MEDIA_TOKEN:
            return  # spans are decoded whole and in order: the last one in means all are
        L = dm.sync(history)
        for sp in self._spans:
            if sp.p0 + sp.n_pos <= L:
                continue
            if sp.p0 < L:  # never half in; rebuild from before it if it ever is
                L = dm.sync(history[:sp.p0])
            if L < sp.p0:
                dm.decode_at(history[L:sp.p0], L)
            self._decode_media(sp)
            dm.kv_tokens.extend([MEDIA_TOKEN] * sp.n_pos)
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


class MediaFeatureDrafter(DrafterBase):
    """``draft-dflash``/``draft-dspark`` over a media prompt, as llama.cpp's
    ``common_speculative_impl_draft_dflash::process`` takes the target's batches: the target's
    layer features of media rows go into the draft memory at the rows' positions like a text
    token's, except an M-RoPE image's, whose rows share one position (llama.cpp skips those; the
    draft memory jumps over the image, which only an M-RoPE draft's positions allow). Text
    decodes reach the drafter through its own ``observe``."""

    def __init__(self, inner: Any, target: LlamaContext) -> None:
        if target.n_pos_per_embd > 1 and not inner.mrope:
            raise MediaSpeculationError(
                f"{inner.kind} in multimodal chat: the target uses M-RoPE and the draft does not, so the draft "
                "memory cannot jump over an image's positions (llama.cpp's draft context refuses that batch): use "
                "the DFlash draft made for this model family, or an n-gram type")
        self.inner = inner
        self.kind = inner.kind
        self.takes_limit = True
        self.observes = True

    @property
    def n_max(self) -> int:
        return int(self.inner.n_max)

    def observe(self, tokens: Sequence[int], pos0: int, first: int = 0) -> None:
        self.inner.observe(tokens, pos0, first)

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


class MediaNextNDrafter(MediaFeatureDrafter):
    """``draft-mtp`` over a media prompt: the target's NextN rows of a media chunk go into the draft
    memory shifted by one position, at the chunk's mtmd positions (as for text, each position
    pairs with the row one position before; a media position has no token)."""

    def __init__(self, inner: Any, target: LlamaContext) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.takes_limit = True
        self.observes = True
        self._media_rows: list[np.ndarray] = []
        self._fresh = False  # the draft memory was rebuilt for a media prompt since the last begin()

    def observe_media(self, positions: np.ndarray) -> None:
        self._media_rows.append(self.inner.target_rows(positions.shape[0]).copy())

    def end_media(self, span: MediaSpan) -> None:
        h, self._media_rows = np.concatenate(self._media_rows), []
        self.inner.add_media(span.p0, span.n_pos, span.positions, h)
        self._fresh = True

    def rewind(self, n_keep: int) -> None:
        # a media prompt rebuilt the draft memory from a cleared one: the old history says nothing of it
        if not self._fresh:
            self.inner.rewind(n_keep)

    def begin(self, prompt: Sequence[int]) -> None:
        self._fresh = False
        self.inner.begin(prompt)

    def reset(self) -> None:
        self._fresh = False
        self._media_rows = []
        self.inner.reset()


def media_drafter(row: TypeSpec, drafter: Any, target: LlamaContext) -> Any:
    """``drafter`` (of type ``row``) as a view of a history with media positions (``row.media``)."""
    if row.media == MEDIA_OWN:
        return MediaNextNDrafter(drafter, target)
    if row.media == MEDIA_MIRROR:
        return MediaDraftModel(drafter, target)
    if row.media == MEDIA_FEATURES:
        return MediaFeatureDrafter(drafter, target)
    return TextHistoryDrafter(drafter)


def media_drafters(drafters: Sequence[Any], target: LlamaContext) -> list[Any]:
    """``drafters`` (from :func:`~llama_cpp.speculative.build_drafters`) wrapped for a history with
    media positions (by the row of each one's ``kind``); on failure every drafter is closed."""
    out: list[Any] = []
    try:
        for d in drafters:
            row = find(d.kind)
            out.append(media_drafter(row, d, target) if row is not None else TextHistoryDrafter(d))
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


class MediaHistory:
    """What both media decoders share: ``n_ctx`` as positions left to the history (the context's
    cells less what media rows take beyond their positions), the prompt's media spans, and the
    drafters that must be told about them."""

    MEDIA_TOKEN = MEDIA_TOKEN
    _mbatch: LlamaBatchExtNative | None = None
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

    def prefill_chunks(self, mctx: MTMDContext, chunks: Chunks) -> None:
        """Make the sequence the chunks' contents; the last text token stays pending.

        The memories are cleared first (a media prompt is not matched against the history).
        """
        self._live()  # type: ignore[attr-defined]
        items = list(chunks)
        excess = check_media_prompt(items, self._n_cells)
        t0 = time.perf_counter()
        old = self.history  # type: ignore[attr-defined]
        self._clear_memories()  # type: ignore[attr-defined]
        self._reset_state()
        self._dirty = True  # until the whole prompt is in
        spans, n_new = self._fill(mctx, items)
        self._dirty = False
        self._excess, self._spans = excess, tuple(spans)
        self._tell_media(self.drafters, old, self._kv)  # type: ignore[attr-defined]
        self.stats.prefill_tokens += n_new  # type: ignore[attr-defined]
        self.stats.t_prefill += time.perf_counter() - t0  # type: ignore[attr-defined]

    def _open_media(self) -> None:
        """A constructor's last step: the batch media chunks are decoded through."""
        try:
            self._mbatch = LlamaBatchExtNative(self._target)  # type: ignore[attr-defined]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the media batch, the drafters and the target context (if the decoder created it)."""
        if self._mbatch is not None:  # before the context it points into
            self._mbatch.close()
            self._mbatch = None
        super().close()

    def _add_text(self, tokens: list[int]) -> None:
        self._decode(tokens, len(self._kv), outputs=False)
        self._kv.extend(tokens)

    def _add_media(self, mctx: MTMDContext, ch: Chunk) -> MediaSpan:
        """Decode one media chunk on the target at its mtmd positions; the history holds MEDIA_TOKEN there."""
        kv = self._kv
        if self._mbatch is None:
            raise ClosedError("this speculative decoder is closed; create a new one")
        rows = mctx.encode(ch)
        pos = mctx.positions(ch, len(kv))
        feature = [d for d in self._drafters if isinstance(d, MediaFeatureDrafter)]  # NextN included

        def after(chunk: np.ndarray) -> None:
            for d in feature:
                d.observe_media(chunk)

        decode_media(self._live(), self._mbatch, rows, pos, mctx.use_non_causal(ch), output_last=False,
                      after=after if feature else None)
        span = MediaSpan(len(kv), ch.n_pos, rows, pos)
        kv.extend([MEDIA_TOKEN] * ch.n_pos)
        for d in feature:
            d.end_media(span)
        return span

    def _tell_media(self, drafters: Sequence[Any], old: Sequence[int], history: list[int]) -> None:
        for d in drafters:
            if isinstance(d, MediaDraftModel):
                d.set_media(self._spans, history)
        tell_drafters(drafters, old, history)

    def save_state(self) -> Any:
        if self._spans:
            raise SpeculativeError("the state of a prompt with media is not saved (its media rows are not in "
                                   "kv_tokens): prefill it again instead")
        return super().save_state()  # type: ignore[misc]


class MultimodalMTPDecoder(MediaHistory, MTPDecoder):
    """:class:`~llama_cpp.speculative.MTPDecoder` that also takes media chunks in its prompt (and
    the n-gram types or ``draft-simple`` alongside, told about the media as
    :class:`MultimodalDraftDecoder` tells them): the NextN drafter mirrors each media chunk's
    shifted rows into its draft memory (:class:`MediaNextNDrafter`)."""

    def __init__(self, model: LlamaModel, ctx_params: dict[str, Any] | None, config: SpecConfig,
                 **kwargs: Any) -> None:
        super().__init__(model, ctx_params, config, wrap=media_drafter, **kwargs)
        self._open_media()


class MultimodalDraftDecoder(MediaHistory, DraftDecoder):
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
                 target: LlamaContext | None = None, prompt_lookup: Any = None, draft_model: Any = None) -> None:
        target, drafters, owns = draft_decoder_parts(model, config, target=target, ctx_params=ctx_params,
                                                     prompt_lookup=prompt_lookup, wrap=media_drafter,
                                                     draft_model=draft_model)
        super().__init__(model, target, config, drafters, owns_target=owns)
        self._open_media()


def check_media_types(config: SpecConfig) -> None:
    """Refuse the speculative types that cannot draft over media positions (the table's ``not_in_media``)."""
    refused = [r for r in rows_of(config) if r.not_in_media]
    if refused:
        drafts = [r.name for r in table() if not r.not_in_media and r.needs]
        tokens = [r.name for r in table() if not r.not_in_media and not r.needs]
        raise MediaSpeculationError(
            f"multimodal chat does not speculate with {', '.join(r.name for r in refused)} ({refused[0].not_in_media}): "
            f"use {', '.join(drafts)} or an n-gram type ({', '.join(tokens)}), or no speculation")


def make_media_decoder(model: LlamaModel, config: SpecConfig, *, target: LlamaContext | None = None,
                       ctx_params: dict[str, Any] | None = None,
                       prompt_lookup: Any = None, draft_model: Any = None) -> MultimodalMTPDecoder | MultimodalDraftDecoder:
    """:func:`~llama_cpp.speculative.make_decoder` for prompts that may hold media: a
    :class:`MultimodalMTPDecoder` when ``config`` includes ``draft-mtp``, else a
    :class:`MultimodalDraftDecoder`; over ``target`` (borrowed) or a context made from ``ctx_params``."""
    check_media_types(config)
    if config.needs_nextn:
        return MultimodalMTPDecoder(model, ctx_params, config, target=target, prompt_lookup=prompt_lookup,
                                    draft_model=draft_model)
    return MultimodalDraftDecoder(model, ctx_params, config, target=target, prompt_lookup=prompt_lookup,
                                  draft_model=draft_model)


# the public module's path, as before the split (reprs, pickles): llama_cpp.mtmd_chat re-exports them
for _cls in (MediaSpeculationError, MediaSpan, TextHistoryDrafter, MediaDraftModel, MediaFeatureDrafter, MediaNextNDrafter,
             MediaHistory, MultimodalMTPDecoder, MultimodalDraftDecoder):
    _cls.__module__ = "llama_cpp.mtmd_chat"

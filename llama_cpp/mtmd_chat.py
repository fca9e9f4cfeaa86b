"""Multimodal chat: OpenAI-style messages with images/audio, rendered by the model's chat template.

The flow, per request:

1. every message's content is flattened to text with one media marker where each image/audio
   part was (``image_url`` parts take ``data:`` URLs, ``file://`` URLs and local paths; nothing is
   ever fetched from the network), and the model's chat template (sandboxed Jinja, see
   :mod:`llama_cpp.llama_chat_format`) renders the conversation;
2. mtmd tokenizes the prompt into text and media chunks; media chunks are encoded by the
   projector and decoded at the positions mtmd reports (M-RoPE sections where the model uses
   them, causal attention off for projectors that ask for it);
3. tokens are sampled by a llama.cpp sampler chain and streamed as OpenAI chat chunks.

With ``speculative=SpecConfig(...)`` (MTP), the prompt goes through :class:`MultimodalMTPDecoder`,
which extends the text MTP engine (:class:`~llama_cpp.speculative.MTPDecoder`) with media spans:
the image rows are decoded on the target at their mtmd positions, and the MTP draft context is
caught up over the same positions with the target's hidden states shifted by one
(``h_{p-1}`` at position ``p``), so drafting continues right after the image. Rollback,
checkpoints and statistics are the text engine's.

Media rows on the draft: llama.cpp's extended batch cannot yet carry both a media embedding and
a hidden state for one entry (``llama_batch_ext_set_embd_state`` is a stub), and for an
embedding-only entry the MTP graph reads the same row as token embedding and hidden state. The
draft therefore sees ``h_{p-1}`` in both slots over a media span. This only affects how often
drafts are accepted near the image; the emitted tokens are always the target's (greedy output is
identical with and without MTP).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

from . import llama_chat_format as _chat
from ._errors import ClosedError, ContextOverflowError, MultimodalError, SpeculativeError
from ._internals import LlamaBatchExtNative, LlamaContext, LlamaModel, LlamaSampler
from .mtmd import Audio, Chunk, Chunks, Image, MTMDContext
from .speculative import MTPDecoder, SpecConfig, SpeculativeStats, check_model_file

log = logging.getLogger("llama_cpp.mtmd_chat")

_AUDIO_FORMATS = {"wav", "mp3", "flac"}


# --------------------------------------------------------------------------------------------
# messages -> prompt + media
# --------------------------------------------------------------------------------------------

def _decode_data_url(url: str, where: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep:
        raise MultimodalError(f"{where}: malformed data URL (no ',' after the media type)")
    try:
        if head.endswith(";base64"):
            return base64.b64decode(payload, validate=True)
        return unquote(payload).encode("latin-1")
    except (binascii.Error, ValueError, UnicodeEncodeError) as e:
        raise MultimodalError(f"{where}: the data URL's payload is not valid base64 ({e})") from None


def image_from_url(url: Any, where: str = "image_url") -> Image:
    """An :class:`Image` from an OpenAI ``image_url``: a ``data:`` URL, ``file://`` URL or local path."""
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise MultimodalError(f"{where}: expected a URL string or {{'url': ...}}, got {type(url).__name__}")
    if url.startswith("data:"):
        return Image(_decode_data_url(url, where))
    parsed = urlparse(url)
    if parsed.scheme in ("http", "https", "ftp"):
        raise MultimodalError(
            f"{where}: remote URLs are not fetched ({parsed.scheme}://...): download the image yourself and "
            "pass a data: URL or a local file path")
    if parsed.scheme == "file":
        return Image(Path(unquote(parsed.path)))
    if parsed.scheme and len(parsed.scheme) > 1:  # "c:" is a Windows drive, not a scheme
        raise MultimodalError(f"{where}: unsupported URL scheme {parsed.scheme!r}: use data:, file:// or a path")
    return Image(Path(url))


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


def flatten_messages(messages: Sequence[dict], marker: str) -> tuple[list[dict], list[Image | Audio]]:
    """Messages with text-only contents (media parts replaced by ``marker``) and the media in order."""
    out: list[dict] = []
    media: list[Image | Audio] = []
    for i, msg in enumerate(_chat.validate_messages(list(messages))):
        content = msg.get("content")
        if isinstance(content, list):
            pieces = []
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if isinstance(part, str):
                    part = {"type": "text", "text": part}
                if not isinstance(part, dict):
                    raise MultimodalError(f"{where}: a content part must be a dict, got {type(part).__name__}")
                kind = part.get("type")
                if kind == "text":
                    text = str(part.get("text", ""))
                    if marker in text:
                        raise MultimodalError(f"{where}: the text contains the media marker {marker!r}; "
                                              "remove it or choose another media_marker")
                    pieces.append(text)
                elif kind == "image_url":
                    media.append(image_from_url(part.get("image_url"), where))
                    pieces.append(marker)
                elif kind in ("image", "input_image"):
                    src = part.get("image", part.get("image_url"))
                    media.append(src if isinstance(src, Image) else Image(src))
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
                  non_causal: bool, *, output_last: bool) -> None:
    """Decode media rows at ``positions`` (split by n_batch unless attention is non-causal)."""
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
    finally:
        if non_causal:
            ctx.set_causal_attn(causal0)


def eval_chunks(mctx: MTMDContext, ctx: LlamaContext, chunks: Chunks, n_past: int = 0) -> int:
    """Evaluate every chunk on sequence 0 of ``ctx`` from ``n_past``; logits of the last entry stay
    available. Returns the new ``n_past`` (the mtmd_helper_eval_chunks equivalent)."""
    items = list(chunks)
    if n_past + chunks.n_pos > ctx.n_ctx():
        raise ContextOverflowError(f"the prompt needs {chunks.n_pos} positions after {n_past}; n_ctx is "
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


class MultimodalMTPDecoder(MTPDecoder):
    """:class:`~llama_cpp.speculative.MTPDecoder` that also takes media chunks in its prompt."""

    #: token id kept in :attr:`kv_tokens` for media positions (never decoded)
    MEDIA_TOKEN = -1

    def prefill_chunks(self, mctx: MTMDContext, chunks: Chunks) -> None:
        """Make the sequence the chunks' contents; the last text token stays pending.

        Both memories are cleared first (a media prompt is not matched against the history).
        """
        tgt, dft = self._live()
        items = list(chunks)
        if not items or items[-1].is_media or items[-1].n_tokens == 0:
            raise MultimodalError("an MTP prompt must end with text (the chat template's generation prompt); "
                                  "add text after the last media item")
        if chunks.n_pos > self.n_ctx:
            raise ContextOverflowError(f"the prompt needs {chunks.n_pos} positions; n_ctx is {self.n_ctx}")
        t0 = time.perf_counter()
        tgt.memory_clear(True)
        dft.memory_clear(True)
        self._reset_state()
        n_new = 0
        for k, ch in enumerate(items):
            if ch.is_media:
                self._extend_media(mctx, ch)
            else:
                toks = [int(t) for t in ch.tokens]
                if k == len(items) - 1:
                    self._id_last = toks[-1]
                    toks = toks[:-1]
                if toks:
                    self.model.check_tokens(toks, "prompt token")
                    self._extend(toks)
            n_new += ch.n_tokens
        self.stats.prefill_tokens += n_new
        self.stats.t_prefill += time.perf_counter() - t0

    def _extend_media(self, mctx: MTMDContext, ch: Chunk) -> None:
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
        self._kv.extend([self.MEDIA_TOKEN] * ch.n_pos)
        self._n_dft = P + ch.n_pos


# --------------------------------------------------------------------------------------------
# sampling and text streaming
# --------------------------------------------------------------------------------------------

def make_sampler(model: LlamaModel, *, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, typical_p: float = 1.0, repeat_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, penalty_last_n: int = 64,
                 seed: int = 0xFFFFFFFF) -> LlamaSampler:
    """A llama.cpp sampler chain (greedy when ``temperature == 0``)."""
    chain = LlamaSampler()
    try:
        if repeat_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0:
            chain.add_penalties(model.n_vocab, int(penalty_last_n), float(repeat_penalty),
                                float(frequency_penalty), float(presence_penalty))
        if temperature == 0:
            chain.add_greedy()
        else:
            chain.add_top_k(int(top_k))
            chain.add_typical(float(typical_p), 1)
            chain.add_top_p(float(top_p), 1)
            chain.add_min_p(float(min_p), 1)
            chain.add_temp(float(temperature))
            chain.add_dist(int(seed) & 0xFFFFFFFF)
    except BaseException:
        chain.close()
        raise
    return chain


def _utf8_complete_len(b: bytes) -> int:
    """Length of the longest prefix of ``b`` that does not end inside a UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c & 0xC0 == 0x80:
            continue
        need = 1 if c < 0x80 else 2 if c >> 5 == 0b110 else 3 if c >> 4 == 0b1110 else 4 if c >> 3 == 0b11110 else 1
        return n if back >= need else n - back
    return n


class _TextStream:
    """Turns tokens into text deltas, holding back partial UTF-8 and possible stop-string prefixes."""

    def __init__(self, model: LlamaModel, stops: Sequence[str]) -> None:
        self.model = model
        self.stops = [s.encode("utf-8") for s in stops if s]
        self.buf = bytearray()
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.buf += self.model.token_to_piece(int(token))
        for s in self.stops:
            at = self.buf.find(s, max(self.sent - len(s), 0))
            if at >= 0:
                self.stopped = True
                out = bytes(self.buf[self.sent:at])
                self.sent = at
                del self.buf[at:]
                return out.decode("utf-8", errors="ignore")
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf) - self.sent), 0, -1):
                if self.buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        end = _utf8_complete_len(bytes(self.buf[: len(self.buf) - hold]))
        if end <= self.sent:
            return ""
        out = bytes(self.buf[self.sent:end])
        self.sent = end
        return out.decode("utf-8", errors="replace")

    def flush(self) -> str:
        out = bytes(self.buf[self.sent:])
        self.sent = len(self.buf)
        return out.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# the chat engine
# --------------------------------------------------------------------------------------------

class MultimodalChat:
    """Chat completions over a text model + projector, with optional MTP speculative decoding.

    ``MultimodalChat(model_path, mmproj_path, speculative=SpecConfig(draft_n_max=3))``; then
    :meth:`create_chat_completion` takes OpenAI-style messages (``image_url`` and
    ``input_audio`` parts) and returns a response dict, or an iterator of chunks with
    ``stream=True``. ``chat_template`` overrides the GGUF template, ``chat_format`` picks a named
    one. Every request re-evaluates the conversation (media prompts are not prefix-cached).
    """

    def __init__(self, model: str | os.PathLike[str] | LlamaModel, mmproj_path: str | os.PathLike[str], *,
                 n_ctx: int = 4096, n_batch: int = 512, n_ubatch: int | None = None,
                 n_threads: int | None = None, n_gpu_layers: int = 0, use_gpu: bool = True,
                 chat_template: str | None = None, chat_format: str | None = None,
                 speculative: SpecConfig | None = None, media_marker: str | None = None,
                 image_min_tokens: int | None = None, image_max_tokens: int | None = None,
                 seed: int = 0xFFFFFFFF) -> None:
        self._closed = False
        self._owned_model: LlamaModel | None = None
        self._mctx: MTMDContext | None = None
        self._ctx: LlamaContext | None = None
        self._mtp: MultimodalMTPDecoder | None = None
        self.speculative = speculative if speculative is not None and speculative.enabled else None
        if isinstance(model, LlamaModel):
            self.model = model
        else:
            if self.speculative is not None:
                check_model_file(model, self.speculative)
            self._owned_model = self.model = LlamaModel(model, n_gpu_layers=n_gpu_layers,
                                                        load_mtp=self.speculative is not None)
        self.seed = int(seed)
        try:
            self._mctx = MTMDContext(mmproj_path, self.model, use_gpu=use_gpu, n_threads=n_threads,
                                     media_marker=media_marker, image_min_tokens=image_min_tokens,
                                     image_max_tokens=image_max_tokens)
            threads = {} if n_threads is None else {"n_threads": n_threads, "n_threads_batch": n_threads}
            params = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch or n_batch, n_seq_max=1, **threads)
            if self.speculative is not None:
                self._mtp = MultimodalMTPDecoder(self.model, params, self.speculative)
            else:
                self._ctx = LlamaContext(self.model, **params)
            self._formatter = self._make_formatter(chat_template, chat_format)
        except BaseException:
            self.close()
            raise
        self.last_speculative_stats: SpeculativeStats | None = None

    def _make_formatter(self, template: str | None, fmt: str | None) -> _chat.Jinja2ChatFormatter:
        m = self.model
        bos = m.token_text(m.token_bos()) if m.token_bos() >= 0 else ""
        eos = m.token_text(m.token_eos()) if m.token_eos() >= 0 else ""
        if fmt is not None:
            return _chat.get_chat_formatter(fmt, bos_token=bos, eos_token=eos)
        template = template or m.chat_template()
        if not template:
            raise MultimodalError("the model has no chat template: pass chat_template=... or chat_format=...")
        return _chat.Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the contexts (and the model if this object loaded it). Idempotent."""
        self._closed = True
        for name in ("_mtp", "_ctx", "_mctx", "_owned_model"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    def __enter__(self) -> MultimodalChat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def mtmd(self) -> MTMDContext:
        if self._closed or self._mctx is None:
            raise ClosedError("this MultimodalChat is closed; create a new one")
        return self._mctx

    # -- prompt ---------------------------------------------------------------------------------
    def render(self, messages: Sequence[dict]) -> tuple[str, list[Image | Audio], list[str], bool]:
        """The rendered prompt, its media, the template's stop strings and whether it has BOS."""
        marker = self.mtmd.marker
        msgs, media = flatten_messages(messages, marker)
        res = self._formatter(messages=msgs)
        if res.prompt.count(marker) != len(media):
            raise MultimodalError(
                f"the chat template kept {res.prompt.count(marker)} of {len(media)} media markers (it drops or "
                "rewrites some message contents): use a template that renders every message's content")
        return res.prompt, media, list(res.stop), bool(res.added_special)

    def tokenize_messages(self, messages: Sequence[dict]) -> tuple[Chunks, list[str]]:
        prompt, media, stops, has_bos = self.render(messages)
        from .mtmd import MarkerPrompt

        chunks = self.mtmd.tokenize(MarkerPrompt(prompt, media), add_special=not has_bos, parse_special=True,
                                    where="prompt")
        return chunks, stops

    # -- generation -----------------------------------------------------------------------------
    def generate_tokens(self, messages: Sequence[dict], *, max_tokens: int | None = None,
                        sampler: LlamaSampler | None = None, **sampling: Any) -> Iterator[int]:
        """Yield generated token ids (the end-of-generation token included, as the last one)."""
        mctx = self.mtmd
        chunks, _ = self.tokenize_messages(messages)
        chain = sampler or make_sampler(self.model, seed=sampling.pop("seed", self.seed), **sampling)
        try:
            yield from self._tokens(mctx, chunks, chain, max_tokens)
        finally:
            chunks.close()
            if sampler is None:
                chain.close()

    def _tokens(self, mctx: MTMDContext, chunks: Chunks, chain: LlamaSampler,
                max_tokens: int | None) -> Iterator[int]:
        if self._mtp is not None:
            dec = self._mtp
            dec.stats.reset()
            room = dec.n_ctx - chunks.n_pos
            limit = room if max_tokens is None or max_tokens <= 0 else min(int(max_tokens), room)
            dec.prefill_chunks(mctx, chunks)
            self.last_speculative_stats = dec.stats
            if limit > 0:
                yield from dec.generate(chain, limit)
            return
        ctx = self._ctx
        if ctx is None:
            raise ClosedError("this MultimodalChat is closed; create a new one")
        ctx.memory_clear(True)
        n_past = eval_chunks(mctx, ctx, chunks)
        room = ctx.n_ctx() - n_past
        limit = room if max_tokens is None or max_tokens <= 0 else min(int(max_tokens), room)
        C, model = ctx._C, self.model
        batch = LlamaBatchExtNative(ctx)
        try:
            for i in range(limit):
                tok = int(C.llama_sampler_sample(chain.ptr, ctx.ptr, -1))
                yield tok
                if model.is_eog(tok) or i == limit - 1:
                    return
                batch.clear()
                batch.add_token(tok, 0, n_past, output=True)
                ctx.process(batch)
                n_past += 1
        finally:
            batch.close()

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
            chain = make_sampler(self.model, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 typical_p=typical_p, repeat_penalty=repeat_penalty,
                                 frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                 seed=self.seed if seed is None else seed)
        except BaseException:
            chunks.close()
            raise
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        name = model or self.model.path.name
        n_prompt = chunks.n_tokens
        gen = self._chunks(mctx, chunks, chain, max_tokens, stops, cid, created, name, n_prompt)
        if stream:
            return gen
        content, finish, usage = [], None, None
        for ch in gen:
            delta = ch["choices"][0]["delta"]
            content.append(delta.get("content") or "")
            finish = ch["choices"][0]["finish_reason"] or finish
            usage = ch.get("usage", usage)
        return {"id": cid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(content)},
                             "logprobs": None, "finish_reason": finish}],
                "usage": usage}

    def _chunks(self, mctx: MTMDContext, chunks: Chunks, chain: LlamaSampler, max_tokens: int | None,
                stops: list[str], cid: str, created: int, name: str, n_prompt: int) -> Iterator[dict]:
        def chunk(delta: dict, finish: str | None) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        text = _TextStream(self.model, stops)
        n_gen = 0
        finish = "length"
        try:
            yield chunk({"role": "assistant"}, None)
            for tok in self._tokens(mctx, chunks, chain, max_tokens):
                n_gen += 1
                if self.model.is_eog(tok):
                    finish = "stop"
                    break
                piece = text.push(tok)
                if piece:
                    yield chunk({"content": piece}, None)
                if text.stopped:
                    finish = "stop"
                    break
            if not text.stopped:
                rest = text.flush()
                if rest:
                    yield chunk({"content": rest}, None)
            last = chunk({}, finish)
            last["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
                             "total_tokens": n_prompt + n_gen}
            yield last
        finally:
            chunks.close()
            chain.close()


class MTMDChatHandler:
    """A ``chat_handler`` for :class:`~llama_cpp.Llama`: ``Llama(model, chat_handler=MTMDChatHandler(mmproj))``.

    Uses the Llama's model and context (its KV cache is reset before and after each request, so
    the Llama's own prompt cache stays consistent). For MTP image chat use :class:`MultimodalChat`.
    """

    def __init__(self, clip_model_path: str | os.PathLike[str], *, n_threads: int | None = None,
                 use_gpu: bool = True, media_marker: str | None = None, verbose: bool = False) -> None:
        self.clip_model_path = Path(clip_model_path)
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

    def __call__(self, *, llama: Any, messages: Sequence[dict], max_tokens: int | None = None,
                 temperature: float = 0.2, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, seed: int | None = None, stop: Any = None, stream: bool = False,
                 model: str | None = None, **unsupported: Any) -> Any:
        bad = sorted(k for k, v in unsupported.items() if v not in (None, False, [], {}))
        if bad:
            raise MultimodalError(f"the multimodal chat handler does not support {', '.join(bad)}")
        mctx = self._context_for(llama)
        engine = MultimodalChat.__new__(MultimodalChat)
        engine._closed = False
        engine._owned_model = None
        engine._mctx = mctx
        engine._ctx = llama.ctx
        engine._mtp = None
        engine.speculative = None
        engine.model = llama.model
        engine.seed = getattr(llama, "_seed", 0xFFFFFFFF)
        engine.last_speculative_stats = None
        engine._formatter = llama._chat_formatter()
        llama.reset()
        result = engine.create_chat_completion(
            messages, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            typical_p=typical_p, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, seed=seed, stop=stop, stream=stream, model=model)
        if not stream:
            llama.reset()
            return result

        def streaming() -> Iterator[dict]:
            try:
                yield from result
            finally:
                llama.reset()
        return streaming()


__all__ = [
    "MTMDChatHandler",
    "MultimodalChat",
    "MultimodalMTPDecoder",
    "eval_chunks",
    "flatten_messages",
    "image_from_url",
    "make_sampler",
]

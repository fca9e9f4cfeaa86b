"""Multimodal inputs through libmtmd: the projector context, media loading, and pooled embeddings.

:class:`MTMDContext` owns one ``mtmd_context`` (a vision and/or audio projector paired with a
text model). :class:`MTMDEmbeddingHandler` turns ordered text/image/audio inputs into one pooled,
normalised ``float32`` row of ``n_embd_out`` per input:

1. each input is tokenized by mtmd into chunks (text tokens, image or audio embeddings);
2. media chunks are encoded by the projector;
3. chunks are decoded into a dedicated embedding context at the positions mtmd reports
   (consecutive for ordinary RoPE, ``mtmd_image_tokens_get_decoder_pos`` sections for M-RoPE
   models, with causal attention switched off for media chunks whose projector asks for it);
4. the per-token output embeddings are pooled (mean / first / last) and normalised.

Pooling happens here rather than in llama.cpp because llama.cpp pools one micro-batch at a time
and one llama batch cannot mix token ids with embedding rows: a "text + image" input always
spans several decodes. The dense output projections some embedding models apply after pooling
are affine, so pooling their per-token outputs gives the same vector.

Every native object (mtmd context, bitmaps, chunk lists, mtmd batches) has exactly one owner
and is freed once; ``close()`` is idempotent.
"""

from __future__ import annotations

import ctypes
import logging
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from ._core.context import LlamaBatchExtNative, LlamaContext
from ._core.model import LlamaModel, check_gguf_file
from ._core.normalize import normalize_embeddings
from ._core.ownership import NativeRef, Owned, unwrap
from ._errors import ClosedError, ContextOverflowError, DecodeError, MultimodalError
from ._safety.cache_files import read_regular_file
from .llama_cpp import LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_MEAN
from .mtmd_cpp import MTMD_INPUT_CHUNK_TYPE_AUDIO, MTMD_INPUT_CHUNK_TYPE_IMAGE, MTMD_INPUT_CHUNK_TYPE_TEXT

log = logging.getLogger("llama_cpp.mtmd")

_CHUNK_NAMES = {MTMD_INPUT_CHUNK_TYPE_TEXT: "text", MTMD_INPUT_CHUNK_TYPE_IMAGE: "image",
                MTMD_INPUT_CHUNK_TYPE_AUDIO: "audio"}

POOLING_NAMES = {"mean": LLAMA_POOLING_TYPE_MEAN, "cls": LLAMA_POOLING_TYPE_CLS, "last": LLAMA_POOLING_TYPE_LAST}
_POOLING_BY_ID = {v: k for k, v in POOLING_NAMES.items()}

# mtmd_tokenize / mtmd_tokenize_from_parts return codes
_TOKENIZE_ERRORS = {
    1: "the number of media items does not match the number of media markers in the prompt",
    2: "the projector could not preprocess a media item (unsupported size or content)",
}


def _M() -> Any:
    """The mtmd binding module, with the native libraries loaded."""
    from . import mtmd_cpp as M
    from ._native import loader as _loader

    _loader.load()
    _loader.library_handle("mtmd")
    return M


def default_marker() -> str:
    """mtmd's default media marker (``mtmd_default_marker()``, ``<__media__>`` in this tree)."""
    raw = _M().mtmd_default_marker()
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


# --------------------------------------------------------------------------------------------
# input parts
# --------------------------------------------------------------------------------------------

MediaSource = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, np.ndarray]


@dataclass(frozen=True)
class Image:
    """An image part: a file path, encoded file bytes (PNG/JPEG/BMP/GIF…), or a ``uint8`` RGB
    array of shape ``(height, width, 3)``."""

    source: MediaSource


@dataclass(frozen=True)
class Audio:
    """An audio part: a file path, encoded file bytes (WAV/MP3/FLAC), or mono ``float32`` PCM
    samples at the projector's sample rate (``MTMDContext.audio_sample_rate``)."""

    source: MediaSource


@dataclass(frozen=True)
class MarkerPrompt:
    """A prompt with one media marker per item of ``media`` (in order)."""

    text: str
    media: Sequence[Any] = ()


@dataclass(frozen=True)
class Text:
    """A text part whose special-token parsing is its own (a plain ``str`` part follows the call's
    ``parse_special``): a chat prompt's template text is parsed, a message's content is not."""

    text: str
    parse_special: bool = False


Part = Union[str, Text, Image, Audio, np.ndarray, bytes, "os.PathLike[str]"]
Input = Union[str, MarkerPrompt, dict, Sequence[Part], Image, Audio, np.ndarray, bytes, "os.PathLike[str]"]


def _as_media(part: Any, where: str) -> Image | Audio | None:
    """Classify one part: Image/Audio, or None for text. Bare arrays, bytes and paths are media."""
    if isinstance(part, (Image, Audio)):
        return part
    if isinstance(part, np.ndarray):
        if part.dtype == np.uint8:
            return Image(part)
        if part.dtype.kind == "f" and part.ndim == 1:
            return Audio(part)
        raise MultimodalError(
            f"{where}: cannot tell what a {part.dtype} array of shape {part.shape} is: pass a uint8 "
            "(height, width, 3) RGB array for an image or a 1-D float32 PCM array for audio, or wrap it "
            "in Image(...)/Audio(...)")
    if isinstance(part, (bytes, bytearray, memoryview)):
        return _Auto(bytes(part))
    if isinstance(part, os.PathLike):
        return _Auto(part)
    if isinstance(part, (str, Text)):
        return None
    raise MultimodalError(
        f"{where}: unsupported part of type {type(part).__name__}: use str for text, Image(...) / "
        "Audio(...), a pathlib.Path, file bytes, or a NumPy array")


_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"8BPS", b"#?RADIANCE",
                b"#?RGBE", b"P1", b"P2", b"P3", b"P4", b"P5", b"P6")


def _sniff(data: bytes, label: str) -> str | None:
    """``"image"``, ``"audio"`` or None from a file's leading bytes (the formats mtmd's helper reads)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE" or data[:4] == b"fLaC" or data[:3] == b"ID3":
        return "audio"
    if len(data) > 1 and data[0] == 0xFF and (data[1] & 0xE0) == 0xE0 and data[:3] != b"\xff\xd8\xff":
        return "audio"  # MPEG audio frame sync
    if any(data.startswith(m) for m in _IMAGE_MAGIC):
        return "image"
    if label.lower().endswith(".tga)") and len(data) >= 18:
        return "image"  # TGA has no signature; trust the file name
    return None


class _Auto(Image):
    """Media whose kind mtmd detects from the file contents (bare bytes or a Path)."""


def normalize_input(item: Any, where: str = "input") -> tuple[str, list[Any]] | list[Any]:
    """One input as either ``(marker_prompt, media)`` or a list of parts."""
    if isinstance(item, MarkerPrompt):
        return item.text, list(item.media)
    if isinstance(item, dict):
        if "prompt" not in item:
            raise MultimodalError(f"{where}: a dict input needs 'prompt' (and 'media'); got keys {sorted(item)}")
        media = item.get("media", ())
        if isinstance(media, (str, bytes)) or not isinstance(media, Iterable):
            media = [media]
        return str(item["prompt"]), list(media)
    if isinstance(item, str):
        return item, []
    if isinstance(item, (list, tuple)):
        if not item:
            raise MultimodalError(f"{where} is empty: give at least one text or media part")
        return list(item)
    if _as_media(item, where) is not None:
        return [item]
    raise MultimodalError(f"{where}: unsupported input of type {type(item).__name__}")


def iter_inputs(inputs: Any) -> list[Any]:
    """The list of inputs in ``inputs`` (a single input is a list of one)."""
    if isinstance(inputs, (str, MarkerPrompt, dict, Image, Audio, np.ndarray, bytes, bytearray, os.PathLike)):
        return [inputs]
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise MultimodalError("no inputs given: pass one input or a list of inputs")
        return list(inputs)
    raise MultimodalError(f"inputs must be an input or a list of inputs, not {type(inputs).__name__}")


# --------------------------------------------------------------------------------------------
# native owners
# --------------------------------------------------------------------------------------------

class Bitmap(Owned):
    """One ``mtmd_bitmap`` (image pixels or audio samples), freed once."""

    _kind = "bitmap"

    def __init__(self, ptr: int, M: Any, is_audio: bool, source: str) -> None:
        self._ref = None
        if not ptr:
            raise MultimodalError(f"{source}: mtmd could not create a bitmap")
        self._own(ptr, M.mtmd_bitmap_free)
        self.is_audio = bool(is_audio)
        self.source = source


@dataclass
class Chunk:
    """One tokenized chunk: text tokens, or the placeholder of an image/audio span."""

    index: int
    type: int
    n_tokens: int
    n_pos: int
    tokens: np.ndarray | None  # int32 token ids for text chunks
    id: str | None
    ptr: int = field(repr=False, default=0)  # borrowed from the owning Chunks

    @property
    def kind(self) -> str:
        return _CHUNK_NAMES.get(self.type, f"type {self.type}")

    @property
    def is_media(self) -> bool:
        return self.type != MTMD_INPUT_CHUNK_TYPE_TEXT


class Chunks(Owned):
    """An ``mtmd_input_chunks`` list produced by ``mtmd_tokenize``; owns every chunk in it."""

    _kind = "chunk list"

    def __init__(self, ptr: int, M: Any, ctx_ref: NativeRef) -> None:
        self._ref = None
        if not ptr:
            raise MultimodalError("mtmd_input_chunks_init failed (out of memory)")
        self._own(ptr, M.mtmd_input_chunks_free, [ctx_ref])
        self._M = M
        self.items: list[Chunk] = []

    def _read(self) -> None:
        M, p = self._M, self._ptr()
        items = []
        for i in range(int(M.mtmd_input_chunks_size(p))):
            ch = M.mtmd_input_chunks_get(p, i)
            kind = int(M.mtmd_input_chunk_get_type(ch))
            tokens = None
            if kind == MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                tp = M.mtmd_input_chunk_get_tokens_text(ch, ctypes.byref(n))
                tokens = (np.ctypeslib.as_array(tp, shape=(n.value,)).astype(np.int32, copy=True)
                          if n.value else np.zeros(0, dtype=np.int32))
            raw_id = M.mtmd_input_chunk_get_id(ch)
            items.append(Chunk(
                index=i, type=kind, n_tokens=int(M.mtmd_input_chunk_get_n_tokens(ch)),
                n_pos=int(M.mtmd_input_chunk_get_n_pos(ch)), tokens=tokens,
                id=raw_id.decode("utf-8", "replace") if raw_id else None, ptr=int(ch)))
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Chunk]:
        self._ptr()
        return iter(self.items)

    @property
    def n_tokens(self) -> int:
        return sum(c.n_tokens for c in self.items)

    @property
    def n_pos(self) -> int:
        return sum(c.n_pos for c in self.items)


class _MtmdBatch(Owned):
    """An ``mtmd_batch`` (several media chunks encoded in one projector pass)."""

    _kind = "mtmd batch"

    def __init__(self, M: Any, ctx_ref: NativeRef) -> None:
        self._ref = None
        ptr = M.mtmd_batch_init(ctx_ref.ptr)
        if not ptr:
            raise MultimodalError("mtmd_batch_init failed")
        self._own(ptr, M.mtmd_batch_free, [ctx_ref])


# --------------------------------------------------------------------------------------------
# the projector context
# --------------------------------------------------------------------------------------------

class MTMDContext(Owned):
    """An ``mtmd_context``: a projector (``mmproj`` GGUF) paired with a text model.

    The text model is kept alive while this context exists. Media items become :class:`Bitmap`
    objects, prompts become :class:`Chunks`, media chunks are encoded with :meth:`encode`.
    """

    _kind = "mtmd context"

    def __init__(self, mmproj_path: str | os.PathLike[str], model: LlamaModel, *, use_gpu: bool = True,
                 n_threads: int | None = None, media_marker: str | None = None, warmup: bool = False,
                 image_min_tokens: int | None = None, image_max_tokens: int | None = None,
                 batch_max_tokens: int | None = None, flash_attn_type: int | None = None) -> None:
        self._ref = None
        path = check_gguf_file(mmproj_path)
        model = unwrap(model)  # Llama.model (the pointer) stands for its LlamaModel
        if not isinstance(model, LlamaModel):
            raise TypeError(f"model must be a llama_cpp._internals.LlamaModel, not {type(model).__name__}")
        if model.vocab_only:
            raise MultimodalError("the text model was opened with vocab_only=True; mtmd needs its weights")
        M = _M()
        p = M.mtmd_context_params_default()
        p.use_gpu = bool(use_gpu)
        p.print_timings = False
        p.warmup = bool(warmup)
        if n_threads is not None:
            if int(n_threads) <= 0:
                raise ValueError(f"n_threads must be positive, got {n_threads}")
            p.n_threads = int(n_threads)
        marker_b = None
        if media_marker is not None:
            if not media_marker:
                raise MultimodalError("media_marker must not be empty")
            marker_b = media_marker.encode("utf-8")
            p.media_marker = marker_b
        if image_min_tokens is not None:
            p.image_min_tokens = int(image_min_tokens)
        if image_max_tokens is not None:
            p.image_max_tokens = int(image_max_tokens)
        if batch_max_tokens is not None:
            p.batch_max_tokens = int(batch_max_tokens)
        if flash_attn_type is not None:
            p.flash_attn_type = int(flash_attn_type)
        model_ref = model.native_ref
        if model_ref is None:
            raise ClosedError("the text model is closed; load it again")
        ptr = M.mtmd_init_from_file(os.fsencode(path), model.ptr, p)
        del marker_b
        if not ptr:
            raise MultimodalError(
                f"libmtmd could not load the projector {path}: it is not an mmproj file, uses a projector "
                f"type this build does not support, or its output width differs from the text model's "
                f"input width (n_embd_inp={model.n_embd_inp()}); use the mmproj that belongs to this model")
        self._own(ptr, M.mtmd_free, [model_ref])
        self._M = M
        self.path = path
        self.model = model
        self.n_embd = int(model.n_embd_inp())
        self.support_vision = bool(M.mtmd_support_vision(ptr))
        self.support_audio = bool(M.mtmd_support_audio(ptr))
        self.audio_sample_rate = int(M.mtmd_get_audio_sample_rate(ptr))
        self.use_mrope = bool(M.mtmd_decode_use_mrope(ptr))
        raw = M.mtmd_get_marker(ptr)
        self.marker = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        self.n_pos_per_embd = 4 if self.use_mrope else 1

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("vision" if self.support_vision else "") + (
            "+audio" if self.support_audio else "")
        return f"<MTMDContext {self.path.name} {state}>"

    # -- media --------------------------------------------------------------------------------
    def bitmap(self, part: Any, where: str = "media") -> Bitmap:
        """A bitmap from an :class:`Image`/:class:`Audio` part (or a bare array/bytes/Path)."""
        media = _as_media(part, where)
        if media is None:
            raise MultimodalError(f"{where}: a text string is not a media item")
        M, ctx = self._M, self._ptr()
        src = media.source
        want = None if isinstance(media, _Auto) else ("audio" if isinstance(media, Audio) else "image")
        if isinstance(src, np.ndarray):
            if want == "image":
                return self._image_array(src, where)
            return self._audio_array(src, where)
        if isinstance(src, (bytes, bytearray, memoryview)):
            data, label = bytes(src), f"{where} ({len(src)} bytes)"
        elif isinstance(src, (str, os.PathLike)):
            fpath = Path(os.fspath(src))
            label = f"{where} ({fpath})"
            try:  # regular files only (a FIFO would block); one answer for missing, folder or unreadable
                data = read_regular_file(fpath)
            except (OSError, ValueError):
                raise MultimodalError(f"{label}: no readable media file there (file not found, not a regular "
                                      "file, or not readable)") from None
        else:
            raise MultimodalError(f"{where}: unsupported media source of type {type(src).__name__}")
        if not data:
            raise MultimodalError(f"{label}: the media file is empty")
        sniffed = _sniff(data, label)
        if sniffed is None:
            # checked here so that unknown bytes never reach mtmd's video fallback (which spawns ffprobe)
            raise MultimodalError(
                f"{label}: not a readable image or audio file (images: PNG, JPEG, BMP, GIF, TGA, PSD, HDR, "
                "PNM; audio: WAV, MP3, FLAC)")
        buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        w = M.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False, M.mtmd_helper_init_opt_default())
        if w.video_ctx:
            M.mtmd_helper_video_free(w.video_ctx)
        if not w.bitmap:
            raise MultimodalError(
                f"{label}: not a readable image or audio file (images: PNG, JPEG, BMP, GIF, TGA, PSD, HDR, "
                f"PNM; audio: WAV, MP3, FLAC{'' if self.support_audio else ' (this projector has no audio encoder)'})")
        bm = Bitmap(int(w.bitmap), M, bool(M.mtmd_bitmap_is_audio(w.bitmap)), label)
        kind = "audio" if bm.is_audio else "image"
        if want is not None and kind != want:
            bm.close()
            raise MultimodalError(f"{label}: the file holds {kind}, but it was given as {want}")
        self._check_kind(kind, label)
        return bm

    def _check_kind(self, kind: str, label: str) -> None:
        if kind == "image" and not self.support_vision:
            raise MultimodalError(f"{label}: this projector ({self.path.name}) has no vision encoder; "
                                  "use a vision mmproj for images")
        if kind == "audio" and not self.support_audio:
            raise MultimodalError(f"{label}: this projector ({self.path.name}) has no audio encoder; "
                                  "use an audio mmproj for audio")

    def _image_array(self, arr: np.ndarray, where: str) -> Bitmap:
        if arr.dtype != np.uint8:
            raise MultimodalError(f"{where}: image arrays must be uint8 RGB, got dtype {arr.dtype} "
                                  "(convert with np.clip(a * 255, 0, 255).astype(np.uint8))")
        if arr.ndim != 3 or arr.shape[2] != 3:
            raise MultimodalError(f"{where}: image arrays must have shape (height, width, 3) in RGB order, "
                                  f"got {arr.shape}")
        h, w = int(arr.shape[0]), int(arr.shape[1])
        if h == 0 or w == 0:
            raise MultimodalError(f"{where}: image array is empty (shape {arr.shape})")
        if h > 1 << 15 or w > 1 << 15:
            raise MultimodalError(f"{where}: image of {w}x{h} pixels is too large (max 32768 per side)")
        self._check_kind("image", where)
        a = np.ascontiguousarray(arr)
        M = self._M
        ptr = M.mtmd_bitmap_init(w, h, a.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
        return Bitmap(int(ptr or 0), M, False, where)

    def _audio_array(self, arr: np.ndarray, where: str) -> Bitmap:
        if arr.dtype.kind != "f":
            raise MultimodalError(f"{where}: audio arrays must be float32 PCM samples, got dtype {arr.dtype}")
        if arr.ndim != 1:
            raise MultimodalError(f"{where}: audio arrays must be 1-D mono PCM, got shape {arr.shape} "
                                  "(mix channels down first)")
        if arr.size == 0:
            raise MultimodalError(f"{where}: audio array is empty")
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.all(np.isfinite(a)):
            raise MultimodalError(f"{where}: audio samples contain NaN or infinity")
        self._check_kind("audio", where)
        M = self._M
        ptr = M.mtmd_bitmap_init_from_audio(a.size, a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        return Bitmap(int(ptr or 0), M, True, where)

    # -- tokenization --------------------------------------------------------------------------
    def tokenize(self, item: Any, *, add_special: bool = True, parse_special: bool = False,
                 where: str = "input") -> Chunks:
        """Tokenize one input (a marker prompt or a list of parts) into :class:`Chunks`."""
        M, ctx = self._M, self._ptr()
        norm = normalize_input(item, where)
        bitmaps: list[Bitmap] = []
        keep: list[Any] = []
        chunks = Chunks(M.mtmd_input_chunks_init(), M, self._ref)
        try:
            if isinstance(norm, tuple):
                text, media = norm
                n_markers = text.count(self.marker)
                if n_markers != len(media):
                    raise MultimodalError(
                        f"{where}: the prompt has {n_markers} media marker(s) {self.marker!r} but "
                        f"{len(media)} media item(s) were given; put exactly one marker where each item goes")
                for k, m in enumerate(media):
                    bitmaps.append(self.bitmap(m, f"{where} media[{k}]"))
                tb = text.encode("utf-8")
                it = M.mtmd_input_text(tb, len(tb), bool(add_special), bool(parse_special))
                arr = (M.mtmd_bitmap_p * max(len(bitmaps), 1))(*[b.ptr for b in bitmaps])
                keep += [tb, it, arr]
                rc = int(M.mtmd_tokenize(ctx, chunks.ptr, ctypes.byref(it), arr, len(bitmaps)))
            else:
                parts_c = []
                for k, part in enumerate(norm):
                    if _as_media(part, f"{where} part[{k}]") is None:
                        special = part.parse_special if isinstance(part, Text) else parse_special
                        tb = (part.text if isinstance(part, Text) else str(part)).encode("utf-8")
                        it = M.mtmd_input_text(tb, len(tb), False, bool(special))
                        keep += [tb, it]
                        parts_c.append(M.mtmd_input_part(ctypes.pointer(it), None))
                    else:
                        bm = self.bitmap(part, f"{where} part[{k}]")
                        bitmaps.append(bm)
                        parts_c.append(M.mtmd_input_part(None, bm.ptr))
                keep += parts_c
                ptrs = (M.mtmd_input_part_p * len(parts_c))(*[ctypes.pointer(pc) for pc in parts_c])
                keep.append(ptrs)
                rc = int(M.mtmd_tokenize_from_parts(ctx, chunks.ptr, ptrs, len(parts_c), bool(add_special)))
            if rc != 0:
                raise MultimodalError(f"{where}: mtmd_tokenize failed ({rc}): "
                                      f"{_TOKENIZE_ERRORS.get(rc, 'unknown error')}")
            chunks._read()
        except BaseException:
            chunks.close()
            raise
        finally:
            for b in bitmaps:  # the chunks hold preprocessed copies
                b.close()
            del keep
        if chunks.n_tokens == 0:
            chunks.close()
            raise MultimodalError(f"{where} produced no tokens: give some text or media")
        return chunks

    # -- encoding ------------------------------------------------------------------------------
    def encode(self, chunk: Chunk) -> np.ndarray:
        """Encode one media chunk; returns a ``(n_tokens, n_embd)`` float32 copy."""
        M, ctx = self._M, self._ptr()
        if not chunk.is_media:
            raise ValueError(f"chunk {chunk.index} is text; only image/audio chunks are encoded")
        rc = int(M.mtmd_encode_chunk(ctx, chunk.ptr))
        if rc != 0:
            raise MultimodalError(f"mtmd_encode_chunk failed ({rc}) on the {chunk.kind} chunk {chunk.index}")
        p = M.mtmd_get_output_embd(ctx)
        if not p:
            raise MultimodalError(f"mtmd produced no embeddings for the {chunk.kind} chunk {chunk.index}")
        return np.ctypeslib.as_array(p, shape=(chunk.n_tokens * self.n_embd,)).reshape(
            chunk.n_tokens, self.n_embd).copy()

    def encode_many(self, chunks: Sequence[Chunk]) -> list[np.ndarray]:
        """Encode several media chunks, batching them in one projector pass where mtmd allows."""
        M = self._M
        self._ptr()
        out: list[np.ndarray] = []
        i = 0
        while i < len(chunks):
            if len(chunks) - i == 1:
                out.append(self.encode(chunks[i]))
                i += 1
                continue
            batch = _MtmdBatch(M, self._ref)
            try:
                bp = batch.ptr
                members = []
                for ch in chunks[i:]:
                    rc = int(M.mtmd_batch_add_chunk(bp, ch.ptr))
                    if rc != 0:
                        if not members:
                            raise MultimodalError(f"mtmd_batch_add_chunk failed ({rc}) on chunk {ch.index}")
                        break
                    members.append(ch)
                rc = int(M.mtmd_batch_encode(bp))
                if rc != 0:
                    raise MultimodalError(f"mtmd_batch_encode failed ({rc})")
                for ch in members:
                    p = M.mtmd_batch_get_output_embd(bp, ch.ptr)
                    if not p:
                        raise MultimodalError(f"mtmd returned no embeddings for the {ch.kind} chunk {ch.index}")
                    out.append(np.ctypeslib.as_array(p, shape=(ch.n_tokens * self.n_embd,)).reshape(
                        ch.n_tokens, self.n_embd).copy())
                i += len(members)
            finally:
                batch.close()
        return out

    def use_non_causal(self, chunk: Chunk) -> bool:
        """Whether this media chunk must be decoded with causal attention off."""
        return bool(self._M.mtmd_decode_use_non_causal(self._ptr(), chunk.ptr))

    def positions(self, chunk: Chunk, n_past: int) -> np.ndarray:
        """Decoder positions of a chunk placed at ``n_past``: ``(n_tokens, n_pos_per_embd)`` int32.

        Text tokens take one position each. Media rows take consecutive positions, except under
        M-RoPE where image rows take the (t, y, x, z) sections mtmd reports and audio rows the
        same consecutive position in every section (as ``mtmd_helper_decode_image_chunk`` does).
        Text chunks always have one column.
        """
        n = chunk.n_tokens
        if chunk.type == MTMD_INPUT_CHUNK_TYPE_TEXT or not self.use_mrope:
            return (n_past + np.arange(n, dtype=np.int32))[:, None]
        if chunk.type == MTMD_INPUT_CHUNK_TYPE_AUDIO:
            return np.repeat((n_past + np.arange(n, dtype=np.int32))[:, None], 4, axis=1)
        M = self._M
        img = M.mtmd_input_chunk_get_tokens_image(chunk.ptr)
        if not img:
            raise MultimodalError(f"image chunk {chunk.index} has no image tokens")
        out = (M.mtmd_decoder_pos * n)()
        M.mtmd_helper_image_get_decoder_pos(img, int(n_past), out)
        raw = np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_uint32)), shape=(n, 4))
        # section order of M-RoPE input positions: t, y (height), x (width), z
        return np.ascontiguousarray(raw[:, [0, 2, 1, 3]].astype(np.int32))


# --------------------------------------------------------------------------------------------
# normalisation (llama.cpp's --embd-normalize convention)
# --------------------------------------------------------------------------------------------

def normalize_rows(rows: np.ndarray, normalize: float) -> np.ndarray:
    """Normalise each row as ``common_embd_normalize`` does: -1 none, 0 max-abs (int16 range),
    1 L1, 2 L2, p > 2 p-norm (the same function as :class:`~llama_cpp.LlamaEmbedding` uses)."""
    mode = -1 if normalize is None else normalize
    if mode != int(mode):
        raise ValueError(f"normalize must be an integer (-1, 0, 1, 2 or p > 2), got {normalize}")
    return normalize_embeddings(np.asarray(rows, dtype=np.float64), int(mode))


# --------------------------------------------------------------------------------------------
# embeddings
# --------------------------------------------------------------------------------------------

@dataclass
class Placement:
    """Where one chunk of an input sits in the decoder: first position and every row's position."""

    chunk: Chunk
    start: int
    positions: np.ndarray  # (n_tokens, 1) or (n_tokens, 4)
    non_causal: bool


@dataclass
class _SeqState:
    seq_id: int
    index: int
    chunks: Chunks
    plan: list[Placement]
    next_chunk: int = 0
    total: np.ndarray | None = None
    count: int = 0
    first: np.ndarray | None = None
    last: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> None:
        if rows.shape[0] == 0:
            return
        if self.first is None:
            self.first = rows[0].astype(np.float64)
        self.last = rows[-1].astype(np.float64)
        s = rows.astype(np.float64).sum(axis=0)
        self.total = s if self.total is None else self.total + s
        self.count += rows.shape[0]


def _resolve_pooling(pooling: int | str | None, model: LlamaModel) -> int:
    if pooling is None:
        md = model.metadata
        arch = md.get("general.architecture", "")
        raw = md.get(f"{arch}.pooling_type")
        value = int(raw) if raw not in (None, "") else 0
        return value if value in _POOLING_BY_ID else POOLING_NAMES["mean"]
    if isinstance(pooling, str):
        key = pooling.lower()
        if key not in POOLING_NAMES:
            raise MultimodalError(f"pooling must be one of {sorted(POOLING_NAMES)}, got {pooling!r}")
        return POOLING_NAMES[key]
    if int(pooling) not in _POOLING_BY_ID:
        raise MultimodalError(f"pooling must be 1 (mean), 2 (cls) or 3 (last) for multimodal embeddings, "
                              f"got {pooling}")
    return int(pooling)


def _count_owner(owners: list[tuple[_SeqState, int]], st: _SeqState) -> None:
    """Run-length record of which sequence owns each output row of a batch, in order."""
    if owners and owners[-1][0] is st:
        owners[-1] = (st, owners[-1][1] + 1)
    else:
        owners.append((st, 1))


class MTMDEmbeddingHandler:
    """Pooled embeddings of multimodal inputs (text, images, audio) for one model + projector.

    ``model`` is a model path or an open :class:`~llama_cpp._internals.LlamaModel` (kept alive,
    not closed by this handler). The handler owns its projector context and an embedding context
    (``embeddings=True``, per-token outputs) with ``n_seq_max`` sequences: up to that many inputs
    are evaluated together, chunk by chunk. ``pooling`` is ``"mean"``, ``"cls"`` (first token) or
    ``"last"``; by default the model's GGUF pooling type, or mean when it has none.
    """

    def __init__(self, model: str | os.PathLike[str] | LlamaModel, mmproj_path: str | os.PathLike[str], *,
                 n_ctx: int = 4096, n_batch: int = 2048, n_ubatch: int | None = None, n_seq_max: int = 4,
                 n_threads: int | None = None, n_gpu_layers: int = 0, use_gpu: bool = True,
                 pooling: int | str | None = None, media_marker: str | None = None,
                 image_min_tokens: int | None = None, image_max_tokens: int | None = None,
                 context_params: dict[str, Any] | None = None) -> None:
        self._closed = False
        self._mctx: MTMDContext | None = None
        self._ctx: LlamaContext | None = None
        self._owned_model: LlamaModel | None = None
        if n_seq_max <= 0:
            raise ValueError(f"n_seq_max must be positive, got {n_seq_max}")
        model = unwrap(model)
        if isinstance(model, LlamaModel):
            self.model = model
        else:
            self._owned_model = self.model = LlamaModel(model, n_gpu_layers=n_gpu_layers)
        try:
            self.pooling = _resolve_pooling(pooling, self.model)
            self._mctx = MTMDContext(mmproj_path, self.model, use_gpu=use_gpu, n_threads=n_threads,
                                     media_marker=media_marker, image_min_tokens=image_min_tokens,
                                     image_max_tokens=image_max_tokens)
            threads = {} if n_threads is None else {"n_threads": n_threads, "n_threads_batch": n_threads}
            params = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch or n_batch, n_seq_max=n_seq_max,
                          embeddings=True, pooling_type=0, **threads)
            params.update(context_params or {})
            self._ctx = LlamaContext(self.model, **params)
        except BaseException:
            self.close()
            raise
        self.n_embd_out = self._ctx.n_embd_out()
        self._finalizer = weakref.finalize(self, MTMDEmbeddingHandler._release, self._mctx, self._ctx,
                                           self._owned_model)

    @staticmethod
    def _release(mctx: MTMDContext | None, ctx: LlamaContext | None, model: LlamaModel | None) -> None:
        for obj in (ctx, mctx, model):
            if obj is not None:
                obj.close()

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the contexts (and the model when this handler loaded it). Idempotent."""
        if getattr(self, "_closed", True) and self._mctx is None and self._ctx is None:
            self._closed = True
            return
        self._closed = True
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin.detach()
        self._release(self._mctx, self._ctx, self._owned_model)
        self._mctx = self._ctx = self._owned_model = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> MTMDEmbeddingHandler:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> tuple[MTMDContext, LlamaContext]:
        if self._closed or self._mctx is None or self._ctx is None:
            raise ClosedError("this MTMDEmbeddingHandler is closed; create a new one")
        return self._mctx, self._ctx

    @property
    def mtmd(self) -> MTMDContext:
        return self._check_open()[0]

    @property
    def context(self) -> LlamaContext:
        return self._check_open()[1]

    @property
    def marker(self) -> str:
        return self.mtmd.marker

    # -- planning -----------------------------------------------------------------------------
    def _plan(self, chunks: Chunks) -> list[Placement]:
        mctx = self.mtmd
        n_past = 0
        plan = []
        for ch in chunks:
            pos = mctx.positions(ch, n_past)
            plan.append(Placement(ch, n_past, pos, ch.is_media and mctx.use_non_causal(ch)))
            n_past += ch.n_pos
        return plan

    def layout(self, item: Any, *, add_special: bool = True, parse_special: bool = False) -> list[Placement]:
        """How one input is laid out: its chunks with their decoder positions (for inspection)."""
        chunks = self.mtmd.tokenize(item, add_special=add_special, parse_special=parse_special)
        try:
            plan = self._plan(chunks)
            for p in plan:  # detach from the native list before it is freed
                p.chunk = Chunk(p.chunk.index, p.chunk.type, p.chunk.n_tokens, p.chunk.n_pos,
                                p.chunk.tokens, p.chunk.id, 0)
            return plan
        finally:
            chunks.close()

    # -- embedding ----------------------------------------------------------------------------
    def embed(self, inputs: Any, *, normalize: float = 2, pooling: int | str | None = None,
              add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        """Embed inputs; returns ``(n_inputs, n_embd_out)`` float32 rows.

        ``inputs`` is one input or a list of inputs. An input is a list of parts (``str`` text,
        :class:`Image`, :class:`Audio`, a ``pathlib.Path``, file bytes, a ``uint8`` HxWx3 RGB array
        or a 1-D ``float32`` PCM array), a string (text, where each media marker needs a media
        item), a :class:`MarkerPrompt` or ``{"prompt": ..., "media": [...]}``. A top-level list
        is always a list of inputs: ``embed([["a cat", img]])`` is one input of two parts.
        ``normalize`` follows llama.cpp: -1 none, 0 max-abs, 1 L1, 2 L2, p > 2 p-norm.
        """
        mctx, ctx = self._check_open()
        pool = self.pooling if pooling is None else _resolve_pooling(pooling, self.model)
        items = iter_inputs(inputs)
        if normalize is not None and normalize != -1 and normalize < 0:
            raise ValueError(f"normalize must be -1 (none), 0, 1, 2 or p > 2, got {normalize}")
        n_seq = ctx.n_seq_max()
        cap = ctx.n_ctx_seq() if hasattr(ctx, "n_ctx_seq") else ctx.n_ctx() // n_seq
        out = np.zeros((len(items), self.n_embd_out), dtype=np.float32)
        causal0 = ctx.causal_attn()
        try:
            for g0 in range(0, len(items), n_seq):
                states: list[_SeqState] = []
                try:
                    for k, item in enumerate(items[g0:g0 + n_seq]):
                        idx = g0 + k
                        where = f"input[{idx}]" if len(items) > 1 else "input"
                        chunks = mctx.tokenize(item, add_special=add_special, parse_special=parse_special,
                                               where=where)
                        st = _SeqState(seq_id=k, index=idx, chunks=chunks, plan=[])
                        states.append(st)
                        st.plan = self._plan(chunks)
                        if chunks.n_pos > cap:
                            raise ContextOverflowError(
                                f"{where} needs {chunks.n_pos} positions but each sequence of this handler "
                                f"holds {cap} (n_ctx={ctx.n_ctx()} / n_seq_max={n_seq}); raise n_ctx or "
                                "lower n_seq_max")
                    self._run_group(states, causal0)
                    for st in states:
                        out[st.index] = self._pool(st, pool)
                finally:
                    for st in states:
                        st.chunks.close()
                    ctx.memory_clear()
        finally:
            if ctx.causal_attn() != causal0:
                ctx.set_causal_attn(causal0)
        return normalize_rows(out, -1 if normalize is None else normalize)

    def embed_one(self, item: Any, **kwargs: Any) -> np.ndarray:
        """Embed a single input; returns one ``(n_embd_out,)`` row."""
        return self.embed([item], **kwargs)[0]

    @staticmethod
    def _pool(st: _SeqState, pooling: int) -> np.ndarray:
        if st.count == 0 or st.total is None:
            raise DecodeError(f"input[{st.index}] produced no output embeddings")
        if pooling == POOLING_NAMES["mean"]:
            return (st.total / st.count).astype(np.float32)
        if pooling == POOLING_NAMES["cls"]:
            return st.first.astype(np.float32)
        return st.last.astype(np.float32)

    def _run_group(self, states: list[_SeqState], causal0: bool) -> None:
        mctx, ctx = self._check_open()
        while True:
            text: list[tuple[_SeqState, Placement]] = []
            media: list[tuple[_SeqState, Placement]] = []
            for st in states:
                if st.next_chunk < len(st.plan):
                    pl = st.plan[st.next_chunk]
                    st.next_chunk += 1
                    (media if pl.chunk.is_media else text).append((st, pl))
            if not text and not media:
                return
            if text:
                self._decode_text(text)
            if media:
                rows = mctx.encode_many([pl.chunk for _, pl in media])
                causal = [(st, pl, r) for (st, pl), r in zip(media, rows) if not pl.non_causal]
                if causal:
                    self._decode_rows(causal)
                for st, pl, r in [(st, pl, r) for (st, pl), r in zip(media, rows) if pl.non_causal]:
                    ctx.set_causal_attn(False)
                    try:
                        self._decode_rows([(st, pl, r)], whole=True)
                    finally:
                        ctx.set_causal_attn(causal0)

    def _flush(self, batch: LlamaBatchExtNative, owners: list[tuple[_SeqState, int]]) -> None:
        """Decode ``batch`` and hand each sequence its rows (owners: (state, n_rows) in batch order)."""
        ctx = self.context
        ctx.process(batch)
        n = batch.n_tokens
        ptr = ctx.bindings.llama_get_embeddings(ctx.ptr)
        if not ptr:
            raise DecodeError("llama.cpp returned no token embeddings after the decode")
        allrows = np.ctypeslib.as_array(ptr, shape=(n * self.n_embd_out,)).reshape(n, self.n_embd_out)
        i = 0
        for st, cnt in owners:
            st.take(allrows[i:i + cnt])
            i += cnt
        batch.clear()

    def _decode_text(self, items: list[tuple[_SeqState, Placement]]) -> None:
        ctx = self.context
        batch = LlamaBatchExtNative(ctx)
        try:
            cap = batch.capacity
            owners: list[tuple[_SeqState, int]] = []
            for st, pl in items:
                toks = pl.chunk.tokens if pl.chunk.tokens is not None else np.zeros(0, np.int32)
                pos = pl.positions[:, 0]
                for j in range(len(toks)):
                    if batch.n_tokens == cap:
                        self._flush(batch, owners)
                        owners = []
                    batch.add_token(int(toks[j]), st.seq_id, int(pos[j]), output=True)
                    _count_owner(owners, st)
            if batch.n_tokens:
                self._flush(batch, owners)
        finally:
            batch.close()

    def _decode_rows(self, items: list[tuple[_SeqState, Placement, np.ndarray]], whole: bool = False) -> None:
        ctx = self.context
        batch = LlamaBatchExtNative(ctx)
        try:
            cap = batch.capacity
            if whole:
                n = items[0][2].shape[0]
                if n > min(cap, ctx.n_ubatch()):
                    raise ContextOverflowError(
                        f"the {items[0][1].chunk.kind} chunk has {n} embeddings and must be decoded in one "
                        f"micro-batch (non-causal attention), but n_ubatch={ctx.n_ubatch()}: raise n_ubatch "
                        "and n_batch")
            owners: list[tuple[_SeqState, int]] = []
            for st, pl, rows in items:
                pos = pl.positions
                for j in range(rows.shape[0]):
                    if batch.n_tokens == cap:
                        self._flush(batch, owners)
                        owners = []
                    p = int(pos[j, 0]) if pos.shape[1] == 1 else [int(v) for v in pos[j]]
                    batch.add_embd(rows[j], st.seq_id, p, output=True)
                    _count_owner(owners, st)
            if batch.n_tokens:
                self._flush(batch, owners)
        finally:
            batch.close()

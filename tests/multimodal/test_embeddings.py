"""MTMDEmbeddingHandler against llama.cpp's own multimodal path, on the synthetic projectors."""

from __future__ import annotations

import ctypes
import wave

import numpy as np
import pytest

from build_tools.fixtures import AUDIO_TOKENS, VISION_TOKENS, png_bytes
from llama_cpp import ClosedError, ContextOverflowError, MultimodalError
from llama_cpp.mtmd import Audio, Image, MarkerPrompt, MTMDContext, MTMDEmbeddingHandler, normalize_rows


def _reference(model_path, mmproj_path, item, *, pooling_ctx: int = 0, add_special: bool = True) -> np.ndarray:
    """Tokenize -> encode -> decode with mtmd's C helper, then pool the per-token outputs.

    Independent of the handler: positions, non-causal switching and batching come from
    ``mtmd_helper_eval_chunk_single``. With ``pooling_ctx=1`` llama.cpp pools (MEAN) itself,
    which is only valid when the input is a single chunk.
    """
    from llama_cpp import llama_cpp as C
    from llama_cpp import mtmd_cpp as M
    from llama_cpp._internals import LlamaContext, LlamaModel

    model = LlamaModel(model_path)
    ctx = LlamaContext(model, n_ctx=1024, n_batch=512, n_ubatch=512, embeddings=True,
                       pooling_type=pooling_ctx, n_threads=1, n_threads_batch=1)
    mctx = MTMDContext(mmproj_path, model, n_threads=1)
    chunks = mctx.tokenize(item, add_special=add_special)
    try:
        n_embd = model.n_embd_out()
        rows = []
        n_past = 0
        for ch in chunks:
            new_past = ctypes.c_int32(n_past)
            rc = M.mtmd_helper_eval_chunk_single(mctx.ptr, ctx.ptr, ch.ptr, n_past, 0, 512, False,
                                                 ctypes.byref(new_past))
            assert rc == 0
            n_past = new_past.value
            if pooling_ctx == 0:
                for i in range(ch.n_tokens):
                    p = C.llama_get_embeddings_ith(ctx.ptr, i)
                    rows.append(np.ctypeslib.as_array(p, shape=(n_embd,)).copy())
        if pooling_ctx:
            assert len(chunks) == 1
            p = C.llama_get_embeddings_seq(ctx.ptr, 0)
            return np.ctypeslib.as_array(p, shape=(n_embd,)).copy()
        return np.mean(np.asarray(rows, dtype=np.float64), axis=0)
    finally:
        chunks.close()
        mctx.close()
        ctx.close()
        model.close()


def _l2(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_matches_manual_low_level_path(handler, spm_model, mmproj_vision, png_path, png2):
    item = ["a photo of", Image(png_path), "and", Image(png2), "cats"]
    got = handler.embed([item], normalize=2)
    assert got.shape == (1, 64) and got.dtype == np.float32
    ref = _l2(_reference(spm_model, mmproj_vision, item))
    np.testing.assert_allclose(got[0], ref, atol=1e-5)
    raw = handler.embed([item], normalize=-1)[0]
    np.testing.assert_allclose(raw, _reference(spm_model, mmproj_vision, item), atol=1e-5)


def test_python_pooling_equals_llama_cpp_pooling(handler, spm_model, mmproj_vision, png_path):
    # one chunk only (no BOS, image alone), so llama.cpp's own MEAN pooling covers the whole input
    got = handler.embed([Image(png_path)], normalize=-1, add_special=False)[0]
    ref = _reference(spm_model, mmproj_vision, [Image(png_path)], pooling_ctx=1, add_special=False)
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_mrope_model_matches_mtmd_positions(qwen35_random, mmproj_vision, png_path):
    item = MarkerPrompt("look: <__media__> here", [png_path])
    with MTMDEmbeddingHandler(qwen35_random, mmproj_vision, n_ctx=1024, n_batch=256, n_seq_max=2,
                              n_threads=1) as h:
        assert h.mtmd.use_mrope
        got = h.embed([item], normalize=-1)[0]
        plan = h.layout(item)
    np.testing.assert_allclose(got, _reference(qwen35_random, mmproj_vision, item), atol=1e-5)
    # image rows: 4 position sections, starting after the text chunk
    text0, img, text1 = plan
    assert img.chunk.kind == "image" and img.positions.shape == (VISION_TOKENS, 4)
    assert img.start == text0.chunk.n_tokens
    assert text1.start == img.start + img.chunk.n_pos
    assert text1.positions[:, 0].tolist() == list(range(text1.start, text1.start + text1.chunk.n_tokens))


def test_positions_as_mtmd_reports(handler, qwen35_random, mmproj_vision, png_path, png2):
    from llama_cpp import mtmd_cpp as M
    from llama_cpp._internals import LlamaModel

    plan = handler.layout(["ab", Image(png_path), "c", Image(png2)])
    kinds = [p.chunk.kind for p in plan]
    assert kinds == ["text", "image", "text", "image"]
    pos = 0
    for p in plan:
        assert p.start == pos
        assert p.positions.shape == (p.chunk.n_tokens, 1)
        assert p.positions[:, 0].tolist() == list(range(pos, pos + p.chunk.n_tokens))
        assert p.chunk.n_pos == p.chunk.n_tokens  # ordinary RoPE: one position per row
        pos += p.chunk.n_pos
    # M-RoPE: compare row by row with mtmd_image_tokens_get_decoder_pos at the same start
    model = LlamaModel(qwen35_random)
    try:
        mctx = MTMDContext(mmproj_vision, model, n_threads=1)
        chunks = mctx.tokenize(["hi there", Image(png_path)])
        try:
            text, img = list(chunks)
            got = mctx.positions(img, text.n_tokens)
            tok = M.mtmd_input_chunk_get_tokens_image(img.ptr)
            for i in range(img.n_tokens):
                d = M.mtmd_image_tokens_get_decoder_pos(tok, text.n_tokens, i)
                assert got[i].tolist() == [d.t, d.y, d.x, d.z]
            assert img.n_pos == M.mtmd_image_tokens_get_n_pos(tok)
        finally:
            chunks.close()
            mctx.close()
    finally:
        model.close()


def test_deterministic_and_batched_equals_single(handler, png_path, png2):
    inputs = [["a cat", Image(png_path)], "plain text only", MarkerPrompt("<__media__> then text", [png2]),
              [Image(png2), "x", Image(png_path)], png_bytes(16, 24, seed=9)]
    a = handler.embed(inputs)
    b = handler.embed(inputs)
    assert np.array_equal(a, b)
    singles = np.stack([handler.embed_one(x) for x in inputs])
    np.testing.assert_allclose(a, singles, atol=1e-6)
    assert np.all(np.abs(a[0] - a[1]) > 0).any()  # inputs are distinguished
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def test_input_forms_agree(handler, png_path):
    data = png_path.read_bytes()
    from_path = handler.embed([["x", Image(png_path)]])
    from_bytes = handler.embed([["x", data]])
    from_marker = handler.embed(MarkerPrompt("x<__media__>", [png_path]))
    from_dict = handler.embed({"prompt": "x<__media__>", "media": [data]})
    for other in (from_bytes, from_marker, from_dict):
        np.testing.assert_allclose(other, from_path, atol=1e-6)
    # a uint8 RGB array with the PNG's pixels is the same image
    pixels = _decode_png(data)
    np.testing.assert_allclose(handler.embed([["x", pixels]]), from_path, atol=1e-6)


def _decode_png(data: bytes) -> np.ndarray:
    """Pixels of the fixture PNG (8-bit RGB, filter 0 on every row, one IDAT)."""
    import struct
    import zlib

    w, h = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    n = struct.unpack(">I", data[idat - 4:idat])[0]
    raw = zlib.decompress(data[idat + 4:idat + 4 + n])
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert np.all(rows[:, 0] == 0)
    return rows[:, 1:].reshape(h, w, 3).copy()


def test_normalisation_convention(handler, png_path):
    item = ["some", Image(png_path)]
    raw = handler.embed([item], normalize=-1)[0].astype(np.float64)
    for mode, norm in ((1, np.sum(np.abs(raw))), (2, np.linalg.norm(raw)),
                       (3, np.sum(np.abs(raw) ** 3) ** (1 / 3)), (0, np.max(np.abs(raw)) / 32760.0)):
        np.testing.assert_allclose(handler.embed([item], normalize=mode)[0], raw / norm, rtol=1e-5, atol=1e-6)
    assert np.all(normalize_rows(np.zeros((2, 4)), 2) == 0)
    tiny = normalize_rows(np.full((1, 8), 1e-30), 2)
    np.testing.assert_allclose(np.linalg.norm(tiny), 1.0, rtol=1e-6)


def test_pooling_choices(handler, spm_model, mmproj_vision, png_path):
    item = ["first", Image(png_path), "last"]
    mean = handler.embed([item], normalize=-1)[0]
    cls = handler.embed([item], normalize=-1, pooling="cls")[0]
    last = handler.embed([item], normalize=-1, pooling="last")[0]
    assert not np.allclose(mean, cls) and not np.allclose(cls, last)
    # the BOS row and the final token's row do not depend on what follows / is pooled
    assert np.allclose(cls, handler.embed([["other words", Image(png_path)]], normalize=-1, pooling="cls")[0])
    with pytest.raises(MultimodalError, match="pooling"):
        handler.embed([item], pooling="rank")


def test_audio_inputs(spm_model, mmproj_audio, wav_path):
    with MTMDEmbeddingHandler(spm_model, mmproj_audio, n_ctx=1024, n_batch=256, n_seq_max=2, n_threads=1) as h:
        assert h.mtmd.support_audio and not h.mtmd.support_vision
        plan = h.layout(["speech:", Audio(wav_path)])
        assert [p.chunk.kind for p in plan] == ["text", "audio"] and plan[1].chunk.n_tokens == AUDIO_TOKENS
        from_file = h.embed([["speech:", Audio(wav_path)]])
        with wave.open(str(wav_path)) as w:
            assert w.getframerate() == h.mtmd.audio_sample_rate
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        from_pcm = h.embed([["speech:", Audio(pcm)]])
        np.testing.assert_allclose(from_pcm, from_file, atol=1e-5)
        with pytest.raises(MultimodalError, match="no vision encoder"):
            h.embed([np.zeros((8, 8, 3), np.uint8)])


def test_rejects_bad_inputs(handler, png_path, tmp_path):
    bad_file = tmp_path / "broken.png"
    bad_file.write_bytes(b"this is not an image at all")
    cases = [
        ("x <__media__> y <__media__>", "2 media marker"),
        (MarkerPrompt("no marker here", [png_path]), "0 media marker"),
        ({"prompt": "<__media__>", "media": []}, "1 media marker"),
        ([Image(tmp_path / "missing.png")], "file not found"),
        ([Image(bad_file)], "not a readable image"),
        ([Image(tmp_path)], "file not found, not a regular file"),  # a folder reads as a missing file
        ([b""], "empty"),
        ([np.zeros((4, 4), np.uint8)], r"shape \(height, width, 3\)"),
        ([np.zeros((4, 4, 4), np.uint8)], r"shape \(height, width, 3\)"),
        ([Image(np.zeros((4, 4, 3), np.float32))], "uint8"),
        ([np.zeros((0, 4, 3), np.uint8)], "empty"),
        ([np.zeros((4, 4, 3), np.int16)], "cannot tell"),
        ([Audio(np.zeros((2, 10), np.float32))], "1-D"),
        ([Audio(png_path)], "holds image"),
        ([Audio(np.zeros(100, np.float32))], "no audio encoder"),
        ([object()], "unsupported"),
        ([[]], "empty"),
        ([], "no inputs"),
    ]
    for bad, msg in cases:
        with pytest.raises(MultimodalError, match=msg):
            handler.embed(bad)
    # the handler is still usable and its state is clean
    assert handler.embed([["ok", Image(png_path)]]).shape == (1, 64)


def test_overflow_is_a_clear_error(spm_model, mmproj_vision, png_path):
    with MTMDEmbeddingHandler(spm_model, mmproj_vision, n_ctx=256, n_batch=64, n_seq_max=4, n_threads=1) as h:
        cap = h.context.n_ctx_seq()
        with pytest.raises(ContextOverflowError, match="positions"):
            h.embed([["word " * cap, Image(png_path)]])
        # rows larger than n_batch are split over several decodes and still pool correctly
        item = ["w " * 40, Image(png_path), "v " * 40]
        assert h.embed([item]).shape == (1, 64)


def test_attention_mode_restored(handler, png_path):
    ctx = handler.context
    assert ctx.causal_attn()
    handler.embed([["a", Image(png_path)]])
    assert ctx.causal_attn()
    ctx.set_causal_attn(False)
    try:
        handler.embed([["a", Image(png_path)]])
        assert not ctx.causal_attn()
        with pytest.raises(MultimodalError):
            handler.embed([["a", Image(png_path)], ["b", b"junk"]])
        assert not ctx.causal_attn()
    finally:
        ctx.set_causal_attn(True)


def test_bad_projector(spm_model, qwen35_echo, tmp_path):
    from llama_cpp import ModelLoadError

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file, just some bytes to read")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        MTMDEmbeddingHandler(spm_model, junk, n_threads=1)
    with pytest.raises(FileNotFoundError):
        MTMDEmbeddingHandler(spm_model, tmp_path / "absent.gguf", n_threads=1)
    # a text model is not a projector
    with pytest.raises(MultimodalError, match="could not load the projector"):
        MTMDEmbeddingHandler(spm_model, qwen35_echo, n_threads=1)


def test_close_twice_and_use_after_close(spm_model, mmproj_vision, png_path):
    h = MTMDEmbeddingHandler(spm_model, mmproj_vision, n_ctx=512, n_batch=128, n_threads=1)
    h.embed([["a", Image(png_path)]])
    h.close()
    h.close()
    assert h.closed
    with pytest.raises(ClosedError):
        h.embed(["a"])
    from llama_cpp._internals import LlamaModel

    model = LlamaModel(spm_model)
    mctx = MTMDContext(mmproj_vision, model, n_threads=1)
    chunks = mctx.tokenize(["a", Image(png_path)])
    model.close()  # the mtmd context keeps the native model alive
    assert chunks.n_tokens == 2 + VISION_TOKENS
    chunks.close()
    chunks.close()
    mctx.close()
    mctx.close()
    with pytest.raises(ClosedError):
        mctx.tokenize(["a"])
    # a borrowed model is left open by the handler
    model = LlamaModel(spm_model)
    with MTMDEmbeddingHandler(model, mmproj_vision, n_ctx=512, n_batch=128, n_threads=1) as h2:
        h2.embed(["x"])
    assert not model.closed
    model.close()

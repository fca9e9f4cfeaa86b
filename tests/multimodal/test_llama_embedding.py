"""``LlamaEmbedding.embed_multimodal`` and ``python -m llama_cpp embed --mmproj``: the handler's rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llama_cpp import LlamaEmbedding, MultimodalError
from llama_cpp.mtmd import Image, MTMDEmbeddingHandler


def test_embed_multimodal_matches_the_handler(spm_model, mmproj_vision, png_path):
    inputs = [["a photo of", Image(png_path)], ["just text"]]
    with MTMDEmbeddingHandler(spm_model, mmproj_vision, n_threads=1) as h:
        expected = h.embed(inputs, normalize=2)
    with LlamaEmbedding(spm_model, mmproj_path=mmproj_vision, n_threads=1) as emb:
        got = emb.embed_multimodal(inputs)
        assert got.dtype == np.float32 and got.shape == (2, emb.n_embd_out)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        again = emb.embed_multimodal(inputs)  # the handler is reused
        np.testing.assert_array_equal(again, got)
    with pytest.raises(Exception, match="closed"):
        emb.embed_multimodal(inputs)


def test_embed_multimodal_needs_a_projector(spm_model):
    with LlamaEmbedding(spm_model, n_threads=1) as emb, pytest.raises(MultimodalError, match="mmproj_path"):
        emb.embed_multimodal([["text"]])


def test_cli_embed_with_image(spm_model, mmproj_vision, png_path, capsys):
    from llama_cpp.cli import main

    text = "a photo of a test pattern"
    code = main(["embed", "--quiet", "--threads", "1", "--mmproj", str(mmproj_vision), str(spm_model),
                 "--image", str(png_path), text])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = np.asarray(json.loads(out.out), dtype=np.float32)
    with LlamaEmbedding(spm_model, mmproj_path=mmproj_vision, n_threads=1) as emb:
        expected = emb.embed_multimodal([[Image(png_path), text]])
    assert rows.shape == expected.shape == (1, 64)
    np.testing.assert_allclose(rows, expected, atol=1e-5)
    assert main(["embed", str(spm_model), "--image", str(png_path)]) == 2
    assert "--mmproj" in capsys.readouterr().err

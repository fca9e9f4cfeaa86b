"""``/v1/embeddings`` with image and audio inputs on an embedding model served with a projector: llama-server's
``{"prompt_string", "multimodal_data"}`` and ``{"content": [parts]}`` shapes, against the library's own
``MTMDEmbeddingHandler`` on the same files; bad inputs are 400s in OpenAI's shape."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from build_tools.fixtures import fixture_path, png_bytes


@pytest.fixture(scope="module")
def pooled_path(tmp_path_factory):
    """The tiny llama with mean pooling in its metadata (an embedding model that pools)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    src = fixture_path("llama_spm")
    out = tmp_path_factory.mktemp("pooled") / "tiny-spm-mean.gguf"
    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(str(out), arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {f"{arch}.pooling_type": MetadataDetails(gguf.GGUFValueType.UINT32, 1)},
                           [])
    return out


@pytest.fixture(scope="module")
def srv(start_server, pooled_path, embed_path):
    return start_server([
        {"model": str(pooled_path), "model_alias": "mm", "embedding": True, "n_ctx": 512,
         "clip_model_path": str(fixture_path("mmproj_vision"))},
        {"model": str(embed_path), "model_alias": "text", "embedding": True, "n_ctx": 256},
        {"model": str(pooled_path), "model_alias": "mm-audio", "embedding": True, "n_ctx": 512,
         "clip_model_path": str(fixture_path("mmproj_audio"))},
        # no pooling in its metadata: one vector per token
        {"model": str(fixture_path("llama_spm")), "model_alias": "unpooled", "embedding": True, "n_ctx": 512,
         "clip_model_path": str(fixture_path("mmproj_vision"))}])


PNG = png_bytes(40, 32, seed=1)
PNG2 = png_bytes(24, 24, seed=5)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + _b64(data)


def _post(srv, **body):
    return httpx.post(srv.url + "/v1/embeddings", json={"model": "mm", **body}, timeout=120)


def _reference(pooled_path, inputs, mmproj="mmproj_vision"):
    from llama_cpp.mtmd import MTMDEmbeddingHandler

    # flash attention off, as the served model runs (flash_attn defaults to false)
    with MTMDEmbeddingHandler(pooled_path, fixture_path(mmproj), n_ctx=512, n_batch=512, n_seq_max=1,
                              n_threads=1, context_params={"flash_attn_type": 0}) as h:
        return h.embed(inputs, normalize=-1, pooling="mean")


def test_both_shapes_embed_as_the_library_does(srv, pooled_path):
    from llama_cpp.mtmd import Image, MarkerPrompt

    r = _post(srv, input=[
        {"content": [{"type": "text", "text": "a photo of"}, {"type": "image_url", "image_url": {"url": _url(PNG)}}]},
        {"prompt_string": "look <__media__> and <__media__> here", "multimodal_data": [_b64(PNG), _b64(PNG2)]},
        "plain text"])
    assert r.status_code == 200, r.text
    body = r.json()
    got = np.asarray([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = _reference(pooled_path, [["a photo of", Image(PNG)],
                                    MarkerPrompt("look <__media__> and <__media__> here", [PNG, PNG2]),
                                    "plain text"])
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    from build_tools.fixtures import VISION_TOKENS

    assert body["usage"]["prompt_tokens"] > 3 * VISION_TOKENS  # the images' tokens are counted
    # the image changes the vector; a text-only request takes the text path and agrees with it
    assert not np.allclose(got[0], _reference(pooled_path, ["a photo of"])[0], atol=1e-3)
    text = np.asarray(_post(srv, input="plain text").json()["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(text, got[2], atol=1e-4)


def test_audio_parts(srv, pooled_path):
    from llama_cpp.mtmd import Audio

    wav = fixture_path("wav").read_bytes()
    r = _post(srv, model="mm-audio", input={"content": [
        {"type": "text", "text": "listen:"}, {"type": "input_audio", "input_audio": {"data": _b64(wav),
                                                                                      "format": "wav"}}]})
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(got, _reference(pooled_path, [["listen:", Audio(wav)]], "mmproj_audio")[0],
                               atol=1e-4)
    same = _post(srv, model="mm-audio", input={"prompt_string": "listen:<__media__>", "multimodal_data": [_b64(wav)]})
    np.testing.assert_allclose(np.asarray(same.json()["data"][0]["embedding"], dtype=np.float32), got, atol=1e-4)


def test_media_need_a_pooling_model(srv):
    r = _post(srv, model="unpooled", input={"content": [{"type": "image_url", "image_url": {"url": _url(PNG)}}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "pools by none" in r.json()["error"]["message"]


def test_dimensions_and_base64_with_media(srv):
    item = {"content": [{"type": "image_url", "image_url": {"url": _url(PNG)}}, {"type": "text", "text": "cat"}]}
    full = np.asarray(_post(srv, input=item).json()["data"][0]["embedding"], dtype=np.float32)
    r = _post(srv, input=[item], dimensions=8, encoding_format="base64").json()
    v = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(v, full[:8] / np.linalg.norm(full[:8]), atol=1e-5)


def test_prompt_string_without_media_is_text_on_any_model(srv):
    a = _post(srv, model="text", input={"prompt_string": "hello world"}).json()["data"][0]["embedding"]
    b = _post(srv, model="text", input="hello world").json()["data"][0]["embedding"]
    assert a == b


@pytest.mark.parametrize("model, body, param, needle", [
    ("text", {"input": {"content": [{"type": "image_url", "image_url": {"url": _url(PNG)}}]}}, "input",
     "clip_model_path"),
    ("mm", {"input": {"prompt_string": "two <__media__> <__media__>", "multimodal_data": [_b64(PNG)]}}, "input[0]",
     "marker"),
    ("mm", {"input": {"prompt_string": "x <__media__>", "multimodal_data": ["not base64!"]}},
     "input[0].multimodal_data[0]", "base64"),
    ("mm", {"input": {"content": [{"type": "video_url", "video_url": "x"}]}}, "input[0].content[0]", "video_url"),
    ("mm", {"input": {"content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}},
     None, "remote URLs"),
    ("mm", {"input": {"content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}},
     None, "media_dirs"),
    ("mm", {"input": [[1, 2, 3], {"content": [{"type": "image_url", "image_url": {"url": _url(PNG)}}]}]},
     "input[0]", "token ids"),
    ("mm", {"input": {"texts": ["a"]}}, "input[0]", "prompt_string"),
    ("mm", {"input": {"prompt_string": "<__media__>", "multimodal_data": [_b64(b"RIFF\x00\x00\x00\x00WAVEfmt ")]}},
     None, "audio"),
])
def test_bad_media_inputs_are_openai_errors(srv, model, body, param, needle):
    r = _post(srv, **{**body, "model": model})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_an_oversized_media_input_is_a_context_error(srv):
    many = {"prompt_string": "<__media__>" * 40, "multimodal_data": [_b64(PNG)] * 40}
    r = _post(srv, input=many)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"

"""llama-cpp-python's vision handler classes as presets over the multimodal engine: upstream's
prompt text for each, and image chat through ``Llama(chat_handler=...)`` on the synthetic projector."""

from __future__ import annotations

import base64

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import llama_cpp.llama_chat_format as lcf
from llama_cpp import Llama

PRESETS = ["Llava15ChatHandler", "ObsidianChatHandler", "MoondreamChatHandler", "Llava16ChatHandler",
           "NanoLlavaChatHandler", "Llama3VisionAlphaChatHandler", "MiniCPMv26ChatHandler", "Qwen25VLChatHandler"]


@pytest.fixture(scope="module")
def paths():
    from build_tools.fixtures import fixture_path, png_bytes

    return fixture_path("llama_spm"), fixture_path("mmproj_vision"), png_bytes(40, 32, seed=5)


def _messages(png: bytes) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                         {"type": "image_url", "image_url": {"url": url}}]},
            {"role": "assistant", "content": "a picture"},
            {"role": "user", "content": "and now?"}]


def _upstream_prompt(cls, llm, messages, marker):
    """What llama-cpp-python renders: the template over the messages with their URLs, a default
    system message first when there is none, then each URL replaced by the media marker."""
    if cls.DEFAULT_SYSTEM_MESSAGE is not None and not next(
            (m["content"] for m in messages if m["role"] == "system"), ""):
        messages = [{"role": "system", "content": cls.DEFAULT_SYSTEM_MESSAGE}, *messages]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
    m = llm.model
    text = env.from_string(cls.CHAT_FORMAT).render(messages=messages, add_generation_prompt=True,
                                                   eos_token=m.token_text(m.token_eos()),
                                                   bos_token=m.token_text(m.token_bos()))
    for msg in messages:
        if isinstance(msg["content"], list):
            for part in msg["content"]:
                if part["type"] == "image_url":
                    text = text.replace(part["image_url"]["url"], marker)
    return text


@pytest.mark.parametrize("name", PRESETS)
def test_preset_prompt_is_upstreams(paths, name):
    model, mmproj, png = paths
    cls = getattr(lcf, name)
    handler = cls(clip_model_path=str(mmproj), verbose=False, n_threads=1)
    with Llama(str(model), n_ctx=512, n_batch=64, n_threads=1, chat_handler=handler, verbose=False) as llm:
        engine = handler.engine_for(llm)
        msgs = _messages(png)
        prompt, media, stops, has_bos = engine.render(msgs)
        assert len(media) == 1 and stops == [] and has_bos is False
        assert prompt == _upstream_prompt(cls, llm, msgs, engine.mtmd.marker)
    handler.close()


@pytest.mark.parametrize("name", ["Llava15ChatHandler", "Qwen25VLChatHandler", "MTMDChatHandler"])
def test_image_chat_through_llama(paths, name):
    from build_tools.fixtures import VISION_TOKENS

    model, mmproj, png = paths
    handler = getattr(lcf, name)(str(mmproj), n_threads=1)
    with Llama(str(model), n_ctx=512, n_batch=64, n_threads=1, n_threads_batch=1, chat_handler=handler,
               verbose=False) as llm:
        msgs = _messages(png)
        r = llm.create_chat_completion(msgs, max_tokens=8, temperature=0)
        assert r["object"] == "chat.completion" and isinstance(r["choices"][0]["message"]["content"], str)
        assert r["usage"]["prompt_tokens"] > VISION_TOKENS
        streamed = "".join(c["choices"][0]["delta"].get("content", "")
                           for c in llm.create_chat_completion(msgs, max_tokens=8, temperature=0, stream=True))
        assert streamed == r["choices"][0]["message"]["content"]
        # a conversation without images goes through the same template
        text_only = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)
        assert text_only["usage"]["prompt_tokens"] < r["usage"]["prompt_tokens"]
    handler.close()


def test_preset_errors(paths, tmp_path):
    model, mmproj, png = paths
    for cls in (lcf.Llava15ChatHandler, lcf.MTMDChatHandler):
        with pytest.raises(ValueError, match="does not exist"):
            cls(clip_model_path=str(tmp_path / "missing.gguf"))
    # upstream's positional (clip_model_path, verbose, use_gpu)
    assert lcf.MTMDChatHandler(str(mmproj), False, False).use_gpu is False
    handler = lcf.Llava16ChatHandler(str(mmproj), n_threads=1)
    with Llama(str(model), n_ctx=512, n_batch=64, n_threads=1, chat_handler=handler, verbose=False) as llm:
        bad = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]
        with pytest.raises(ValueError, match="not supported"):
            llm.create_chat_completion(bad, max_tokens=2)
        # local files stay refused unless media_dirs allows them
        img = tmp_path / "x.png"
        img.write_bytes(png)
        with pytest.raises(ValueError, match="media_dirs"):
            llm.create_chat_completion([{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": str(img)}}]}], max_tokens=2)
    handler.close()
    assert lcf.Llama3VisionAlpha is lcf.Llama3VisionAlphaChatHandler


def test_from_pretrained_offline_from_the_hub_cache(paths, tmp_path):
    pytest.importorskip("huggingface_hub")
    import os
    import subprocess
    import sys

    from build_tools.compat import HubFile, build_hub

    _, mmproj, _ = paths
    home = build_hub(tmp_path / "home", [HubFile("org/llava-gguf", "mmproj-model-f16.gguf", mmproj),
                                         HubFile("org/llava-gguf", "llava-q4.gguf", mmproj)])
    code = ("import llama_cpp.llama_chat_format as f;"
            "h = f.Llava15ChatHandler.from_pretrained('org/llava-gguf', '*mmproj*', verbose=False);"
            "print(type(h).__name__, h.clip_model_path.name)")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Llava15ChatHandler", "mmproj-model-f16.gguf"]
    ambiguous = subprocess.run([sys.executable, "-c", code.replace("*mmproj*", "*.gguf")], env=env,
                               capture_output=True, text=True, check=False)
    assert ambiguous.returncode != 0 and "2 files in org/llava-gguf match" in ambiguous.stderr

"""llama-cpp-python's vision chat handler classes as presets over the one multimodal engine.

``Llama(model_path=..., chat_handler=Llava15ChatHandler(clip_model_path=...))`` works as in
llama-cpp-python: each class carries the prompt template and default system message upstream
uses for that model family (the prompt text is upstream's for the same messages), and everything
else (projector loading, image decoding under the media policy, evaluation, sampling, streaming)
is :class:`~llama_cpp.mtmd_chat.MTMDChatHandler`'s. ``MTMDChatHandler`` and ``Gemma4ChatHandler``
render with the model's own chat template.

Images come from ``image_url`` parts (``data:`` URLs; local files only inside ``media_dirs``);
each becomes the projector's media marker where upstream's template writes the URL.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._chat.base import Jinja2ChatFormatter, validate_messages
from .._errors import MultimodalError
from ..mtmd import Audio, Image
from ..mtmd_chat import MTMDChatHandler, MultimodalChatEngine, content_parts, image_from_url

# the templates llama-cpp-python 0.3.36 renders for each model family
LLAVA15_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'system' %}{{ message.content }}{% endif %}"
    "{% if message.role == 'user' %}{% if message.content is string %}\nUSER: {{ message.content }}"
    '{% endif %}{% if message.content is iterable %}\nUSER: {% for content in message.content %}'
    "{% if content.type == 'image_url' and content.image_url is string %}{{ content.image_url }}"
    "{% endif %}{% if content.type == 'image_url' and content.image_url is mapping %}"
    '{{ content.image_url.url }}{% endif %}{% endfor %}{% for content in message.content %}'
    "{% if content.type == 'text' %}{{ content.text }}{% endif %}{% endfor %}{% endif %}{% endif %}"
    "{% if message.role == 'assistant' and message.content is not none %}\nASSISTANT: "
    '{{ message.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}\nASSISTANT: {% endif %}'
)

OBSIDIAN_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'system' %}<|im_start|>system\n"
    "{{ message.content }}\n###\n{% endif %}{% if message.role == 'user' %}<|im_start|>user\n"
    '{% if message.content is string %}{{ message.content }}{% endif %}'
    '{% if message.content is iterable %}{% for content in message.content %}'
    "{% if content.type == 'image_url' and content.image_url is string %}{{ content.image_url }}"
    "{% endif %}{% if content.type == 'image_url' and content.image_url is mapping %}"
    '{{ content.image_url.url }}{% endif %}{% endfor %}{% for content in message.content %}'
    "{% if content.type == 'text' %}{{ content.text }}{% endif %}{% endfor %}{% endif %}###\n{% endif %}"
    "{% if message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}###\n{% endif %}"
    '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)

MOONDREAM_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'user' %}{% if message.content is iterable %}"
    "{% for content in message.content %}{% if content.type == 'image_url' %}"
    '{% if content.image_url is string %}{{ content.image_url }}\n\n{% endif %}'
    '{% if content.image_url is mapping %}{{ content.image_url.url }}\n\n{% endif %}{% endif %}'
    "{% endfor %}{% for content in message.content %}{% if content.type == 'text' %}Question: "
    '{{ content.text }}\n\n{% endif %}{% endfor %}{% endif %}{% if message.content is string %}Question: '
    "{{ message.content }}\n\n{% endif %}{% endif %}{% if message.role == 'assistant' %}Answer:"
    '{{ message.content }}\n\n{% endif %}{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}'
)

LLAVA16_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'system' %}{{ message.content }}{% endif %}"
    "{% if message.role == 'user' %}{% if message.content is iterable %}"
    "{% for content in message.content %}{% if content.type == 'image_url' %}"
    '{% if content.image_url is string %}{{ content.image_url }}\n{% endif %}'
    '{% if content.image_url is mapping %}{{ content.image_url.url }}\n{% endif %}{% endif %}'
    "{% endfor %}{% for content in message.content %}{% if content.type == 'text' %}{{ content.text }}"
    '{% endif %}{% endfor %}{% endif %}{% if message.content is string %}{{ message.content }}'
    "{% endif %}{% endif %}{% if message.role == 'assistant' %}{{ message.content }}{% endif %}"
    '{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}'
)

NANO_LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'system' %}<|im_start|>system\n"
    "{{ message.content }}<|im_end|>{% endif %}{% if message.role == 'user' %}<|im_start|>user\n"
    '{% if message.content is string %}{{ message.content }}{% endif %}'
    '{% if message.content is iterable %}{% for content in message.content %}'
    "{% if content.type == 'image_url' and content.image_url is string %}{{ content.image_url }}"
    "{% endif %}{% if content.type == 'image_url' and content.image_url is mapping %}"
    '{{ content.image_url.url }}{% endif %}{% endfor %}{% for content in message.content %}'
    "{% if content.type == 'text' %}{{ content.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>"
    "{% endif %}{% if message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    '<|im_end|>{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)

LLAMA3_VISION_ALPHA_TEMPLATE = (
    "{% for message in messages %}<|start_header_id|>{% if message.role == 'user' %}"
    'user<|end_header_id|>\n\n{% if message.content is iterable %}{% for content in message.content %}'
    "{% if content.type == 'image_url' %}{% if content.image_url is string %}{{ content.image_url }}"
    '{% endif %}{% if content.image_url is mapping %}{{ content.image_url.url }}{% endif %}{% endif %}'
    "{% endfor %}{% for content in message.content %}{% if content.type == 'text' %}{{ content.text }}"
    '{% endif %}{% endfor %}{% endif %}{% if message.content is string %}{{ message.content }}'
    "{% endif %}{% endif %}{% if message.role == 'assistant' %}assistant<|end_header_id|>\n\n"
    '{{ message.content }}{% endif %}<|eot_id|>{% endfor %}{% if add_generation_prompt %}'
    '<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}'
)

MINICPMV26_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>'
    "{{ message['role'] }}\n{% if message['content'] is iterable %}"
    "{% for content in message['content'] %}{% if content.type == 'image_url' %}"
    '{% if content.image_url is string %}{{ content.image_url }}{% endif %}'
    '{% if content.image_url is mapping %}{{ content.image_url.url }}{% endif %}{% endif %}{% endfor %}'
    "{% for content in message['content'] %}{% if content.type == 'text' %}{{ content.text }}"
    "{% endif %}{% endfor %}{% endif %}{% if message['content'] is string %}{{ message['content'] }}"
    '{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)

QWEN25VL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    '<|im_start|>system\n{{ self.DEFAULT_SYSTEM_MESSAGE }}<|im_end|>\n{% endif %}<|im_start|>'
    "{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image_url' %}"
    '{% if content.image_url is string %}{{ content.image_url }}{% else %}{{ content.image_url.url }}'
    "{% endif %}{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}"
    '<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n'
)


def marker_messages(messages: Sequence[dict], marker: str, policy: Any) -> tuple[list[dict], list[Image | Audio]]:
    """Messages whose ``image_url`` parts carry ``marker`` in place of the URL (the part lists kept,
    as upstream's templates iterate them), and the images in order."""
    out: list[dict] = []
    media: list[Image | Audio] = []
    for i, msg in enumerate(validate_messages(list(messages))):
        content = msg.get("content")
        if isinstance(content, str) and marker in content:
            raise MultimodalError(f"messages[{i}].content contains the media marker {marker!r}; "
                                  "pass images as image_url parts")
        if isinstance(content, list):
            parts = []
            for where, part in content_parts(content, i):
                kind = part.get("type")
                if kind == "image_url":
                    media.append(image_from_url(part.get("image_url"), where, policy))
                    parts.append({"type": "image_url", "image_url": marker})
                elif kind == "text":
                    if marker in str(part.get("text", "")):
                        raise MultimodalError(f"{where}: the text contains the media marker {marker!r}")
                    parts.append(part)
                else:
                    raise MultimodalError(f"{where}: {kind!r} parts are not supported by this vision handler "
                                          "(use text and image_url parts)")
            msg = {**msg, "content": parts}
        out.append(msg)
    return out, media


class _PresetEngine(MultimodalChatEngine):
    """The engine with a preset's template: part lists reach the template, and a default system
    message is added when the conversation has none."""

    default_system: str | None = None

    def render(self, messages: Sequence[dict]) -> tuple[str, list[Image | Audio], list[str], bool]:
        marker = self.mtmd.marker
        msgs, media = marker_messages(messages, marker, self.media_policy)
        first_system = next((m.get("content") for m in msgs if m.get("role") == "system"), None)
        if self.default_system is not None and not first_system:
            msgs = [{"role": "system", "content": self.default_system}, *msgs]
        res = self._formatter(messages=msgs)
        if res.prompt.count(marker) != len(media):
            raise MultimodalError(f"the {type(self).__name__} template kept {res.prompt.count(marker)} of "
                                  f"{len(media)} images")
        return res.prompt, media, list(res.stop), bool(res.added_special)


class Llava15ChatHandler(MTMDChatHandler):
    """LLaVA 1.5 (``USER:`` / ``ASSISTANT:``); the base of the template presets."""

    DEFAULT_SYSTEM_MESSAGE: str | None = (
        "A chat between a curious human and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the human's questions.")
    CHAT_FORMAT: str = LLAVA15_TEMPLATE

    def __init__(self, clip_model_path: str | os.PathLike[str], verbose: bool = True, *,
                 n_threads: int | None = None, use_gpu: bool = True, media_marker: str | None = None,
                 media_dirs: Sequence[str | os.PathLike[str]] | None = None) -> None:
        super().__init__(clip_model_path, verbose, use_gpu, n_threads=n_threads, media_marker=media_marker,
                         media_dirs=media_dirs)

    def engine_for(self, llama: Any) -> MultimodalChatEngine:
        model = llama.native_model()
        bos = model.token_text(model.token_bos()) if model.token_bos() >= 0 else ""
        eos = model.token_text(model.token_eos()) if model.token_eos() >= 0 else ""
        formatter = Jinja2ChatFormatter(self.CHAT_FORMAT, eos_token=eos, bos_token=bos, stop=[],
                                        added_special=False)
        engine = _PresetEngine(model, self._context_for(llama), formatter, seed=self._seed_of(llama),
                               media_dirs=self.media_dirs, **self._runner(llama))
        engine.default_system = self.DEFAULT_SYSTEM_MESSAGE
        return engine

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, local_dir: str | os.PathLike[str] | None = None,
                        local_dir_use_symlinks: Any = "auto", cache_dir: str | os.PathLike[str] | None = None,
                        **kwargs: Any) -> Llava15ChatHandler:
        """The projector ``filename`` (a glob) of a Hugging Face repo, through ``huggingface_hub``
        (offline, with ``HF_HUB_OFFLINE=1``, from the files already in the cache)."""
        try:
            from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
        except ImportError as exc:
            raise ImportError("from_pretrained needs huggingface_hub: pip install huggingface-hub") from exc
        if constants.HF_HUB_OFFLINE:
            root = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=cache_dir))
            files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        else:
            files = HfApi().list_repo_files(repo_id)
        matches = [f for f in files if fnmatch.fnmatch(f, filename or "*")]
        if len(matches) != 1:
            raise ValueError(f"{len(matches)} files in {repo_id} match {filename!r} (need exactly one); "
                             f"files: {files}")
        path = hf_hub_download(repo_id=repo_id, filename=matches[0], local_dir=local_dir, cache_dir=cache_dir)
        return cls(clip_model_path=path, **kwargs)


class ObsidianChatHandler(Llava15ChatHandler):
    CHAT_FORMAT = OBSIDIAN_TEMPLATE


class MoondreamChatHandler(Llava15ChatHandler):
    CHAT_FORMAT = MOONDREAM_TEMPLATE


class Llava16ChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = (
        "A chat between a curious human and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the human's questions. ")
    CHAT_FORMAT = LLAVA16_TEMPLATE


class NanoLlavaChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = "Answer the question"
    CHAT_FORMAT = NANO_LLAVA_TEMPLATE


class Llama3VisionAlphaChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = None
    CHAT_FORMAT = LLAMA3_VISION_ALPHA_TEMPLATE


Llama3VisionAlpha = Llama3VisionAlphaChatHandler  # upstream's alias


class MiniCPMv26ChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."
    CHAT_FORMAT = MINICPMV26_TEMPLATE


class Qwen25VLChatHandler(Llava15ChatHandler):
    DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."
    CHAT_FORMAT = QWEN25VL_TEMPLATE


class Gemma4ChatHandler(MTMDChatHandler):
    """Gemma 4 vision: the model's own chat template."""


__all__ = ["Gemma4ChatHandler", "Llama3VisionAlpha", "Llama3VisionAlphaChatHandler", "Llava15ChatHandler",
           "Llava16ChatHandler", "MTMDChatHandler", "MiniCPMv26ChatHandler", "MoondreamChatHandler",
           "NanoLlavaChatHandler", "ObsidianChatHandler", "Qwen25VLChatHandler", "marker_messages"]

"""llama-cpp-python's named chat formats, prompt for prompt (``format_llama2`` … ``format_gemma``).

Each ``format_*`` function takes OpenAI-style messages and returns a
:class:`~llama_cpp.llama_chat_format.ChatFormatterResponse` whose prompt is the one
llama-cpp-python 0.3.36 builds for the same messages, quirks included (a format with a fixed
system prompt ignores the caller's, ``saiga`` knows the role ``bot`` rather than ``assistant``,
``intel`` keeps its ``{system_message}`` placeholder unfilled), so a program moving between the two
packages sends its model the same text. ``added_special`` is False: the tokenizer adds BOS.

Only string content is rendered; a message whose content is a list of parts counts as empty, as
in llama-cpp-python. :data:`BUILTIN_FORMATS` is the one table of named formats: each row holds
that format's upstream text prompt and, for the common ones, a media-aware Jinja rendering.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .types import ChatFormatterResponse

logger = logging.getLogger("llama_cpp.chat")

Turn = tuple[str, "str | None"]
Messages = Sequence[Any]


def _response(prompt: str, stop: str | list[str] | None = None) -> ChatFormatterResponse:
    return ChatFormatterResponse(prompt=prompt, stop=stop, added_special=False)


def system_text(messages: Messages) -> str:
    """The content of the first system message ("" without one)."""
    for m in messages:
        if m.get("role") == "system":
            return m.get("content") or ""
    return ""


def turns(messages: Messages, labels: dict[str, str], *, reply: str | None = None) -> list[Turn]:
    """(label, text) for each message whose role has a label; non-string content becomes None.
    ``reply`` appends an open turn with that label for the model to complete."""
    out: list[Turn] = []
    for m in messages:
        role = m.get("role")
        if role in labels:
            content = m.get("content")
            out.append((labels[role], content if isinstance(content, str) else None))
    if reply is not None:
        out.append((reply, None))
    return out


# ---- the layouts the formats share ------------------------------------------------------------

def layout_llama2(system: str, ts: list[Turn], sep: str, sep2: str) -> str:
    seps = (sep, sep2)
    out = [system, sep]
    for i, (label, text) in enumerate(ts):
        if system and i == 0:
            out += [text or "", seps[i % 2]]
        elif text:
            out += [label, text, " ", seps[i % 2]]
        else:
            out += [label, " "]
    return "".join(out)


def layout_colon(system: str, ts: list[Turn], sep: str, sep2: str | None = None, *, open_end: str = ":") -> str:
    """``label: text`` turns; ``sep2`` alternates separators (user, assistant); an open turn ends in
    ``open_end``."""
    seps = (sep, sep if sep2 is None else sep2)
    out = [system, sep]
    for i, (label, text) in enumerate(ts):
        out.append(f"{label}: {text}{seps[i % 2]}" if text else label + open_end)
    return "".join(out)


def layout_plain(system: str, ts: list[Turn], sep: str) -> str:
    """``label`` + ``text`` + ``sep`` turns, no colon; an open turn is the label alone."""
    return system + "".join(label + text + sep if text else label for label, text in ts)


def layout_chatml(system: str, ts: list[Turn], sep: str) -> str:
    head = f"{system}{sep}\n" if system else ""
    return head + "".join(f"{label}\n{text}{sep}\n" if text else f"{label}\n" for label, text in ts)


# ---- the formats ---------------------------------------------------------------------------------

def format_llama2(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    system = system_text(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    ts = turns(messages, {"user": "<s>[INST]", "assistant": "[/INST]"})
    return _response(layout_llama2(system, ts, " ", "</s>") + "[/INST]")


def format_llama3(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    labels = {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")}
    ts = turns(messages, labels, reply=labels["assistant"])
    return _response(layout_plain("", ts, "<|eot_id|>"), "<|eot_id|>")


def format_alpaca(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "### Instruction", "assistant": "### Response"})
    return _response(layout_colon(system_text(messages), ts, "\n\n", "</s>"))


def format_qwen(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    system = "<|im_start|>system\n" + (system_text(messages) or "You are a helpful assistant.")
    ts = turns(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"},
               reply="<|im_start|>assistant")
    return _response(layout_chatml(system, ts, "<|im_end|>"), "<|endoftext|>")


VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                 "helpful, detailed, and polite answers to the user's questions.")


def format_vicuna(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "USER", "assistant": "ASSISTANT"}, reply="ASSISTANT")
    return _response(layout_colon(VICUNA_SYSTEM, ts, " ", "</s>"))


def format_oasst_llama(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    system = f"[INST] <<SYS>>\n{system_text(messages)}\n<</SYS>>\n\n"
    ts = turns(messages, {"user": "<|prompter|>", "assistant": "<|assistant|>"}, reply="<|assistant|>")
    return _response(layout_plain(system, ts, "</s>"))


def format_baichuan2(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<reserved_106>", "assistant": "<reserved_107>"}, reply="<reserved_107>")
    return _response(layout_plain(system_text(messages), ts, ""))


def format_baichuan(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<reserved_102>", "assistant": "<reserved_103>"}, reply="<reserved_103>")
    return _response(layout_plain(system_text(messages), ts, ""))


OPENBUDDY_SYSTEM = (
    "You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.\n"
    "Always answer as helpfully and logically as possible, while being safe. Your answers should not include any "
    "harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure "
    "that your responses are socially unbiased and positive in nature.\n"
    "If a question does not make any sense, or is not factually coherent, explain why instead of answering "
    "something not correct. If you don't know the answer to a question, please don't share false information.\n"
    "You can speak fluently in many languages, for example: English, Chinese.\n"
    "You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.\n"
    "You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are "
    "based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.\n\n"
)


def format_openbuddy(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "User", "assistant": "Assistant"}, reply="Assistant")
    return _response(layout_colon(OPENBUDDY_SYSTEM, ts, "\n"))


def format_redpajama_incite(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<human>", "assistant": "<bot>"}, reply="<bot>")
    return _response(layout_colon(system_text(messages), ts, "\n"), "<human>")


SNOOZY_SYSTEM = ("The prompt below is a question to answer, a task to complete, or a conversation to respond to; "
                 "decide which and write an appropriate response.")


def format_snoozy(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    # llama-cpp-python builds an "### Instruction:" header and then uses the bare system text
    ts = turns(messages, {"user": "### Prompt", "assistant": "### Response"}, reply="### Response")
    return _response(layout_colon(system_text(messages) or SNOOZY_SYSTEM, ts, "\n"), "###")


def format_phind(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "### User Message", "assistant": "### Assistant"}, reply="### Assistant")
    return _response(layout_colon("### System Prompt\nYou are an intelligent programming assistant.", ts, "\n\n"))


def format_intel(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "### User:", "assistant": "### Assistant:"}, reply="### Assistant:")
    # the placeholder is left unfilled, as in llama-cpp-python
    return _response(layout_colon("### System:\n{system_message}", ts, "\n"))


OPEN_ORCA_SYSTEM = (
    "You are a helpful assistant. Please answer truthfully and write out your thinking step by step to be sure "
    "you get the right answer. If you make a mistake or encounter an error in your thinking, say so out loud and "
    "attempt to correct it. If you don't know or aren't sure about something, say so clearly. You will act as a "
    "professional logician, mathematician, and physicist. You will also act as the most appropriate type of "
    "expert to answer any particular question or solve the relevant problem; state which expert type your are, "
    "if so. Also think of any particular named expert that would be ideal to answer the relevant question or "
    "solve the relevant problem; name and act as them, if appropriate."
)


def format_open_orca(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    # the role names are matched capitalised ("User", "Assistant"), as in llama-cpp-python
    ts = turns(messages, {"User": "User", "Assistant": "Assistant"}, reply="Assistant")
    return _response(layout_colon(OPEN_ORCA_SYSTEM, ts, "<|end_of_turn|>\n", open_end=": "), "User")


def format_mistrallite(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<|prompter|>", "assistant": "</s>\n<|assistant|>"}, reply="</s>\n<|assistant|>")
    return _response(layout_plain(f"<|system|>{system_text(messages)}</s>", ts, " "))


def format_zephyr(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<|user|>\n", "assistant": "<|assistant|>\n"}, reply="<|assistant|>\n")
    return _response(layout_chatml(f"<|system|>\n{system_text(messages)}", ts, "</s>"), "</s>")


def format_pygmalion(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<|user|>", "assistant": "<|model|>"}, reply="<|model|>")
    return _response(layout_chatml(f"<|system|>{system_text(messages)}", ts, "\n"), "\n")


def format_chatml(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"},
               reply="<|im_start|>assistant")
    return _response(layout_chatml(f"<|im_start|>system\n{system_text(messages)}", ts, "<|im_end|>"), "<|im_end|>")


def format_mistral_instruct(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    parts = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "user" and isinstance(content, str):
            parts.append("[INST] " + content)
        elif role == "assistant" and content is not None:
            parts.append(f" [/INST]{content}</s>")
    return _response("".join(parts) + " [/INST]", "</s>")


def format_chatglm3(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "<|user|>", "assistant": "<|assistant|>"}, reply="<|assistant|>")
    prompt = f"<|system|>\n{system_text(messages)}" + "".join(
        f"{label}\n {text}" if text else label for label, text in ts)
    return _response(prompt, "</s>")


def format_openchat(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    reply = "<|end_of_turn|>GPT4 Correct Assistant: "
    ts = turns(messages, {"user": "GPT4 Correct User: ", "assistant": reply}, reply=reply)
    return _response(layout_chatml(f"{system_text(messages)}<|end_of_turn|>", ts, "<|end_of_turn|>"),
                     "<|end_of_turn|>")


def format_saiga(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    ts = turns(messages, {"user": "user", "bot": "bot", "system": "system"})
    prompt = "".join(f"<s>{label}\n{text}</s>" if text else f"<s>{label}\n" for label, text in ts) + "<s>bot"
    return _response(prompt.strip())


def format_gemma(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    if system_text(messages):
        logger.debug("gemma format: system messages are dropped (Gemma has no system role)")
    ts = turns(messages, {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"},
               reply="<start_of_turn>model\n")
    return _response(layout_plain("", ts, "<end_of_turn>\n"), "<end_of_turn>\n")


# ---- media-aware renderings ------------------------------------------------------------------
# Jinja templates of the same formats that place every part of a message (images, audio), for image and
# audio chat, which upstream's text prompts cannot carry; phi-3 has only this rendering.

_TEXT = "{% macro text(c) %}{% if c is string %}{{ c }}{% elif c %}{% for p in c %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"

# name: (template, stop strings, the template emits BOS itself)
_MEDIA: dict[str, tuple[str, list[str], bool]] = {
    "chatml": (
        _TEXT + "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ text(m.content) }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        ["<|im_end|>"], False),
    "llama-2": (
        _TEXT + "{% set ns = namespace(sys='') %}{% for m in messages %}{% if m.role == 'system' %}"
        "{% set ns.sys = '<<SYS>>\n' + text(m.content) + '\n<</SYS>>\n\n' %}"
        "{% elif m.role == 'user' %}{{ bos_token }}[INST] {{ ns.sys }}{{ text(m.content) }} [/INST]"
        "{% set ns.sys = '' %}{% elif m.role == 'assistant' %} {{ text(m.content) }} {{ eos_token }}"
        "{% endif %}{% endfor %}",
        [], True),
    "llama-3": (
        _TEXT + "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{{ text(m.content) }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
        ["<|eot_id|>"], True),
    "gemma": (
        _TEXT + "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.sys = text(m.content) + '\n\n' %}"
        "{% else %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
        "{% if m.role == 'user' %}{{ ns.sys }}{% set ns.sys = '' %}{% endif %}"
        "{{ text(m.content) }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
        ["<end_of_turn>"], True),
    "mistral-instruct": (
        _TEXT + "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ text(m.content) }} [/INST]"
        "{% elif m.role == 'assistant' %}{{ text(m.content) }}{{ eos_token }}{% elif m.role == 'system' %}"
        "[INST] {{ text(m.content) }} [/INST]{% endif %}{% endfor %}",
        [], True),
    "phi-3": (
        _TEXT + "{% for m in messages %}<|{{ m.role }}|>\n{{ text(m.content) }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
        ["<|end|>", "<|endoftext|>"], False),
    "alpaca": (
        _TEXT + "{% for m in messages %}{% if m.role == 'system' %}{{ text(m.content) }}\n\n"
        "{% elif m.role == 'user' %}### Instruction:\n{{ text(m.content) }}\n\n"
        "{% elif m.role == 'assistant' %}### Response:\n{{ text(m.content) }}\n\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}### Response:\n{% endif %}",
        ["###"], False),
    "vicuna": (
        _TEXT + "{% for m in messages %}{% if m.role == 'system' %}{{ text(m.content) }}\n\n"
        "{% elif m.role == 'user' %}USER: {{ text(m.content) }}\n{% elif m.role == 'assistant' %}"
        "ASSISTANT: {{ text(m.content) }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT: {% endif %}",
        ["USER:"], False),
    "zephyr": (
        _TEXT + "{% for m in messages %}<|{{ m.role }}|>\n{{ text(m.content) }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
        ["</s>"], False),
}

ALIASES: dict[str, str] = {"llama2": "llama-2", "llama3": "llama-3", "mistral": "mistral-instruct", "phi3": "phi-3",
            "gemma2": "gemma", "gemma3": "gemma"}


_TEXT_FORMATS: dict[str, Callable[..., Any]] = {
    "llama-2": format_llama2, "llama-3": format_llama3, "alpaca": format_alpaca, "qwen": format_qwen,
    "vicuna": format_vicuna, "oasst_llama": format_oasst_llama, "baichuan-2": format_baichuan2,
    "baichuan": format_baichuan, "openbuddy": format_openbuddy, "redpajama-incite": format_redpajama_incite,
    "snoozy": format_snoozy, "phind": format_phind, "intel": format_intel, "open-orca": format_open_orca,
    "mistrallite": format_mistrallite, "zephyr": format_zephyr, "pygmalion": format_pygmalion,
    "chatml": format_chatml, "mistral-instruct": format_mistral_instruct, "chatglm3": format_chatglm3,
    "openchat": format_openchat, "saiga": format_saiga, "gemma": format_gemma,
}


@dataclass(frozen=True)
class MediaTemplate:
    """A named format as a Jinja template that places media parts."""

    template: str
    stop: tuple[str, ...]
    emits_bos: bool


@dataclass(frozen=True)
class NamedFormat:
    """One named chat format: llama-cpp-python's text prompt (``text``) and, where this package has one,
    its media-aware rendering (``media``); at least one of the two."""

    text: Callable[..., Any] | None = None
    media: MediaTemplate | None = None


def _builtin() -> dict[str, NamedFormat]:
    out = {name: NamedFormat(text=fn) for name, fn in _TEXT_FORMATS.items()}
    for name, (template, stop, emits_bos) in _MEDIA.items():
        out[name] = NamedFormat(out.get(name, NamedFormat()).text, MediaTemplate(template, tuple(stop), emits_bos))
    return out


#: every built-in named format, one row per name (the live registry, with ``register_chat_format``'s
#: additions, is :data:`llama_cpp._chat.base.NAMED_FORMATS`)
BUILTIN_FORMATS: dict[str, NamedFormat] = _builtin()

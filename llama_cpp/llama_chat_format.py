"""Chat prompt formatting: the model's own Jinja chat template, rendered in a sandbox, or a named format.

A GGUF model usually carries its Hugging Face chat template (``tokenizer.chat_template``). It is
rendered with :class:`jinja2.sandbox.ImmutableSandboxedEnvironment` and the helpers HF templates
expect (``raise_exception``, ``strftime_now``, a ``tojson`` filter that keeps non-ASCII text, the
``{% generation %}`` tag). Template files come from model authors and are untrusted: the sandbox
refuses attribute access to internals (``__class__``, ``__globals__`` …) and mutation of inputs,
and any such attempt, any syntax error and any ``raise_exception`` call surfaces as
:class:`~llama_cpp.TemplateError` (a ValueError, as upstream raises).

The rest is llama-cpp-python 0.3.36's surface: the handler registry
(:func:`register_chat_completion_handler`, :func:`get_chat_completion_handler`,
:func:`register_chat_format`), every named format as a ``format_*`` function with upstream's exact
prompts (:mod:`llama_cpp._chat.formats`), ``chatml-function-calling`` and ``functionary*``
(:mod:`llama_cpp._chat.tools`), :func:`hf_tokenizer_config_to_chat_formatter`,
:func:`hf_autotokenizer_to_chat_formatter` (needs ``transformers``), and the vision handler
classes (``Llava15ChatHandler`` …, :mod:`llama_cpp._multimodal.vision_handlers`), loaded on first use.

:func:`model_chat_formatter` serves ``Llama(chat_format=...)``: every upstream name gives upstream's
exact prompt; this package's own templates (``phi-3``, and the media-aware versions of ``chatml``,
``llama-2``, ``llama-3``, ``gemma``, ``mistral-instruct``, ``alpaca``, ``vicuna``, ``zephyr`` that
:func:`get_chat_formatter` returns) serve image and audio chat. A name registered with
:func:`register_chat_format` is a ``chat_format`` too.
"""

from __future__ import annotations

from typing import Any

from ._chat import formats as _formats
from ._chat.base import (
    Jinja2ChatFormatter,
    LlamaChatCompletionHandlerNotFoundException,
    LlamaChatCompletionHandlerRegistry,
    NamedChatFormatter,
    chat_format_names,
    chat_formatter_to_chat_completion_handler,
    chat_handler_for_format,
    get_chat_completion_handler,
    get_chat_formatter,
    make_environment,
    make_strict_environment,
    model_chat_formatter,
    register_chat_completion_handler,
    register_chat_format,
    validate_messages,
)
from ._chat.native_completion import (  # noqa: F401 (re-exported)
    NativeChatHandler,
    chat_route,
    check_chat_options,
    native_tools_handler,
)
from ._chat.types import ChatFormatter, ChatFormatterResponse, LlamaChatCompletionHandler
from ._errors import TemplateError

# the templates llama-cpp-python recognises in GGUF metadata (guess_chat_format_from_gguf_metadata)
CHATML_CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
                        "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                        "{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_BOS_TOKEN = "<s>"
CHATML_EOS_TOKEN = "<|im_end|>"
_MISTRAL_HEAD = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
                 "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
                 "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
                 "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}")
_MISTRAL_TAIL = ("{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
                 "{% endfor %}")
MISTRAL_INSTRUCT_CHAT_TEMPLATE = _MISTRAL_HEAD + "{{ message['content'] + eos_token + ' ' }}" + _MISTRAL_TAIL
MISTRAL_INSTRUCT_BOS_TOKEN = "<s>"
MISTRAL_INSTRUCT_EOS_TOKEN = "</s>"
MIXTRAL_INSTRUCT_CHAT_TEMPLATE = _MISTRAL_HEAD + "{{ message['content'] + eos_token}}" + _MISTRAL_TAIL
LLAMA3_INSTRUCT_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")


def _register_builtins() -> None:
    from ._chat import tools

    reg = LlamaChatCompletionHandlerRegistry()
    for name, row in _formats.BUILTIN_FORMATS.items():
        if row.text is not None:
            reg.register_chat_completion_handler(name, chat_formatter_to_chat_completion_handler(row.text),
                                                 overwrite=True)
    reg.register_chat_completion_handler("functionary", tools.functionary_chat_handler, overwrite=True)
    reg.register_chat_completion_handler("functionary-v1", tools.functionary_v1_v2_chat_handler, overwrite=True)
    reg.register_chat_completion_handler("functionary-v2", tools.functionary_v1_v2_chat_handler, overwrite=True)
    reg.register_chat_completion_handler("chatml-function-calling", tools.chatml_function_calling, overwrite=True)
    # llama.cpp's own chat layer (libllama-cpp-ext): the model's template, tool calls and reasoning parsed
    reg.register_chat_completion_handler("llama-cpp", NativeChatHandler(), overwrite=True)


_register_builtins()


# --------------------------------------------------------------------------------------------
# Hugging Face tokenizer configs
# --------------------------------------------------------------------------------------------

def hf_tokenizer_config_to_chat_formatter(tokenizer_config: dict[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """A formatter from a ``tokenizer_config.json`` dict (``chat_template``, ``bos_token``, ``eos_token``).

    As in llama-cpp-python, the generation prompt is an empty assistant message appended to the
    conversation, and the stop strings are the EOS and BOS texts."""
    if not isinstance(tokenizer_config, dict):
        raise TypeError("tokenizer_config must be the dict of a tokenizer_config.json")
    fields = {}
    for key in ("chat_template", "bos_token", "eos_token"):
        value = tokenizer_config.get(key)
        if isinstance(value, dict):  # {"content": "<s>", ...} in some configs
            value = value.get("content")
        if not isinstance(value, str):
            raise ValueError(f"tokenizer_config has no string {key!r}; it is needed to build the chat formatter")
        fields[key] = value
    jinja = Jinja2ChatFormatter(fields["chat_template"], eos_token=fields["eos_token"],
                                bos_token=fields["bos_token"], add_generation_prompt=False)

    def format_tokenizer_config(messages: list[Any], **kwargs: Any) -> ChatFormatterResponse:
        if add_generation_prompt:
            messages = [*messages, {"role": "assistant", "content": ""}]
        prompt = jinja.render(messages, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=[fields["eos_token"], fields["bos_token"]],
                                     added_special=True)

    return format_tokenizer_config


def hf_tokenizer_config_to_chat_completion_handler(tokenizer_config: dict[str, Any],
                                                   add_generation_prompt: bool = True) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(
        hf_tokenizer_config_to_chat_formatter(tokenizer_config, add_generation_prompt=add_generation_prompt))


def hf_autotokenizer_to_chat_formatter(pretrained_model_name_or_path: Any) -> ChatFormatter:
    """A formatter that renders with ``transformers.AutoTokenizer.apply_chat_template``."""
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError("hf_autotokenizer_to_chat_formatter needs transformers: pip install transformers") from exc
    tokenizer = AutoTokenizer.from_pretrained(pretrained_model_name_or_path)

    def format_autotokenizer(messages: list[Any], **kwargs: Any) -> ChatFormatterResponse:
        tokenizer.use_default_system_prompt = False
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        if not isinstance(prompt, str):
            raise TemplateError("the tokenizer's apply_chat_template did not return text")
        return ChatFormatterResponse(prompt=prompt, stop=tokenizer.eos_token, added_special=True)

    return format_autotokenizer


def hf_autotokenizer_to_chat_completion_handler(pretrained_model_name_or_path: Any) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(hf_autotokenizer_to_chat_formatter(pretrained_model_name_or_path))


def guess_chat_format_from_gguf_metadata(metadata: dict[str, str]) -> str | None:
    """The named format whose template is exactly the GGUF's ``tokenizer.chat_template``, if any."""
    template = metadata.get("tokenizer.chat_template")
    if template is None:
        return None
    if template == CHATML_CHAT_TEMPLATE:
        return "chatml"
    if template in (MISTRAL_INSTRUCT_CHAT_TEMPLATE, MIXTRAL_INSTRUCT_CHAT_TEMPLATE):
        return "mistral-instruct"
    if template == LLAMA3_INSTRUCT_CHAT_TEMPLATE:
        return "llama-3"
    return None


# --------------------------------------------------------------------------------------------
# the format functions and the vision handler classes, under their upstream names
# --------------------------------------------------------------------------------------------

format_llama2 = _formats.format_llama2
format_llama3 = _formats.format_llama3
format_alpaca = _formats.format_alpaca
format_qwen = _formats.format_qwen
format_vicuna = _formats.format_vicuna
format_oasst_llama = _formats.format_oasst_llama
format_baichuan2 = _formats.format_baichuan2
format_baichuan = _formats.format_baichuan
format_openbuddy = _formats.format_openbuddy
format_redpajama_incite = _formats.format_redpajama_incite
format_snoozy = _formats.format_snoozy
format_phind = _formats.format_phind
format_intel = _formats.format_intel
format_open_orca = _formats.format_open_orca
format_mistrallite = _formats.format_mistrallite
format_zephyr = _formats.format_zephyr
format_pygmalion = _formats.format_pygmalion
format_chatml = _formats.format_chatml
format_mistral_instruct = _formats.format_mistral_instruct
format_chatglm3 = _formats.format_chatglm3
format_openchat = _formats.format_openchat
format_saiga = _formats.format_saiga
format_gemma = _formats.format_gemma
format = format_vicuna  # noqa: A001 - upstream registers vicuna under this name


def __getattr__(name: str) -> Any:
    # the tool handlers and vision classes load on first use (they pull in mtmd and more)
    from ._chat import tools

    if name in ("chatml_function_calling", "functionary_chat_handler", "functionary_v1_v2_chat_handler"):
        return getattr(tools, name)
    if name.endswith("ChatHandler") or name == "Llama3VisionAlpha":
        from ._multimodal import vision_handlers as _vision_handlers

        if name in _vision_handlers.__all__:
            return getattr(_vision_handlers, name)
    raise AttributeError(f"module 'llama_cpp.llama_chat_format' has no attribute {name!r}")


__all__ = [
    "CHATML_BOS_TOKEN", "CHATML_CHAT_TEMPLATE", "CHATML_EOS_TOKEN", "LLAMA3_INSTRUCT_CHAT_TEMPLATE",
    "MISTRAL_INSTRUCT_BOS_TOKEN", "MISTRAL_INSTRUCT_CHAT_TEMPLATE", "MISTRAL_INSTRUCT_EOS_TOKEN",
    "MIXTRAL_INSTRUCT_CHAT_TEMPLATE", "ChatFormatter", "ChatFormatterResponse", "Jinja2ChatFormatter",
    "LlamaChatCompletionHandler", "LlamaChatCompletionHandlerNotFoundException",
    "LlamaChatCompletionHandlerRegistry", "NamedChatFormatter", "NativeChatHandler", "TemplateError", "chat_format_names",
    "chat_formatter_to_chat_completion_handler", "chat_handler_for_format", "get_chat_completion_handler",
    "get_chat_formatter", "guess_chat_format_from_gguf_metadata", "hf_autotokenizer_to_chat_completion_handler",
    "hf_autotokenizer_to_chat_formatter", "hf_tokenizer_config_to_chat_completion_handler",
    "hf_tokenizer_config_to_chat_formatter", "make_environment", "make_strict_environment", "model_chat_formatter",
    "register_chat_completion_handler", "register_chat_format", "validate_messages",
    "format_llama2",
    "format_llama3",
    "format_alpaca",
    "format_qwen",
    "format_vicuna",
    "format_oasst_llama",
    "format_baichuan2",
    "format_baichuan",
    "format_openbuddy",
    "format_redpajama_incite",
    "format_snoozy",
    "format_phind",
    "format_intel",
    "format_open_orca",
    "format_mistrallite",
    "format_zephyr",
    "format_pygmalion",
    "format_chatml",
    "format_mistral_instruct",
    "format_chatglm3",
    "format_openchat",
    "format_saiga",
    "format_gemma",
]

"""Chat prompt formatting: the model's own Jinja chat template, rendered in a sandbox, or a named format.

A GGUF model usually carries its Hugging Face chat template (``tokenizer.chat_template``). It is
rendered with :class:`jinja2.sandbox.ImmutableSandboxedEnvironment` and the helpers HF templates
expect (``raise_exception``, ``strftime_now``, a ``tojson`` filter that keeps non-ASCII text).
Template files come from model authors and are untrusted: the sandbox refuses attribute access
to internals (``__class__``, ``__globals__`` …) and mutation of inputs, and any such attempt, any
syntax error and any ``raise_exception`` call surfaces as :class:`~llama_cpp.TemplateError`.

Named formats (``chatml``, ``llama-2``, ``llama-3``, ``gemma``, ``mistral-instruct``, ``phi-3``,
``alpaca``, ``vicuna``, ``zephyr``) are small templates rendered the same way.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError

from ._errors import TemplateError
from ._template_budget import DEFAULT_LIMITS, BudgetedSandbox, RenderLimits


@dataclasses.dataclass
class ChatFormatterResponse:
    """A rendered prompt, the stop strings of the format, and whether it already holds BOS."""

    prompt: str
    stop: list[str] = dataclasses.field(default_factory=list)
    added_special: bool = True


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _StrictSandbox(BudgetedSandbox):
    """Refuse unsafe attribute access at once (the default renders it as an empty Undefined)."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is unsafe")


def make_environment() -> _StrictSandbox:
    """The sandboxed Jinja environment every chat template is rendered in."""
    env = _StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined, autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class Jinja2ChatFormatter:
    """Render a Hugging Face-style chat template (compatible with llama-cpp-python's class)."""

    def __init__(self, template: str, eos_token: str = "", bos_token: str = "",
                 add_generation_prompt: bool = True, stop_token_ids: Sequence[int] | None = None,
                 stop: Sequence[str] | None = None, added_special: bool = True,
                 limits: RenderLimits = DEFAULT_LIMITS) -> None:
        self.template = template
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids or ())
        self.stop = list(stop) if stop is not None else ([eos_token] if eos_token else [])
        self.added_special = added_special
        self.limits = limits
        self._environment = make_environment()
        try:
            self._compiled = self._environment.from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"the chat template does not parse (line {exc.lineno}): {exc.message}") from exc

    def render(self, messages: Sequence[dict[str, Any]], *, tools: Any = None, functions: Any = None,
               add_generation_prompt: bool | None = None, **extra: Any) -> str:
        agp = self.add_generation_prompt if add_generation_prompt is None else add_generation_prompt
        try:
            return self._environment.render_bounded(
                self._compiled, self.limits, messages=[dict(m) for m in messages], eos_token=self.eos_token, bos_token=self.bos_token,
                add_generation_prompt=agp, tools=tools, functions=functions, **extra,
            )
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(f"the chat template tried to leave its sandbox: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template failed to render: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                RecursionError, OverflowError) as exc:
            raise TemplateError(f"the chat template failed to render: {type(exc).__name__}: {exc}") from exc

    def __call__(self, *, messages: Sequence[dict[str, Any]], tools: Any = None, functions: Any = None,
                 **kwargs: Any) -> ChatFormatterResponse:
        prompt = self.render(messages, tools=tools, functions=functions, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=list(self.stop), added_special=self.added_special)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the OpenAI message shape before any template sees it."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}] has no 'role' string")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"messages[{i}]['content'] must be a string, a list of parts or None")
        out.append(dict(m))
    return out


# --------------------------------------------------------------------------------------------
# named formats
# --------------------------------------------------------------------------------------------

_TEXT = "{% macro text(c) %}{% if c is string %}{{ c }}{% elif c %}{% for p in c %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"

_FORMATS: dict[str, tuple[str, list[str], bool]] = {
    # name: (template, stop strings, template emits BOS itself)
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

_ALIASES = {"llama2": "llama-2", "llama3": "llama-3", "mistral": "mistral-instruct", "phi3": "phi-3",
            "gemma2": "gemma", "gemma3": "gemma"}


def chat_format_names() -> list[str]:
    return sorted(_FORMATS)


def get_chat_formatter(name: str, *, bos_token: str = "", eos_token: str = "") -> Jinja2ChatFormatter:
    """A formatter for a named chat format; raises ValueError listing the names on a typo."""
    key = _ALIASES.get(name, name)
    if key not in _FORMATS:
        raise ValueError(f"unknown chat_format {name!r}; choose one of {', '.join(chat_format_names())}")
    template, stop, emits_bos = _FORMATS[key]
    return Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, stop=stop,
                               added_special=emits_bos)


def model_chat_formatter(model: Any, *, chat_format: str | None = None,
                         template: str | None = None) -> Jinja2ChatFormatter | None:
    """The formatter for a loaded model (a :class:`~llama_cpp._internals.LlamaModel`): the named
    ``chat_format``, else ``template``, else the model's own template; None when it has none.
    BOS/EOS are the model's token texts."""
    bos = model.token_text(model.token_bos()) if model.token_bos() >= 0 else ""
    eos = model.token_text(model.token_eos()) if model.token_eos() >= 0 else ""
    if chat_format is not None:
        return get_chat_formatter(chat_format, bos_token=bos, eos_token=eos)
    template = template or model.chat_template()
    if not template:
        return None
    return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)

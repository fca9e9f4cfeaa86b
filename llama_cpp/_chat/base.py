"""The chat formatting machinery shared by the public modules: the sandboxed Jinja formatter, this
package's named templates, the formatter response, and llama-cpp-python's handler registry.

:mod:`llama_cpp.llama_chat_format` is the public face of all of it; the handler modules and the
multimodal engine import from here, so none of them imports the public module (which loads them).
A GGUF's Hugging Face chat template is untrusted input: it renders in
:class:`jinja2.sandbox.ImmutableSandboxedEnvironment` under a work budget, and every escape
attempt, syntax error and ``raise_exception`` call surfaces as :class:`~llama_cpp.TemplateError`.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError

from .._compat.hooks import StoppingCriteriaList
from .._errors import LlamaError, TemplateError
from .._safety.arguments import ArgumentTypeError
from .._safety.template_budget import DEFAULT_LIMITS, RenderLimits
from .._safety.template_guard import GuardedSandbox
from . import formats as _formats
from .handler import formatter_to_handler
from .types import ChatFormatterResponse, LlamaChatCompletionHandler


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _StrictSandbox(GuardedSandbox):
    """Refuse unsafe attribute access at once (the default renders it as an empty Undefined)."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is unsafe")


class _GenerationTag(jinja2.ext.Extension):
    """Hugging Face's ``{% generation %}…{% endgeneration %}`` (marks trainable text): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def make_environment() -> _StrictSandbox:
    """The sandboxed Jinja environment every chat template is rendered in."""
    env = _StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTag],
        undefined=jinja2.Undefined, autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.finalize_filters()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def make_strict_environment(*, autoescape: bool = False, trim: bool = False) -> _StrictSandbox:
    """A sandbox with Jinja's defaults (its HTML-safe ``tojson``), undefined names an error:
    the settings llama-cpp-python's built-in handler templates render with."""
    return _StrictSandbox(autoescape=autoescape, undefined=jinja2.StrictUndefined, trim_blocks=trim,
                          lstrip_blocks=trim)


def _stop_on_token_ids(ids: set[int]) -> Any:
    def stop_on_last_token(tokens: Any, logits: Any) -> bool:
        return bool(len(tokens)) and int(tokens[-1]) in ids

    return StoppingCriteriaList([stop_on_last_token])


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
                 function_call: Any = None, tool_choice: Any = None, **kwargs: Any) -> ChatFormatterResponse:
        prompt = self.render(messages, tools=tools, functions=functions, function_call=function_call,
                             tool_choice=tool_choice, **kwargs)
        criteria = _stop_on_token_ids(self.stop_token_ids) if self.stop_token_ids else None
        return ChatFormatterResponse(prompt=prompt, stop=list(self.stop), stopping_criteria=criteria,
                                     added_special=self.added_special)

    def to_chat_handler(self) -> LlamaChatCompletionHandler:
        return chat_formatter_to_chat_completion_handler(self)


_ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the OpenAI message shape before any template sees it."""
    if not isinstance(messages, (list, tuple)):
        raise ArgumentTypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ArgumentTypeError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{i}] has no 'role' string")
        if not _ROLE.fullmatch(role):  # a role is rendered outside the content: never special-token text
            raise ValueError(f"messages[{i}]['role'] = {role[:40]!r} is not a role name: use a plain name of "
                             "letters, digits, '_' or '-' (at most 32), such as 'system', 'user' or 'assistant'")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"messages[{i}]['content'] must be a string, a list of parts or None")
        out.append(dict(m))
    return out


# --------------------------------------------------------------------------------------------
# named formats
# --------------------------------------------------------------------------------------------

class NamedChatFormatter:
    """One of llama-cpp-python's named formats (a ``format_*`` function) as a formatter whose
    ``stop`` is always a list."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn

    def __call__(self, *, messages: Sequence[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
        r = self.fn(messages=[_text_parts_joined(m) for m in messages], **kwargs)
        stop = [] if r.stop is None else [r.stop] if isinstance(r.stop, str) else list(r.stop)
        return ChatFormatterResponse(prompt=r.prompt, stop=stop, stopping_criteria=r.stopping_criteria,
                                     added_special=r.added_special)

    def __repr__(self) -> str:
        return f"NamedChatFormatter({self.name!r})"


def _text_parts_joined(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is a list of text parts only, with the texts as one string (upstream's
    formats render list content as empty; a list holding other parts is passed as it is)."""
    content = message.get("content")
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return {**message, "content": "".join(p["text"] for p in content)}
    return message


#: the named chat formats ``Llama(chat_format=...)`` accepts: the built-in rows and those
#: :func:`register_chat_format` adds (a registered name replaces the whole row)
NAMED_FORMATS: dict[str, _formats.NamedFormat] = dict(_formats.BUILTIN_FORMATS)


def chat_format_names() -> list[str]:
    """Every name ``Llama(chat_format=...)`` accepts as a prompt format."""
    return sorted(NAMED_FORMATS)


def _named(name: str) -> _formats.NamedFormat | None:
    return NAMED_FORMATS.get(name) or NAMED_FORMATS.get(_formats.ALIASES.get(name, name))


def _jinja(media: _formats.MediaTemplate, bos: str, eos: str) -> Jinja2ChatFormatter:
    return Jinja2ChatFormatter(media.template, eos_token=eos, bos_token=bos, stop=list(media.stop),
                               added_special=media.emits_bos)


def get_chat_formatter(name: str, *, bos_token: str = "", eos_token: str = "",
                       media: bool = True) -> Jinja2ChatFormatter | NamedChatFormatter:
    """A formatter for a named chat format: its media-aware rendering where it has one (``media=False``:
    llama-cpp-python's text prompt where it has one); raises ValueError listing the names on a typo."""
    row = _named(name)
    if row is None:
        if name in LlamaChatCompletionHandlerRegistry._chat_handlers:
            raise ValueError(f"chat_format {name!r} is a chat handler, not a prompt format: use "
                             f"chat_handler=llama_cpp.llama_chat_format.get_chat_completion_handler({name!r})")
        raise ValueError(f"unknown chat_format {name!r}; choose one of {', '.join(chat_format_names())}")
    if row.media is not None and (media or row.text is None):
        return _jinja(row.media, bos_token, eos_token)
    assert row.text is not None  # a row has at least one rendering
    return NamedChatFormatter(name, row.text)


def chat_handler_for_format(name: str) -> LlamaChatCompletionHandler | None:
    """The registered handler for ``name`` when it is a handler without a prompt format
    (``chatml-function-calling``, ``functionary*``, one registered with
    :func:`register_chat_completion_handler`); None for a prompt format."""
    if _named(name) is not None:
        return None
    return LlamaChatCompletionHandlerRegistry._chat_handlers.get(name)


def model_chat_formatter(model: Any, *, chat_format: str | None = None, template: str | None = None,
                         media: bool = False) -> Jinja2ChatFormatter | NamedChatFormatter | None:
    """The formatter for a loaded model (a :class:`~llama_cpp._internals.LlamaModel`): the named
    ``chat_format``, else ``template``, else the model's own template; None when it has none.
    BOS/EOS are the model's token texts.

    A name llama-cpp-python knows gives its exact prompt (``Llama(chat_format="llama-2")`` sends
    what upstream sends); with ``media=True`` (image and audio chat) the names this package has
    templates for render with those, which place every media part of a message."""
    bos = model.token_text(model.token_bos()) if model.token_bos() >= 0 else ""
    eos = model.token_text(model.token_eos()) if model.token_eos() >= 0 else ""
    if chat_format is not None:
        return get_chat_formatter(chat_format, bos_token=bos, eos_token=eos, media=media)
    template = template or model.chat_template()
    if not template:
        return None
    return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)


# --------------------------------------------------------------------------------------------
# the handler registry
# --------------------------------------------------------------------------------------------

class LlamaChatCompletionHandlerNotFoundException(LlamaError, KeyError):
    """No chat handler is registered under the name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LlamaChatCompletionHandlerRegistry:
    """The process-wide name → chat handler table (one instance, as upstream's singleton)."""

    _instance: LlamaChatCompletionHandlerRegistry | None = None
    _chat_handlers: dict[str, LlamaChatCompletionHandler] = {}

    def __new__(cls) -> LlamaChatCompletionHandlerRegistry:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def register_chat_completion_handler(self, name: str, chat_handler: LlamaChatCompletionHandler,
                                         overwrite: bool = False) -> None:
        if not overwrite and name in self._chat_handlers:
            raise ValueError(f"a chat handler named {name!r} is already registered; pass overwrite=True to replace it")
        self._chat_handlers[name] = chat_handler

    def unregister_chat_handler(self, name: str) -> None:
        if name not in self._chat_handlers:
            raise ValueError(f"no chat handler is registered under the name {name!r}")
        del self._chat_handlers[name]
        builtin = _formats.BUILTIN_FORMATS.get(name)
        if NAMED_FORMATS.get(name) is not builtin:  # a registered format goes; a built-in one it replaced returns
            if builtin is None:
                del NAMED_FORMATS[name]
            else:
                NAMED_FORMATS[name] = builtin

    def get_chat_completion_handler_by_name(self, name: str) -> LlamaChatCompletionHandler:
        try:
            return self._chat_handlers[name]
        except KeyError:
            raise LlamaChatCompletionHandlerNotFoundException(
                f"no chat handler named {name!r}; registered: {', '.join(self._chat_handlers)}") from None


def get_chat_completion_handler(name: str) -> LlamaChatCompletionHandler:
    return LlamaChatCompletionHandlerRegistry().get_chat_completion_handler_by_name(name)


def register_chat_completion_handler(name: str) -> Callable[[Any], Any]:
    """Decorator: register a chat handler under ``name``."""

    def decorator(f: Any) -> Any:
        LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(name, f)
        return f

    return decorator


def chat_formatter_to_chat_completion_handler(chat_formatter: Any) -> LlamaChatCompletionHandler:
    """A chat handler that renders with ``chat_formatter`` and completes with the Llama it is given."""
    return formatter_to_handler(chat_formatter)


def register_chat_format(name: str) -> Callable[[Any], Any]:
    """Decorator: register a formatter function under ``name`` (as a handler, and as a
    ``Llama(chat_format=name)`` prompt format)."""

    def decorator(f: Any) -> Any:
        LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
            name, chat_formatter_to_chat_completion_handler(f))
        NAMED_FORMATS[name] = _formats.NamedFormat(text=f)
        return f

    return decorator

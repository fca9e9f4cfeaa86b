"""llama.cpp's own chat layer (``common/chat.h``) through ``libllama-cpp-ext``.

The library (``cmake/chat_shim/``, built by the native step beside libllama) wraps llama-server's
chat handling in a JSON-in/JSON-out C API: Jinja template application with tools, the PEG parsers
and automatic parser that turn a model's raw output into ``content``, ``reasoning_content`` and
``tool_calls``, partial parsing for streams, and lazy grammar triggers. This module binds it:

* :class:`ChatTemplates` loads a template (text, or a model's own) once;
  :meth:`ChatTemplates.apply` renders messages, tools and options into a :class:`ChatPrompt`;
* :func:`parse_chat` parses model output with that prompt's parser into a :class:`ChatMessage`;
* :class:`ChatStreamParser` parses a growing output and yields OpenAI ``delta`` dicts, as
  llama-server's ``common_chat_msg_diff`` does (a tool call's index, id and name first, then its
  arguments piece by piece).

Errors from the library are raised as :class:`~llama_cpp._errors.TemplateError` (rendering) or
:class:`ChatParseError` (parsing); both are ``ValueError``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import secrets
import string
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ClosedError, GrammarError, LibraryLoadError, LibraryNotFoundError, LlamaError, TemplateError

log = logging.getLogger("llama_cpp.chat")

LIBRARY_STEM = "llama-cpp-ext"
API_VERSION = 3
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


class ChatParseError(LlamaError, ValueError):
    """Model output does not match the chat format's parser (a complete, non-partial parse)."""


# ----------------------------------------------------------------------------- library

class _Lib:
    """The loaded library and its typed functions."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as exc:
            from .._native import loader as _loader

            raise LibraryLoadError(f"cannot load {path}: {_loader.explain_dlerror(str(exc), path)}") from exc
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        out = ctypes.POINTER(ctypes.c_void_p)
        self.api_version = self._fn("llama_cpp_ext_api_version", [], ctypes.c_int)
        version = self.api_version()
        if version != API_VERSION:
            raise LibraryLoadError(f"{path} has C API version {version}; these bindings need {API_VERSION}")
        # results are freed with free_string: restype c_void_p keeps the pointer
        self.free_string = self._fn("llama_cpp_ext_free_string", [vp], None)
        self.templates_init = self._fn("llama_cpp_ext_chat_templates_init", [vp, cp, out], vp)
        self.templates_free = self._fn("llama_cpp_ext_chat_templates_free", [vp], None)
        self.apply = self._fn("llama_cpp_ext_chat_apply", [vp, cp], vp)
        self.parse = self._fn("llama_cpp_ext_chat_parse", [cp, cp, sz, ctypes.c_bool], vp)
        self.parser_init = self._fn("llama_cpp_ext_chat_parser_init", [cp, out], vp)
        self.parser_parse = self._fn("llama_cpp_ext_chat_parser_parse", [vp, cp, sz, ctypes.c_bool], vp)
        self.parser_free = self._fn("llama_cpp_ext_chat_parser_free", [vp], None)
        self.msg_diffs = self._fn("llama_cpp_ext_chat_msg_diffs", [cp, cp], vp)
        self.stream_init = self._fn("llama_cpp_ext_chat_stream_init", [cp, out], vp)
        self.stream_feed = self._fn("llama_cpp_ext_chat_stream_feed", [vp, cp, sz, ctypes.c_bool], vp)
        self.stream_message = self._fn("llama_cpp_ext_chat_stream_message", [vp], vp)
        self.stream_free = self._fn("llama_cpp_ext_chat_stream_free", [vp], None)
        self.sampler_init = self._fn("llama_cpp_ext_chat_sampler_init", [vp, cp, out], vp)
        self.sampler_state = self._fn("llama_cpp_ext_chat_sampler_state", [vp], vp)

    def _fn(self, name: str, argtypes: list[Any], restype: Any) -> Any:
        try:
            f = getattr(self.cdll, name)
        except AttributeError:
            raise LibraryLoadError(f"{self.path} does not export {name}: not a matching {LIBRARY_STEM} build") from None
        f.argtypes, f.restype = argtypes, restype
        return f

    def take_json(self, ptr: int | None) -> dict[str, Any]:
        """Decode and free a result document."""
        if not ptr:
            raise MemoryError(f"{LIBRARY_STEM} returned no result (out of memory?)")
        try:
            raw = ctypes.string_at(ptr)
        finally:
            self.free_string(ptr)
        return json.loads(raw.decode("utf-8", "replace"))


_lib: _Lib | None = None
_lib_lock = threading.Lock()


def _candidate_names() -> list[str]:
    if sys.platform == "win32":
        return [f"{LIBRARY_STEM}.dll", f"lib{LIBRARY_STEM}.dll"]
    if sys.platform == "darwin":
        return [f"lib{LIBRARY_STEM}.dylib"]
    return [f"lib{LIBRARY_STEM}.so"]


def library_path() -> Path:
    """Where ``libllama-cpp-ext`` is: beside the other native libraries (``llama_cpp/lib`` or
    ``$LLAMA_CPP_LIB_PATH``)."""
    from .._native import loader as _loader

    directory = _loader.lib_dir()
    for name in _candidate_names():
        if (directory / name).is_file():
            return directory / name
    raise LibraryNotFoundError(
        f"{LIBRARY_STEM} not found in {directory} (looked for {', '.join(_candidate_names())}): this build has "
        "no native chat layer; reinstall a wheel that ships it, or point LLAMA_CPP_LIB_PATH at a native build's lib/"
    )


def load_library() -> _Lib:
    """Load the library once (after the core libraries it depends on)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            from .._native import loader as _loader

            _loader.load()  # libllama and the DLL search path first; the library finds them beside itself
            _lib = _Lib(library_path())
            log.debug("loaded %s", _lib.path)
        return _lib


def available() -> bool:
    """Whether the native chat layer can be loaded here."""
    try:
        load_library()
    except (LibraryNotFoundError, LibraryLoadError):
        return False
    return True


def _check(doc: dict[str, Any], error: type[Exception], what: str) -> dict[str, Any]:
    if "error" in doc:
        raise error(f"{what}: {doc['error']}")
    return doc


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, default=_json_default).encode("utf-8")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):  # pydantic models (the server's request types)
        return obj.model_dump(exclude_none=True)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class GrammarTrigger:
    """Where a lazy grammar starts constraining: a ``word``, a ``token``, or a regex ``pattern`` /
    ``pattern_full`` over the output so far."""

    type: str
    value: str
    token: int | None = None


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation and how to generate and parse its answer (``common_chat_params``)."""

    prompt: str
    format: int
    format_name: str
    grammar: str = ""
    grammar_lazy: bool = False
    grammar_triggers: tuple[GrammarTrigger, ...] = ()
    preserved_tokens: tuple[str, ...] = ()
    additional_stops: tuple[str, ...] = ()
    generation_prompt: str = ""
    supports_thinking: bool = False
    thinking_start_tag: str = ""
    thinking_end_tags: tuple[str, ...] = ()
    parser: str = field(default="", repr=False)
    reasoning_format: str = "auto"
    enable_thinking: bool = True
    parallel_tool_calls: bool = False
    tools_applied: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChatPrompt:
        return cls(
            prompt=d["prompt"], format=int(d["format"]), format_name=d["format_name"], grammar=d.get("grammar", ""),
            grammar_lazy=bool(d.get("grammar_lazy")),
            grammar_triggers=tuple(GrammarTrigger(t["type"], t["value"], t.get("token"))
                                   for t in d.get("grammar_triggers", ())),
            preserved_tokens=tuple(d.get("preserved_tokens", ())),
            additional_stops=tuple(d.get("additional_stops", ())),
            generation_prompt=d.get("generation_prompt", ""),
            supports_thinking=bool(d.get("supports_thinking")),
            thinking_start_tag=d.get("thinking_start_tag", ""),
            thinking_end_tags=tuple(d.get("thinking_end_tags", ())),
            parser=d.get("parser", ""),
            reasoning_format=d.get("reasoning_format", "auto"),
            enable_thinking=bool(d.get("enable_thinking", True)),
            parallel_tool_calls=bool(d.get("parallel_tool_calls")),
            tools_applied=int(d.get("tools_applied", 0)),
        )

    def parser_params(self, *, reasoning_format: str | None = None, parse_tool_calls: bool = True,
                      is_continuation: bool = False, echo: bool = False,
                      reasoning_in_content: bool = False) -> dict[str, Any]:
        """The parameters :func:`parse_chat` takes for this prompt's output (llama-server's
        ``common_chat_parser_params``)."""
        return {
            "format": self.format,
            "parser": self.parser,
            "generation_prompt": self.generation_prompt,
            "reasoning_format": reasoning_format or self.reasoning_format,
            "reasoning_in_content": reasoning_in_content,
            "parse_tool_calls": parse_tool_calls,
            "is_continuation": is_continuation,
            "echo": echo,
        }


    def sampler_params(self, *, reasoning_budget: int = -1, reasoning_budget_message: str = "",
                       user_grammar: bool = False) -> dict[str, Any]:
        """The parameters :func:`chat_sampler` takes for this prompt's answer (llama-server's sampling
        fields from ``common_chat_params``). ``user_grammar``: the grammar is the caller's, which is not
        advanced past the generation prompt (llama.cpp prefills only its own output-format and
        tool-call grammars)."""
        return {
            "grammar": self.grammar,
            "grammar_lazy": self.grammar_lazy,
            "grammar_triggers": [{"type": t.type, "value": t.value, **({"token": t.token} if t.token is not None else {})}
                                 for t in self.grammar_triggers],
            "preserved_tokens": list(self.preserved_tokens),
            "generation_prompt": self.generation_prompt,
            "prefill_grammar": not user_grammar,
            "reasoning_budget": reasoning_budget,
            "thinking_start_tag": self.thinking_start_tag,
            "thinking_end_tags": list(self.thinking_end_tags),
            "reasoning_budget_message": reasoning_budget_message,
        }


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = ""


@dataclass(frozen=True)
class ChatMessage:
    """A parsed assistant message (``common_chat_msg``)."""

    role: str = "assistant"
    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ChatMessage:
        return cls(
            role=d.get("role") or "assistant", content=d.get("content", ""),
            reasoning_content=d.get("reasoning_content", ""),
            tool_calls=tuple(ToolCall(t["name"], t["arguments"], t.get("id", "")) for t in d.get("tool_calls", ())),
        )

    def with_ids(self, id_factory: Any = None) -> ChatMessage:
        """The message with an id on every tool call (``id_factory()``, random by default, where the
        format gave none), as llama-server returns it."""
        make = id_factory or _random_id
        calls = tuple(tc if tc.id else ToolCall(tc.name, tc.arguments, make()) for tc in self.tool_calls)
        return ChatMessage(self.role, self.content, self.reasoning_content, calls)

    def is_empty(self) -> bool:
        return not (self.content or self.reasoning_content or self.tool_calls)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``message`` of a chat completion (``content`` None when only tools were called)."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
                for tc in self.tool_calls
            ]
        return msg


# ----------------------------------------------------------------------------- templates

class _Owned:
    """An object that owns one handle of the library, freed by ``close()`` (or when collected)."""

    _lib: _Lib
    _handle: int | None = None
    _what = "object"

    def _free(self, handle: int) -> None:
        raise NotImplementedError

    def _require(self) -> int:
        if not self._handle:

            raise ClosedError(f"the {self._what} was closed")
        return self._handle

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            self._free(handle)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


class ChatTemplates(_Owned):
    """A loaded chat template (``common_chat_templates``): from its text, or a model's own.

    ``model`` is a ``llama_model *`` (an int address or ctypes pointer, e.g. ``Llama.model``):
    the template (and its ``tool_use`` variant) and the BOS/EOS tokens then come from the GGUF.
    """

    def __init__(self, chat_template: str | None = None, *, model: Any = None, bos_token: str = "",
                 eos_token: str = "") -> None:
        self._lib = load_library()
        self._handle: int | None = None
        if not chat_template and model is None:
            raise TemplateError("ChatTemplates needs a chat_template text or a model")
        model_ptr = _address(model)
        params = {"chat_template": chat_template or "", "bos_token": bos_token, "eos_token": eos_token}
        out = ctypes.c_void_p()
        doc = self._lib.take_json(self._lib.templates_init(model_ptr, _dumps(params), ctypes.byref(out)))
        _check(doc, TemplateError, "cannot load the chat template")
        self._handle = out.value
        self.caps: dict[str, bool] = dict(doc.get("caps", {}))
        self.source: str = doc.get("source", "")
        self.tool_use_source: str | None = doc.get("tool_use_source")
        self.supports_enable_thinking: bool = bool(doc.get("supports_enable_thinking"))

    def apply(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
              tool_choice: str | Mapping[str, Any] | None = None, parallel_tool_calls: bool | None = None,
              json_schema: Mapping[str, Any] | str | None = None, grammar: str | None = None,
              add_generation_prompt: bool = True, continue_final_message: bool | str | None = None,
              chat_template_kwargs: Mapping[str, Any] | None = None, enable_thinking: bool | None = None,
              reasoning_format: str = "auto", reasoning_effort: str | None = None, now: float | None = None,
              add_bos: bool = False, add_eos: bool = False) -> ChatPrompt:
        """Render ``messages`` (OpenAI format, tool calls and tool results included) as llama-server
        does. ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function",
        "function": {"name": ...}}`` (that tool only, required). ``chat_template_kwargs`` reach the
        template (``{"enable_thinking": False}`` overrides ``enable_thinking``); ``now`` (epoch
        seconds) fixes the date templates print."""
        if reasoning_format not in REASONING_FORMATS:
            raise TemplateError(f"reasoning_format must be one of {REASONING_FORMATS}, not {reasoning_format!r}")
        inputs: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "reasoning_format": reasoning_format,
            "add_bos": add_bos,
            "add_eos": add_eos,
        }
        optional = {
            "tools": list(tools) if tools else None, "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls, "json_schema": json_schema, "grammar": grammar,
            "continue_final_message": continue_final_message,
            "chat_template_kwargs": dict(chat_template_kwargs) if chat_template_kwargs else None,
            "enable_thinking": enable_thinking, "reasoning_effort": reasoning_effort, "now": now,
        }
        inputs.update({k: v for k, v in optional.items() if v is not None})
        handle = self._require()
        doc = self._lib.take_json(self._lib.apply(handle, _dumps(inputs)))
        return ChatPrompt.from_json(_check(doc, TemplateError, "cannot apply the chat template"))

    _what = "chat templates"

    def _free(self, handle: int) -> None:
        self._lib.templates_free(handle)


def _address(model: Any) -> int | None:
    if model is None:
        return None
    if isinstance(model, int):
        return model
    inner = getattr(model, "model", None)  # a Llama, or its _internals model wrapper
    if inner is not None and not isinstance(model, ctypes.c_void_p):
        return _address(inner)
    value = ctypes.cast(model, ctypes.c_void_p).value
    if not value:
        raise TemplateError("model is a NULL pointer")
    return value


def apply_chat(messages: Sequence[Mapping[str, Any]], *, chat_template: str | None = None, model: Any = None,
               bos_token: str = "", eos_token: str = "", **options: Any) -> ChatPrompt:
    """Render ``messages`` with a template text (or a model's template) in one call; see
    :meth:`ChatTemplates.apply` for ``options``."""
    with ChatTemplates(chat_template, model=model, bos_token=bos_token, eos_token=eos_token) as t:
        return t.apply(messages, **options)


# ----------------------------------------------------------------------------- sampling

@dataclass(frozen=True)
class ChatSampler:
    """What :func:`chat_sampler` made: ``ptr``, a ``llama_sampler *`` (None when the answer has nothing
    to constrain) that the caller owns (``llama_sampler_free``, or a chain it is added to), and the
    ids of the template's preserved tokens (detokenized as their text: the parser reads them)."""

    ptr: int | None
    preserved_token_ids: frozenset[int]
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    has_grammar: bool = False
    has_reasoning_budget: bool = False


def chat_sampler(model: Any, params: Mapping[str, Any]) -> ChatSampler:
    """The sampler of a chat answer, as llama-server's ``common_sampler_init`` makes it from
    ``params`` (:meth:`ChatPrompt.sampler_params`): the template's grammar, lazy until a trigger where
    the template says so, and the reasoning budget. ``model``: a ``llama_model *``."""
    lib = load_library()
    model_ptr = _address(model)
    if not model_ptr:
        raise ValueError("chat_sampler needs a model")
    out = ctypes.c_void_p()
    doc = lib.take_json(lib.sampler_init(model_ptr, _dumps(dict(params)), ctypes.byref(out)))
    if "error" in doc:

        raise GrammarError(f"cannot make the chat answer's sampler: {doc['error']}")
    return ChatSampler(out.value or None, frozenset(int(t) for t in doc.get("preserved_token_ids", ())),
                       tuple(doc.get("trigger_patterns", ())), tuple(int(t) for t in doc.get("trigger_tokens", ())),
                       bool(doc.get("grammar")), bool(doc.get("reasoning_budget")))


def chat_sampler_state(ptr: int) -> dict[str, str]:
    """``{"grammar": "none"|"active"|"failed", "reason": why it failed, "reasoning": "none"|"idle"|"counting"|
    "forcing"|"waiting_utf8"|"done"}`` of a sampler :func:`chat_sampler` made."""
    lib = load_library()
    return _check(lib.take_json(lib.sampler_state(ptr)), ValueError, "chat sampler state")


# ----------------------------------------------------------------------------- parsing

def _params(prompt_or_params: ChatPrompt | Mapping[str, Any], reasoning_format: str | None) -> dict[str, Any]:
    if isinstance(prompt_or_params, ChatPrompt):
        return prompt_or_params.parser_params(reasoning_format=reasoning_format)
    params = dict(prompt_or_params)
    if reasoning_format is not None:
        params["reasoning_format"] = reasoning_format
    return params


def parse_chat(prompt: ChatPrompt | Mapping[str, Any], text: str, *, is_partial: bool = False,
               reasoning_format: str | None = None) -> ChatMessage:
    """Parse a model's raw output for ``prompt`` (or explicit parser parameters) into a message."""
    lib = load_library()
    data = text.encode("utf-8")
    doc = lib.take_json(lib.parse(_dumps(_params(prompt, reasoning_format)), data, len(data), is_partial))
    return ChatMessage.from_json(_check(doc, ChatParseError, "cannot parse the model output"))


def _random_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(32))


class ChatParser(_Owned):
    """A parser loaded once for many parses (``common_chat_parse`` with fixed parameters)."""

    def __init__(self, prompt: ChatPrompt | Mapping[str, Any], *, reasoning_format: str | None = None) -> None:
        self._lib = load_library()
        out = ctypes.c_void_p()
        doc = self._lib.take_json(self._lib.parser_init(_dumps(_params(prompt, reasoning_format)), ctypes.byref(out)))
        _check(doc, ChatParseError, "cannot load the chat parser")
        self._handle: int | None = out.value

    def parse(self, text: str | bytes, *, is_partial: bool = False) -> ChatMessage:
        """Parse ``text`` (the output so far when ``is_partial``)."""
        handle = self._require()
        data = text.encode("utf-8") if isinstance(text, str) else text
        doc = self._lib.take_json(self._lib.parser_parse(handle, data, len(data), is_partial))
        return ChatMessage.from_json(_check(doc, ChatParseError, "cannot parse the model output"))

    _what = "chat parser"

    def _free(self, handle: int) -> None:
        self._lib.parser_free(handle)


class ChatStreamParser(_Owned):
    """Parse a streamed answer as it grows and turn each step into OpenAI ``delta`` dicts.

    ``feed(text)`` appends generated text and returns the deltas since the last call;
    ``finish()`` parses the whole text as complete and returns the last deltas. Tool calls get ids
    (the format's own, else ``id_factory()``, random 32 characters by default) that stay fixed; a
    call's ``index``, ``id`` and name come first, once its name is complete, then its ``arguments``
    in pieces. The library keeps the text and the last message and computes the deltas
    (llama-server's ``update_chat_msg`` with ``common_chat_msg_diff``): each step passes only the
    new text in and only the deltas out.
    """

    _what = "chat stream parser"

    def __init__(self, prompt: ChatPrompt | Mapping[str, Any], *, reasoning_format: str | None = None,
                 id_factory: Any = None) -> None:
        self._lib = load_library()
        self._handle: int | None = None
        out = ctypes.c_void_p()
        doc = self._lib.take_json(self._lib.stream_init(_dumps(_params(prompt, reasoning_format)), ctypes.byref(out)))
        _check(doc, ChatParseError, "cannot load the chat parser")
        self._handle = out.value
        self._ids: list[str] = []
        self._id_factory = id_factory or _random_id
        self._pieces: list[bytes] = []
        self._message: ChatMessage | None = ChatMessage()

    @property
    def text(self) -> str:
        """The output fed so far."""
        return b"".join(self._pieces).decode("utf-8", "replace")

    @property
    def message(self) -> ChatMessage:
        """The message parsed so far, with its tool call ids."""
        if self._message is None:
            doc = self._lib.take_json(self._lib.stream_message(self._require()))
            msg = ChatMessage.from_json(_check(doc, ChatParseError, "cannot read the parsed message"))
            calls = tuple(ToolCall(tc.name, tc.arguments, self._ids[i]) for i, tc in enumerate(msg.tool_calls))
            self._message = ChatMessage(msg.role, msg.content, msg.reasoning_content, calls)
        return self._message

    def feed(self, text: str | bytes) -> list[dict[str, Any]]:
        """Append ``text`` and return the OpenAI deltas it completes."""
        return self._update(text, True)

    def finish(self, text: str | bytes = "") -> list[dict[str, Any]]:
        """Append the last ``text``, if any, and parse the whole output as complete; the remaining deltas
        (raises :class:`ChatParseError` when it does not match the format)."""
        return self._update(text, False)

    def _update(self, text: str | bytes, is_partial: bool) -> list[dict[str, Any]]:
        handle = self._require()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if data:
            self._pieces.append(data)
        doc = self._lib.take_json(self._lib.stream_feed(handle, data, len(data), is_partial))
        if "error" in doc:
            raise ChatParseError(f"cannot parse the model output: {doc['error']}")
        deltas: list[dict[str, Any]] = doc["deltas"]
        new_ids = doc.get("new_ids")
        if new_ids is not None:  # ids stay what they were first (set_tool_call_ids)
            self._ids += [i or self._id_factory() for i in new_ids]
        if deltas or new_ids is not None:
            self._message = None
            for delta in deltas:
                calls = delta.get("tool_calls")
                if calls and "id" in calls[0]:
                    calls[0]["id"] = self._ids[calls[0]["index"]]
        return deltas

    def _free(self, handle: int) -> None:
        self._lib.stream_free(handle)


@dataclass(frozen=True)
class _Diff:
    """One ``common_chat_msg_diff``."""

    reasoning_content: str = ""
    content: str = ""
    index: int | None = None
    id: str = ""
    name: str = ""
    arguments: str = ""


def _msg_json(msg: ChatMessage) -> dict[str, Any]:
    return {"role": msg.role, "content": msg.content, "reasoning_content": msg.reasoning_content,
            "tool_calls": [{"name": tc.name, "arguments": tc.arguments, "id": tc.id} for tc in msg.tool_calls]}


def compute_diffs(prev: ChatMessage, new: ChatMessage) -> list[_Diff]:
    """``common_chat_msg_diff::compute_diffs``: what ``new`` adds to ``prev`` (raises
    :class:`ChatParseError` when ``new`` does not extend ``prev``)."""
    lib = load_library()
    doc = lib.take_json(lib.msg_diffs(_dumps(_msg_json(prev)), _dumps(_msg_json(new))))
    _check(doc, ChatParseError, "invalid diff")
    return [_Diff(**d) for d in doc["diffs"]]


__all__ = [
    "API_VERSION", "ChatMessage", "ChatParseError", "ChatParser", "ChatPrompt", "ChatSampler", "ChatStreamParser",
    "ChatTemplates", "GrammarTrigger", "ToolCall", "apply_chat", "available", "chat_sampler", "chat_sampler_state",
    "compute_diffs", "library_path", "load_library", "parse_chat",
]

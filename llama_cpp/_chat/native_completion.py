"""Chat completions through llama.cpp's own chat layer (:mod:`.native_chat`), as llama-server makes them.

The model's template renders the conversation with its tools; the model's raw output is parsed by
the template's parser into ``content``, ``reasoning_content`` and ``tool_calls`` (finish reason
``"tool_calls"`` when it called one); streamed, each chunk carries the OpenAI ``delta`` of what the
output so far adds (a call's index, id and name first, then its arguments in pieces).

:func:`chat_response` and :func:`chat_stream` turn completions (``create_completion`` results) into
chat completions; :func:`create_chat_completion` runs the whole request on a ``Llama``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from .._errors import LlamaError, ParameterError
from .._safety.tool_limits import check_tools
from ..llama_grammar import LlamaGrammar
from .base import validate_messages
from .constraint import ChatConstraint
from .handler import prompt_tokens
from .native_chat import (
    REASONING_FORMATS,
    ChatParseError,
    ChatPrompt,
    ChatStreamParser,
    ChatTemplates,
    available,
    parse_chat,
)

log = logging.getLogger("llama_cpp.chat")


def _base(c: Mapping[str, Any], obj: str) -> dict[str, Any]:
    return {"id": "chat" + c["id"], "object": obj, "created": c["created"], "model": c["model"]}


def chat_response(completion: Mapping[str, Any], prompt: ChatPrompt, *, reasoning_format: str | None = None,
                  id_factory: Any = None) -> dict[str, Any]:
    """A ``chat.completion`` from a finished completion of ``prompt``: the output parsed. Output
    that does not match the format (a cut-off call, say) is parsed as a partial output instead."""
    choice = completion["choices"][0]
    text = choice["text"]
    try:
        msg = parse_chat(prompt, text, reasoning_format=reasoning_format)
    except ChatParseError as exc:
        log.warning("model output does not match the %s chat format (%s): parsed as partial output",
                    prompt.format_name, exc)
        msg = parse_chat(prompt, text, is_partial=True, reasoning_format=reasoning_format)
    msg = msg.with_ids(id_factory)
    finish = "tool_calls" if msg.tool_calls else choice["finish_reason"]
    return {**_base(completion, "chat.completion"),
            "choices": [{"index": 0, "message": msg.to_openai(), "logprobs": None, "finish_reason": finish}],
            "usage": completion.get("usage")}


class ChatChunks:
    """``text_completion`` chunks → ``chat.completion.chunk`` objects parsed by ``prompt``'s parser, one
    chunk at a time (the server's slots push theirs; :func:`chat_stream` pulls a whole stream): the role,
    the deltas of content, reasoning and tool calls as the output grows, then the finish reason
    (``"tool_calls"`` after a call) with the usage and the stop string that ended the answer where the
    chunk names one. The parser is freed at the finish or by :meth:`close`."""

    def __init__(self, prompt: ChatPrompt, *, reasoning_format: str | None = None, id_factory: Any = None) -> None:
        self.prompt = prompt
        self.parser = ChatStreamParser(prompt, reasoning_format=reasoning_format, id_factory=id_factory)
        self.first = True

    def __call__(self, c: Mapping[str, Any]) -> list[dict[str, Any]]:
        choice = c["choices"][0]
        base = _base(c, "chat.completion.chunk")
        out = []
        if self.first:
            out.append({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None,
                                             "logprobs": None}]})
            self.first = False
        deltas = self.parser.feed(choice["text"]) if choice["text"] else []
        done = choice["finish_reason"] is not None
        if done:
            try:
                deltas += self.parser.finish()
            except ChatParseError as exc:
                log.warning("model output does not match the %s chat format (%s)", self.prompt.format_name, exc)
        out += [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}]}
                for d in deltas]
        if done:
            reason = "tool_calls" if self.parser.message.tool_calls else choice["finish_reason"]
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason, "logprobs": None}]}
            if choice.get("stop_sequence") is not None:
                last["choices"][0]["stop_sequence"] = choice["stop_sequence"]
            if "usage" in c:
                last["usage"] = c["usage"]
            out.append(last)
            self.parser.close()
        return out

    def close(self) -> None:
        self.parser.close()


def chat_stream(chunks: Iterator[Mapping[str, Any]], prompt: ChatPrompt, *, reasoning_format: str | None = None,
                id_factory: Any = None) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects for a streamed completion of ``prompt`` (:class:`ChatChunks`
    over the whole stream)."""
    convert = ChatChunks(prompt, reasoning_format=reasoning_format, id_factory=id_factory)
    try:
        for c in chunks:
            yield from convert(c)
    finally:
        convert.close()


def response_format_schema(response_format: Mapping[str, Any] | None) -> Any:
    """The JSON schema an OpenAI ``response_format`` asks for (None for text), as llama-server reads it."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return response_format.get("schema") or {"type": "object"}
    if kind == "json_schema":
        wrapper = response_format.get("json_schema") or {}
        return wrapper.get("schema", {"type": "object"}) if isinstance(wrapper, Mapping) else wrapper
    if kind not in (None, "text"):
        raise ValueError(f"unsupported response_format type {kind!r}")
    return None


#: ``reasoning_budget``: -1 thinks without limit; 0 closes the thinking block as soon as it opens; N > 0
#: forces the end tag after N tokens of thinking (llama-server's ``--reasoning-budget``)
UNLIMITED_BUDGET = -1


def check_chat_options(chat_template_kwargs: Any = None, reasoning_format: Any = None,
                       reasoning_budget: Any = None) -> dict[str, Any]:
    """The chat-layer options that are set, checked (a :class:`ParameterError`, a ``ValueError``, names
    the bad value and the valid ones): ``chat_template_kwargs`` a dict of JSON values for the template
    (``{"enable_thinking": False}``), ``reasoning_format`` one of :data:`REASONING_FORMATS`,
    ``reasoning_budget`` an int >= -1."""
    opts: dict[str, Any] = {}
    if chat_template_kwargs is not None:
        if not isinstance(chat_template_kwargs, Mapping) or not all(isinstance(k, str) for k in chat_template_kwargs):
            raise ParameterError("chat_template_kwargs must be a dict with string keys, e.g. "
                                 f'{{"enable_thinking": False}}; got {chat_template_kwargs!r}')
        try:
            json.dumps(dict(chat_template_kwargs))
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"chat_template_kwargs values must be JSON values (str, number, bool, None, "
                                 f"list, dict): {exc}") from None
        thinking = chat_template_kwargs.get("enable_thinking")
        if thinking is not None and not isinstance(thinking, bool):
            raise ParameterError(f"chat_template_kwargs['enable_thinking'] must be True or False, got {thinking!r}")
        opts["chat_template_kwargs"] = dict(chat_template_kwargs)
    if reasoning_format is not None:
        if reasoning_format not in REASONING_FORMATS:
            raise ParameterError(f"reasoning_format must be one of {', '.join(map(repr, REASONING_FORMATS))}, "
                                 f"got {reasoning_format!r}")
        opts["reasoning_format"] = reasoning_format
    if reasoning_budget is not None:
        if isinstance(reasoning_budget, bool) or not isinstance(reasoning_budget, int) or reasoning_budget < -1:
            raise ParameterError(f"reasoning_budget must be -1 (unlimited), 0 (end thinking at once) or a number "
                                 f"of tokens, got {reasoning_budget!r}")
        opts["reasoning_budget"] = int(reasoning_budget)
    return opts


@runtime_checkable
class ChatTarget(Protocol):
    """What a chat answer is generated on, where that is not a ``Llama`` (a multimodal chat's media prompt):
    ``model`` samples and detokenizes; :meth:`chat_prompt` makes the prompt of the rendered text and
    :meth:`create_completion` completes it (``text_completion`` results, as ``Llama.create_completion``)."""

    model: Any

    def chat_prompt(self, text: str, messages: Sequence[Mapping[str, Any]], *, special_in_content: bool,
                    render: Callable[[list[Any]], str]) -> Any:
        """The prompt of ``text``, rendered from ``messages`` (``render``: the same rendering of other messages,
        for exact content spans; message content is tokenized as text unless ``special_in_content``)."""

    def create_completion(self, prompt: Any, *, stream: bool, stop: list[str], grammar: Any, **kwargs: Any) -> Any:
        """A completion of ``prompt`` sampled under ``grammar`` (a :class:`~.constraint.ChatConstraint`)."""


def create_chat_completion(llama: Any, templates: ChatTemplates, messages: Sequence[Mapping[str, Any]], *,
                           tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                           parallel_tool_calls: bool | None = None, response_format: Mapping[str, Any] | None = None,
                           chat_template_kwargs: Mapping[str, Any] | None = None, reasoning_format: str = "auto",
                           reasoning_effort: str | None = None, reasoning_budget: int = UNLIMITED_BUDGET,
                           reasoning_budget_message: str = "", stream: bool = False,
                           stop: str | list[str] | None = None, grammar: Any = None, special_in_content: bool = False,
                           **completion_kwargs: Any) -> Any:
    """Render with the model's template, generate with ``llama.create_completion`` and parse. ``llama``: a
    ``Llama``, or a :class:`ChatTarget`.

    The answer is sampled as llama-server samples it (:class:`~.constraint.ChatConstraint`): with
    ``tool_choice="auto"`` the template's grammar is lazy (free text until the format's call marker,
    then the call follows the tools' schemas); ``"required"``, a named tool and a ``response_format``
    constrain the whole answer; ``reasoning_budget`` closes the thinking block; the template's
    preserved tokens are detokenized as text for the parser.
    """
    messages = validate_messages(messages)  # roles are plain names here too: a role never carries control tokens
    check_chat_options(chat_template_kwargs, reasoning_format, reasoning_budget)
    user_grammar = grammar.grammar if isinstance(grammar, LlamaGrammar) and grammar.root == "root" else grammar
    if user_grammar is not None and not isinstance(user_grammar, str):
        raise ParameterError("grammar must be GBNF text or a LlamaGrammar whose start rule is 'root' on llama.cpp's "
                             f"chat layer, got {type(grammar).__name__}")
    if user_grammar and tools and tool_choice != "none":
        raise ParameterError("a grammar cannot be combined with tools (the tool calls have their own grammar): "
                             'drop grammar=, or pass tool_choice="none"')
    render_opts = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls,
                   "chat_template_kwargs": chat_template_kwargs, "reasoning_effort": reasoning_effort}
    prompt = templates.apply(messages, json_schema=response_format_schema(response_format), grammar=user_grammar,
                             reasoning_format=reasoning_format, **render_opts)
    if user_grammar and not prompt.grammar:  # llama.cpp's chat layer leaves the caller's grammar to the caller
        prompt = dataclasses.replace(prompt, grammar=user_grammar, grammar_lazy=False, grammar_triggers=())
    stops = list(prompt.additional_stops)
    if stop:
        stops += [stop] if isinstance(stop, str) else list(stop)
    def render(ms: list[Any]) -> str:
        return templates.apply(ms, **render_opts).prompt

    if isinstance(llama, ChatTarget):
        tokens = llama.chat_prompt(prompt.prompt, messages, special_in_content=special_in_content, render=render)
    else:

        # llama.cpp leaves BOS out of the prompt where the vocabulary adds it; message content stays text
        tokens = prompt_tokens(llama, prompt.prompt, messages, added_special=False,
                               special_in_content=special_in_content, render=render)
    constraint = ChatConstraint(llama.model, prompt, reasoning_budget=reasoning_budget,
                                reasoning_budget_message=reasoning_budget_message, user_grammar=bool(user_grammar))
    if prompt.grammar_lazy:
        log.debug("%s: lazy tool-call grammar, triggers %s", prompt.format_name,
                  [t.value for t in prompt.grammar_triggers])
    try:
        completion = llama.create_completion(tokens, stream=stream, stop=stops, grammar=constraint,
                                             **completion_kwargs)
    finally:
        constraint.close()
    if stream:
        return chat_stream(completion, prompt, reasoning_format=reasoning_format)
    return chat_response(completion, prompt, reasoning_format=reasoning_format)


_COMPLETION_KEYS = frozenset({
    "max_tokens", "temperature", "top_p", "min_p", "typical_p", "frequency_penalty", "presence_penalty",
    "repeat_penalty", "top_k", "seed", "tfs_z", "mirostat_mode", "mirostat_tau", "mirostat_eta", "model",
    "stopping_criteria", "logits_processor", "logit_bias"})


class NativeChatHandler:
    """A chat handler (``Llama(chat_handler=NativeChatHandler())``, or ``chat_format="llama-cpp"``)
    that chats through llama.cpp's own chat layer: the model's template renders tools and tool
    results, and the output comes back with ``message.tool_calls`` and ``reasoning_content``.

    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``), ``reasoning_format`` and
    ``reasoning_budget`` apply to every request (a request's own override them; the
    ``chat_template_kwargs`` of both are merged); a template text replaces the model's own.
    ``llama`` is a ``Llama`` or a :class:`ChatTarget`.
    """

    #: takes the chat-layer options (``chat_template_kwargs``, ``reasoning_format``, ...): ``chat_route``
    #: sends them only to a handler that says so
    takes_chat_options: ClassVar[bool] = True

    def __init__(self, chat_template: str | None = None, *, chat_template_kwargs: Mapping[str, Any] | None = None,
                 reasoning_format: str = "auto", parallel_tool_calls: bool | None = None,
                 reasoning_budget: int = UNLIMITED_BUDGET, reasoning_budget_message: str = "") -> None:
        check_chat_options(chat_template_kwargs, reasoning_format, reasoning_budget)
        self.chat_template = chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.reasoning_format = reasoning_format
        self.reasoning_budget = reasoning_budget
        self.reasoning_budget_message = reasoning_budget_message
        self.parallel_tool_calls = parallel_tool_calls
        self._templates: dict[int, ChatTemplates] = {}

    def templates_for(self, llama: Any) -> ChatTemplates:
        """The templates of ``llama``'s model (loaded once per model)."""
        model = llama.model
        key = id(model)
        t = self._templates.get(key)
        if t is None:
            bos = model.token_text(model.token_bos()) if model.token_bos() >= 0 else ""
            eos = model.token_text(model.token_eos()) if model.token_eos() >= 0 else ""
            t = ChatTemplates(self.chat_template, model=model, bos_token=bos, eos_token=eos)
            self._templates = {key: t}  # one model at a time: a handler moved to another Llama reloads
        return t

    def __call__(self, *, llama: Any, messages: Sequence[Mapping[str, Any]], functions: Any = None,
                 function_call: Any = None, tools: Any = None, tool_choice: Any = None, stream: bool = False,
                 stop: str | list[str] | None = None, response_format: Any = None, grammar: Any = None,
                 special_in_content: bool = False, chat_template_kwargs: Mapping[str, Any] | None = None,
                 reasoning_format: str | None = None, reasoning_budget: int | None = None,
                 reasoning_effort: str | None = None, parallel_tool_calls: bool | None = None,
                 **kwargs: Any) -> Any:
        if functions and not tools:
            tools = [{"type": "function", "function": f} for f in functions]
            if isinstance(function_call, dict):
                tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
        if isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
            tool_choice = {"type": "function", "function": {"name": tool_choice}}  # a bare tool name
        kwargs_ = {k: v for k, v in kwargs.items() if k in _COMPLETION_KEYS}
        return create_chat_completion(
            llama, self.templates_for(llama), messages, tools=tools or None, tool_choice=tool_choice,
            parallel_tool_calls=self.parallel_tool_calls if parallel_tool_calls is None else parallel_tool_calls,
            response_format=response_format,
            chat_template_kwargs={**self.chat_template_kwargs, **(chat_template_kwargs or {})} or None,
            reasoning_format=reasoning_format or self.reasoning_format, reasoning_effort=reasoning_effort,
            reasoning_budget=self.reasoning_budget if reasoning_budget is None else reasoning_budget,
            reasoning_budget_message=self.reasoning_budget_message, stream=stream, stop=stop, grammar=grammar,
            special_in_content=special_in_content, **kwargs_)


_FOR_TOOLS: weakref.WeakKeyDictionary[Any, NativeChatHandler | None] = weakref.WeakKeyDictionary()


def native_tools_handler(llama: Any) -> NativeChatHandler | None:
    """The handler ``Llama.create_chat_completion`` sends a request with tools to: llama.cpp's chat
    layer when no ``chat_format`` is named, the library is here and the model's own template knows
    tools (as llama-server serves it); None keeps the Python path. Decided once per ``Llama``."""
    if getattr(llama, "chat_format", None) is not None:
        return None
    try:
        return _FOR_TOOLS[llama]
    except KeyError:
        pass
    handler = None
    if available() and llama.model.chat_template():
        candidate = NativeChatHandler()
        try:
            if candidate.templates_for(llama).caps.get("supports_tool_calls"):
                handler = candidate
        except LlamaError as exc:
            log.info("llama.cpp's chat layer cannot load this model's template (%s): tools use the Python path", exc)
    _FOR_TOOLS[llama] = handler
    return handler


_NATIVE: weakref.WeakKeyDictionary[Any, NativeChatHandler] = weakref.WeakKeyDictionary()


def native_handler(llama: Any) -> NativeChatHandler:
    """llama.cpp's chat layer over ``llama``'s own template, for a request that asks for its options;
    a :class:`ParameterError` says why it cannot be used (a named ``chat_format``, no template, a build
    without the library)."""
    handler = _NATIVE.get(llama)
    if handler is not None:
        return handler
    what = "chat_template_kwargs, reasoning_format and reasoning_budget"
    fmt = getattr(llama, "chat_format", None)
    if fmt is not None:
        raise ParameterError(f"{what} apply to the model's own template through llama.cpp's chat layer; this Llama "
                             f"renders with chat_format={fmt!r}: use chat_format=None or 'llama-cpp'")
    if not available():
        raise ParameterError(f"{what} need llama.cpp's chat layer (libllama-cpp-ext), which this build lacks")
    if not llama.model.chat_template():
        raise ParameterError(f"{what} need the model's own chat template, and this model has none: pass "
                             "chat_handler=NativeChatHandler(chat_template=...)")
    handler = NativeChatHandler()
    handler.templates_for(llama)  # a template llama.cpp cannot load fails here (TemplateError)
    _NATIVE[llama] = handler
    return handler


def over_model_defaults(llama: Any, own: Mapping[str, Any]) -> dict[str, Any]:
    """A request's checked chat-layer options over the ``Llama``'s ``chat_options`` (its constructor's),
    ``chat_template_kwargs`` merged key by key."""
    defaults = getattr(llama, "chat_options", {})
    opts = {**defaults, **own}
    if "chat_template_kwargs" in own:
        opts["chat_template_kwargs"] = {**defaults.get("chat_template_kwargs", {}), **own["chat_template_kwargs"]}
    return opts


def chat_route(llama: Any, handler: Any, call: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Where ``Llama.create_chat_completion`` sends a request (``call``: its arguments), and the keywords
    beyond the common ones that the handler takes.

    The handler is the ``Llama``'s ``chat_handler``; else llama.cpp's chat layer for tools (when the
    template knows them) or when chat-layer options are set (the ``Llama``'s ``chat_options`` under the
    call's own, ``chat_template_kwargs`` merged); else None (the Python template path). Options for a
    handler that does not take them are refused, never dropped. Handlers written for upstream get
    ``logits_processor``, ``stopping_criteria``, ``logprobs``, ``tfs_z``, mirostat and
    ``special_in_content`` only when they are set."""
    check_tools(call.get("tools"))
    check_tools(call.get("functions"), "functions")
    own = check_chat_options(call.get("chat_template_kwargs"), call.get("reasoning_format"),
                             call.get("reasoning_budget"))
    if call.get("parallel_tool_calls") is not None:
        if not isinstance(call["parallel_tool_calls"], bool):
            raise ParameterError(f"parallel_tool_calls must be True or False, got {call['parallel_tool_calls']!r}")
        own["parallel_tool_calls"] = call["parallel_tool_calls"]
    if call.get("reasoning_effort") is not None:
        if not isinstance(call["reasoning_effort"], str):
            raise ParameterError(f"reasoning_effort must be a string such as 'low', 'medium' or 'high', "
                                 f"got {call['reasoning_effort']!r}")
        own["reasoning_effort"] = call["reasoning_effort"]
    opts = over_model_defaults(llama, own)
    if handler is None and (call.get("tools") or call.get("functions")):
        handler = native_tools_handler(llama)
    if handler is None and opts:
        handler = native_handler(llama)
    if opts and not getattr(handler, "takes_chat_options", False):
        raise ParameterError(f"{', '.join(sorted(opts))} apply to llama.cpp's chat layer; this Llama's "
                             f"chat_handler {type(handler).__name__} does not take them")
    extra = dict(opts)
    for key in ("logits_processor", "stopping_criteria"):
        if call.get(key) is not None:
            extra[key] = call[key]
    if call.get("logprobs") is not None:
        extra.update(logprobs=call["logprobs"], top_logprobs=call.get("top_logprobs"))
    if call.get("tfs_z", 1.0) != 1.0:
        extra["tfs_z"] = call["tfs_z"]
    if call.get("mirostat_mode"):
        extra.update({k: call[k] for k in ("mirostat_mode", "mirostat_tau", "mirostat_eta")})
    if call.get("special_in_content"):
        extra["special_in_content"] = True
    return handler, extra


__all__ = ["UNLIMITED_BUDGET", "ChatChunks", "ChatTarget", "NativeChatHandler", "chat_response", "chat_route", "chat_stream",
           "check_chat_options", "create_chat_completion", "native_handler", "native_tools_handler", "response_format_schema"]

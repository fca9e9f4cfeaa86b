"""``Llama.create_chat_completion``'s body: the route to a chat handler (``chat_handler``, or
llama.cpp's chat layer for tools and chat options), else the Python template path (the model's
template or ``chat_format`` rendered in the sandbox, completed by ``create_completion``), and the
grammars that path derives from ``tool_choice`` and ``response_format``.

Functions take the ``Llama`` and go through its public methods (``chat_formatter``,
``create_completion``), so overriding those still takes effect.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .._generation import responses as _responses
from .._safety.chat_tokens import message_texts, tokenize_chat_prompt
from ..llama_grammar import JSON_GBNF, json_schema_to_gbnf
from .base import Jinja2ChatFormatter, model_chat_formatter, validate_messages
from .native_completion import chat_route

log = logging.getLogger("llama_cpp")

#: the keywords every chat handler takes (``chat_route`` adds the ones beyond them)
_HANDLER_ARGS = ("messages", "functions", "function_call", "tools", "tool_choice", "temperature", "top_p", "top_k",
                 "min_p", "typical_p", "stream", "stop", "seed", "response_format", "max_tokens", "presence_penalty",
                 "frequency_penalty", "repeat_penalty", "model", "grammar", "logit_bias")


def chat_formatter_for(model: Any, chat_format: str | None) -> Jinja2ChatFormatter:
    """The template formatter of a loaded model: ``chat_format``'s, else the model's template, else
    llama-2's (``Llama.chat_formatter``)."""
    fmt = model_chat_formatter(model, chat_format=chat_format)
    if fmt is None:
        log.info("the model has no chat template; using the llama-2 chat format")
        fmt = model_chat_formatter(model, chat_format="llama-2")
    return fmt


def create_chat_completion(llama: Any, call: Mapping[str, Any]) -> Any:
    """``Llama.create_chat_completion`` (``call``: its arguments, already type-checked)."""
    handler, extra = chat_route(llama, llama.chat_handler, call)
    if handler is not None:
        return handler(llama=llama, **{k: call[k] for k in _HANDLER_ARGS}, **extra)
    messages, tools, tool_choice = call["messages"], call["tools"], call["tool_choice"]
    functions, function_call, grammar, stop = call["functions"], call["function_call"], call["grammar"], call["stop"]
    msgs = validate_messages(messages)
    if functions and not tools:
        tools = [{"type": "function", "function": f} for f in functions]
        if isinstance(function_call, dict):
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    fmt = llama.chat_formatter()
    result = fmt(messages=msgs, tools=tools)
    tool_name: str | None = None
    if tools and tool_choice not in (None, "none", "auto"):
        tool = select_tool(tools, tool_choice)
        tool_name = tool["function"]["name"]
        if grammar is None:
            grammar = json_schema_to_gbnf(tool["function"].get("parameters") or {"type": "object"})
    if grammar is None and call["response_format"]:
        grammar = response_format_grammar(call["response_format"])
    m = llama.native_model()
    # Message content is text: special-token text in it (a forged turn marker) stays text.
    prompt_tokens = tokenize_chat_prompt(m, result.prompt, message_texts(msgs),
                                         add_special=not result.added_special,
                                         special_in_content=call["special_in_content"],
                                         render=lambda ms: fmt(messages=ms, tools=tools).prompt, messages=msgs)
    stops = list(result.stop)
    if stop:
        stops += [stop] if isinstance(stop, str) else list(stop)
    same = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "frequency_penalty",
            "presence_penalty", "repeat_penalty", "stream", "seed", "mirostat_mode", "mirostat_tau", "mirostat_eta",
            "model", "logit_bias", "logits_processor", "stopping_criteria")
    completion = llama.create_completion(
        prompt_tokens, logprobs=(call["top_logprobs"] or 0) if call["logprobs"] else None, stop=stops,
        grammar=grammar, **{k: call[k] for k in same})
    if call["stream"]:
        return _responses.chat_stream(completion, tool_name)
    return _responses.chat_response(completion, tool_name)


def response_format_grammar(response_format: Any) -> str | None:
    """The GBNF an OpenAI ``response_format`` asks for (None for plain text)."""
    kind = response_format.get("type")
    if kind == "json_object":
        schema = response_format.get("schema")
        return json_schema_to_gbnf(schema) if schema else JSON_GBNF
    if kind == "json_schema":
        js = response_format.get("json_schema") or {}
        return json_schema_to_gbnf(js.get("schema", js) if isinstance(js, dict) else js)
    if kind not in (None, "text"):
        raise ValueError(f"unsupported response_format type {kind!r}")
    return None


def select_tool(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """The tool a ``tool_choice`` other than none/auto forces (a name, ``{"function": {"name"}}``, or
    ``required`` with one tool)."""
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        for t in tools:
            if t.get("function", {}).get("name") == name:
                return t
        raise ValueError(f"tool_choice names {name!r}, which is not in tools")
    if choice == "required":
        if len(tools) != 1:
            raise ValueError("tool_choice='required' with several tools is not supported: name the tool")
        return tools[0]
    if isinstance(choice, str):  # a bare tool name (LangChain's bind_tools(tool_choice="name"))
        for t in tools:
            if t.get("function", {}).get("name") == choice:
                return t
        names = [t.get("function", {}).get("name") for t in tools]
        raise ValueError(f"tool_choice {choice!r} is neither 'none', 'auto', 'required' nor one of the tools {names}")
    raise ValueError(f"unsupported tool_choice {choice!r}")


__all__ = ["chat_formatter_for", "create_chat_completion", "response_format_grammar", "select_tool"]

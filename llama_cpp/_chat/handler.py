"""A chat-completion handler from a chat formatter, and the pieces upstream's handlers share (sampling
keys, stops, tool choice, grammars, prompt tokens); completions become chat responses through
:mod:`llama_cpp._generation.responses`, the one completion → chat converter.

The handler renders the prompt with the formatter, tokenizes it so special-token text inside
message content stays text (:mod:`llama_cpp._safety.chat_tokens`), adds the format's stop strings, builds
the grammar a named ``tool_choice`` or a JSON ``response_format`` asks for, and runs
``llama.create_completion``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .._core.ownership import unwrap  # Llama.model is the pointer; its wrapper tokenizes
from .._generation import responses as _responses
from .._safety.chat_tokens import message_texts, tokenize_chat_prompt
from ..llama_grammar import JSON_GBNF, LlamaGrammar

logger = logging.getLogger("llama_cpp.chat")

# sampling keywords every handler forwards to create_completion as they are
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty", "frequency_penalty",
                 "repeat_penalty", "tfs_z", "mirostat_mode", "mirostat_tau", "mirostat_eta", "model", "seed",
                 "logit_bias")


def sampling_kwargs(values: dict[str, Any], *, hooks: dict[str, Any] | None = None) -> dict[str, Any]:
    """The create_completion keywords among ``values``; logits processors and stopping criteria
    only when given (a runtime without them then keeps working for everyone else)."""
    out = {k: values[k] for k in SAMPLING_KEYS if k in values and values[k] is not None}
    for key, value in (hooks or {}).items():
        if value is not None:
            out[key] = value
    return out


def stop_list(*stops: Any) -> list[str]:
    """One list from stop values that may each be None, a string or a list of strings."""
    out: list[str] = []
    for s in stops:
        if s is None:
            continue
        for x in ([s] if isinstance(s, str) else s):
            if x and x not in out:
                out.append(x)
    return out


def tools_from_functions(functions: Any, function_call: Any, tools: Any, tool_choice: Any) -> tuple[Any, Any]:
    """Legacy ``functions``/``function_call`` as ``tools``/``tool_choice``."""
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, dict) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, tool_choice


def find_tool(tools: Sequence[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    for t in tools or ():
        if (t.get("function") or {}).get("name") == name:
            return t
    names = [(t.get("function") or {}).get("name") for t in tools or ()]
    raise ValueError(f"tool_choice names {name!r}, which is not among the tools {names}")


def grammar_for_schema(schema: Any) -> LlamaGrammar:
    """The grammar of a JSON schema; any JSON when the schema cannot be converted (as upstream)."""
    try:
        return LlamaGrammar.from_json_schema(json.dumps(schema))
    except (ValueError, TypeError) as exc:
        logger.warning("JSON schema not convertible (%s); constraining to any JSON instead", exc)
        return LlamaGrammar.from_string(JSON_GBNF)


def grammar_for_response_format(response_format: dict[str, Any] | None) -> LlamaGrammar | None:
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        if "schema" in response_format:
            return grammar_for_schema(response_format["schema"])
        return LlamaGrammar.from_string(JSON_GBNF)
    if kind == "json_schema":
        js = response_format.get("json_schema") or {}
        return grammar_for_schema(js.get("schema", js) if isinstance(js, dict) else js)
    return None


def prompt_tokens(llama: Any, prompt: str, messages: Sequence[Any], *, added_special: bool,
                  special_in_content: bool = False, render: Callable[[list[Any]], str] | None = None) -> list[int]:
    """The tokens of a rendered prompt, message content parsed without special tokens (``render``:
    how ``messages`` became ``prompt``, for exact content spans)."""

    model = unwrap(getattr(llama, "model", None))
    if model is not None and hasattr(model, "token_bos"):
        return tokenize_chat_prompt(model, prompt, message_texts(messages), add_special=not added_special,
                                    special_in_content=special_in_content, render=render, messages=messages)
    return list(llama.tokenize(prompt.encode("utf-8"), add_bos=not added_special, special=True))


# ---- the handler -----------------------------------------------------------------------------

def formatter_to_handler(formatter: Callable[..., Any]) -> Callable[..., Any]:
    """A chat-completion handler (``handler(llama=..., messages=..., ...)``) over ``formatter``."""

    def chat_completion_handler(*, llama: Any, messages: list[Any], functions: Any = None, function_call: Any = None,
                                tools: Any = None, tool_choice: Any = None, stream: bool = False, stop: Any = None,
                                response_format: Any = None, max_tokens: int | None = None,
                                logits_processor: Any = None, grammar: Any = None, logprobs: bool | None = None,
                                top_logprobs: int | None = None, stopping_criteria: Any = None,
                                special_in_content: bool = False, **kwargs: Any) -> Any:
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in SAMPLING_KEYS}
        result = formatter(messages=messages, functions=functions, function_call=function_call, tools=tools,
                           tool_choice=tool_choice, **kwargs)
        def render(ms: list[Any]) -> str:
            return formatter(messages=ms, functions=functions, function_call=function_call, tools=tools,
                             tool_choice=tool_choice, **kwargs).prompt

        tokens = prompt_tokens(llama, result.prompt, messages, added_special=result.added_special,
                               special_in_content=special_in_content, render=render)
        stops = stop_list(stop, result.stop)
        criteria = stopping_criteria if stopping_criteria is not None else getattr(result, "stopping_criteria", None)
        if response_format is not None:
            grammar = grammar_for_response_format(response_format) or grammar
        tools, tool_choice = tools_from_functions(functions, function_call, tools, tool_choice)
        tool = None
        if isinstance(tool_choice, dict) and tools is not None:
            tool = find_tool(tools, tool_choice["function"]["name"])
            grammar = grammar_for_schema(tool["function"].get("parameters") or {"type": "object"})
        completion = llama.create_completion(
            prompt=tokens, stream=stream, stop=stops, max_tokens=max_tokens, grammar=grammar,
            logprobs=top_logprobs if logprobs else None,
            **sampling_kwargs(sampling, hooks={"logits_processor": logits_processor, "stopping_criteria": criteria}))
        if tool is not None:
            return _responses.to_chat(completion, stream, tool["function"]["name"])
        return _responses.to_chat(completion, stream)

    return chat_completion_handler

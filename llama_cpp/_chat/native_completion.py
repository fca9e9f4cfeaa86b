"""Chat completions through llama.cpp's own chat layer (:mod:`.native_chat`), as llama-server makes them.

The model's template renders the conversation with its tools; the model's raw output is parsed by
the template's parser into ``content``, ``reasoning_content`` and ``tool_calls`` (finish reason
``"tool_calls"`` when it called one); streamed, each chunk carries the OpenAI ``delta`` of what the
output so far adds (a call's index, id and name first, then its arguments in pieces).

:func:`chat_response` and :func:`chat_stream` turn completions (``create_completion`` results) into
chat completions; :func:`create_chat_completion` runs the whole request on a ``Llama``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .._errors import LlamaError
from .base import validate_messages
from .native_chat import ChatParseError, ChatPrompt, ChatStreamParser, ChatTemplates, available, parse_chat

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


def chat_stream(chunks: Iterator[Mapping[str, Any]], prompt: ChatPrompt, *, reasoning_format: str | None = None,
                id_factory: Any = None) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects for a streamed completion of ``prompt``: the role, the
    deltas of each step, then the finish reason (``"tool_calls"`` after a call) with the usage."""
    parser = ChatStreamParser(prompt, reasoning_format=reasoning_format, id_factory=id_factory)
    first = True
    try:
        for c in chunks:
            choice = c["choices"][0]
            base = _base(c, "chat.completion.chunk")
            if first:
                yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None,
                                            "logprobs": None}]}
                first = False
            deltas = parser.feed(choice["text"]) if choice["text"] else []
            if choice["finish_reason"] is not None:
                try:
                    deltas += parser.finish()
                except ChatParseError as exc:
                    log.warning("model output does not match the %s chat format (%s)", prompt.format_name, exc)
            for delta in deltas:
                yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]}
            if choice["finish_reason"] is not None:
                reason = "tool_calls" if parser.message.tool_calls else choice["finish_reason"]
                last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason, "logprobs": None}]}
                if "usage" in c:
                    last["usage"] = c["usage"]
                yield last
    finally:
        parser.close()


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


def create_chat_completion(llama: Any, templates: ChatTemplates, messages: Sequence[Mapping[str, Any]], *,
                           tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                           parallel_tool_calls: bool | None = None, response_format: Mapping[str, Any] | None = None,
                           chat_template_kwargs: Mapping[str, Any] | None = None, reasoning_format: str = "auto",
                           reasoning_effort: str | None = None, stream: bool = False, stop: str | list[str] | None = None,
                           grammar: Any = None, special_in_content: bool = False, **completion_kwargs: Any) -> Any:
    """Render with the model's template, generate with ``llama.create_completion`` and parse.

    A tool choice of ``"required"`` or a named tool, and a ``response_format``, constrain the output
    with the template's grammar; with ``"auto"`` the grammar would be lazy (triggered by the
    format's call marker), which this path leaves to the parser (phase 1: the output is parsed, not
    constrained).
    """
    messages = validate_messages(messages)  # roles are plain names here too: a role never carries control tokens
    prompt = templates.apply(
        messages, tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
        json_schema=response_format_schema(response_format), grammar=grammar if isinstance(grammar, str) else None,
        chat_template_kwargs=chat_template_kwargs, reasoning_format=reasoning_format,
        reasoning_effort=reasoning_effort)
    stops = list(prompt.additional_stops)
    if stop:
        stops += [stop] if isinstance(stop, str) else list(stop)
    use_grammar = grammar if grammar is not None and not isinstance(grammar, str) else None
    if prompt.grammar and not prompt.grammar_lazy:
        from ..llama_grammar import LlamaGrammar

        use_grammar = LlamaGrammar.from_string(prompt.grammar)
        use_grammar.prefill = prompt.generation_prompt  # the grammar starts with it; the prompt ends with it
    elif prompt.grammar_lazy:
        log.debug("%s: lazy tool-call grammar not applied (triggers %s); the output is parsed",
                  prompt.format_name, [t.value for t in prompt.grammar_triggers])
    from .handler import prompt_tokens

    # llama.cpp leaves BOS out of the prompt where the vocabulary adds it; message content stays text
    render_opts = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls,
                   "chat_template_kwargs": chat_template_kwargs, "reasoning_effort": reasoning_effort}
    tokens = prompt_tokens(llama, prompt.prompt, messages, added_special=False, special_in_content=special_in_content,
                           render=lambda ms: templates.apply(ms, **render_opts).prompt)
    completion = llama.create_completion(tokens, stream=stream, stop=stops, grammar=use_grammar, **completion_kwargs)
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

    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) and ``reasoning_format`` apply to
    every request; a template text replaces the model's own.
    """

    def __init__(self, chat_template: str | None = None, *, chat_template_kwargs: Mapping[str, Any] | None = None,
                 reasoning_format: str = "auto", parallel_tool_calls: bool | None = None) -> None:
        self.chat_template = chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.reasoning_format = reasoning_format
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
            parallel_tool_calls=self.parallel_tool_calls, response_format=response_format,
            chat_template_kwargs={**self.chat_template_kwargs, **(chat_template_kwargs or {})} or None,
            reasoning_format=self.reasoning_format, stream=stream, stop=stop, grammar=grammar,
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


__all__ = ["NativeChatHandler", "chat_response", "chat_stream", "create_chat_completion", "native_tools_handler",
           "response_format_schema"]

"""From a request body to what an engine runs: prompt tokens, limits, stops, grammars, chat chunks.

The chat prompt is built as ``Llama.create_chat_completion`` builds it (the model's template or
``chat_format``, tools, ``tool_choice`` and ``response_format`` grammars, special-token text in
message content kept as text), so a chat served by a slot equals the same chat run through Llama.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from .. import llama_chat_format as _chat
from .._chat import native_chat, native_completion
from .._chat.constraint import ChatConstraint
from .._chat.handler import prompt_tokens
from .._chat.native_completion import ChatChunks as NativeChatChunks
from .._chat.template_chat import response_format_grammar, select_tool
from .._errors import ContextOverflowError
from .._generation import responses as _responses
from .._generation.completion import prompt_tokens as text_prompt_tokens
from .._safety.chat_tokens import message_texts, tokenize_chat_prompt
from .._safety.prompt_chars import check_prompt_chars
from .._safety.tool_limits import check_tools
from ..llama import Llama
from ..llama_grammar import LlamaGrammar, json_schema_to_gbnf
from ..mtmd_chat import flatten_messages
from .engine.media import ENCODE_LOCK, media_prompt
from .errors import APIError

log = logging.getLogger("llama_cpp.server")


def prompt_list(prompt: Any) -> list[str | list[int]]:
    """A completion ``prompt`` as a list of prompts (text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        return [""]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


def completion_tokens(llama: Llama, prompt: str | list[int], suffix: str | None, n_ctx: int | None = None) -> list[int]:
    if n_ctx is not None and isinstance(prompt, str):  # counted before tokenizing (bounded time)
        check_prompt_chars(llama.model, prompt + (suffix or ""), n_ctx)
    toks = text_prompt_tokens(llama, prompt, suffix)
    if not toks:
        raise APIError(400, "the prompt is empty (and the model adds no BOS token): give at least one token",
                       param="prompt")
    llama.native_model().check_tokens(toks, "prompt token")
    return toks


def check_prompt(llama: Llama, tokens: list[int], n_ctx: int, n_cells: int | None = None) -> None:
    """A prompt must leave room for one generated token in its slot's context (``n_cells``: the KV cells
    it takes where that is not its length, a media prompt's)."""
    n = len(tokens) if n_cells is None else n_cells
    if n >= n_ctx:
        raise ContextOverflowError(
            f"the prompt has {n} tokens; this model's context holds {n_ctx} per request (and needs room "
            "for at least one generated token): shorten the prompt")


def max_tokens(asked: int | None, n_prompt: int, n_ctx: int, limit: int) -> int:
    """The token budget: what was asked, at most what the context has room for (0/None: all of it,
    up to the server's ``max_tokens_limit``)."""
    room = n_ctx - n_prompt
    if not asked:
        return min(room, limit)
    return min(int(asked), room)


def stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def grammar(text: str | None) -> LlamaGrammar | None:
    return None if text is None else LlamaGrammar(text)


def logit_bias(llama: Llama, bias: dict[str, float] | None, kind: str | None) -> dict[int, float] | None:
    """``logit_bias`` keyed by token id; with ``logit_bias_type="tokens"`` the keys are text."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        if kind == "tokens":
            for t in llama.native_model().tokenize(key.encode("utf-8"), add_special=False, parse_special=True):
                out[t] = float(value)
            continue
        try:
            out[int(key)] = float(value)
        except ValueError:
            raise APIError(400, f"logit_bias key {key!r} is not a token id (set logit_bias_type='tokens' for text)",
                           param="logit_bias") from None
    return out


def tokenize(llama: Llama, text: str) -> list[int]:
    return llama.native_model().tokenize(text.encode("utf-8"), add_special=True, parse_special=True)


def refuse_media(messages: list[dict[str, Any]], alias: str) -> None:
    """Image or audio parts need a model with a projector."""
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in ("image_url", "input_audio", "audio_url"):
                    raise APIError(400, f"messages[{i}] has a {part.get('type')} part but the model {alias!r} has "
                                   "no projector: start it with --clip_model_path", param="messages")


@dataclasses.dataclass
class ChatPrompt:
    tokens: list[int]
    stops: list[str]
    grammar: LlamaGrammar | ChatConstraint | None
    tool_name: str | None
    # llama.cpp's chat layer rendered it (a request with tools on a template that knows them): the
    # output is parsed into content, reasoning_content and tool_calls by this prompt's parser
    native: native_chat.ChatPrompt | None = None
    reasoning_format: str | None = None  # how the native parser returns the thinking (llama-server's names)
    # its image/audio chunks (engine.media.MediaSpan), whose entries in tokens are keys, not token ids
    media: list[Any] = dataclasses.field(default_factory=list)


def request_tools(body: Any) -> tuple[Any, Any]:
    """A chat request's tools and tool choice, checked (400 naming the problem), with the legacy
    ``functions``/``function_call`` taken as tools where no ``tools`` are given."""
    try:
        check_tools(body.tools)
        check_tools(body.functions, "functions")
    except ValueError as exc:
        raise APIError(400, str(exc), param="tools") from exc
    tools, tool_choice = body.tools, body.tool_choice
    if body.functions and not tools:
        tools = [{"type": "function", "function": f} for f in body.functions]
        if isinstance(body.function_call, dict):
            tool_choice = {"type": "function", "function": {"name": body.function_call.get("name")}}
    return tools, tool_choice


def chat_prompt(llama: Llama, body: Any, n_ctx: int | None = None) -> ChatPrompt:
    """The chat's prompt tokens, template stops, grammar and forced tool (as Llama builds them):
    with tools, through llama.cpp's chat layer where ``Llama.create_chat_completion`` goes there."""
    msgs = _chat.validate_messages(body.messages)
    tools, tool_choice = request_tools(body)
    opts = chat_options(llama, body)
    handler = native_completion.native_tools_handler(llama) if tools else None
    if handler is None and opts:
        try:
            handler = native_completion.native_handler(llama)
        except ValueError as exc:  # ParameterError: a named chat_format, no template, no chat layer
            raise APIError(400, str(exc), param=sorted(opts)[0]) from exc
    if handler is not None:
        return _native_chat_prompt(llama, handler.templates_for(llama), msgs, tools, tool_choice, body, n_ctx, opts)
    fmt = llama.chat_formatter()
    result = fmt(messages=msgs, tools=tools)
    text: str | None = body.grammar
    tool_name = None
    if tools and tool_choice not in (None, "none", "auto"):
        tool = select_tool(tools, tool_choice)
        tool_name = tool["function"]["name"]
        if text is None:
            text = json_schema_to_gbnf(tool["function"].get("parameters") or {"type": "object"})
    if text is None and body.response_format:
        if body.response_format.get("type") not in (None, "text", "json_object", "json_schema"):
            raise APIError(400, f"unsupported response_format type {body.response_format.get('type')!r}: use text, "
                           "json_object or json_schema", param="response_format")
        text = response_format_grammar(body.response_format)
    check_prompt_chars(llama.native_model(), result.prompt, llama.n_ctx() if n_ctx is None else n_ctx, "the chat prompt")
    tokens = tokenize_chat_prompt(llama.native_model(), result.prompt, message_texts(msgs),
                                  add_special=not result.added_special, special_in_content=False,
                                  render=lambda ms: fmt(messages=ms, tools=tools).prompt, messages=msgs)
    if not tokens:
        raise APIError(400, "the chat renders to an empty prompt", param="messages")
    llama.native_model().check_tokens(tokens, "prompt token")
    return ChatPrompt(tokens, list(result.stop), LlamaGrammar(text) if text is not None else None, tool_name)


def chat_options(llama: Llama, body: Any) -> dict[str, Any]:
    """The request's llama.cpp chat-layer options over the model's defaults (``Llama(chat_template_kwargs=,
    reasoning_format=, reasoning_budget=)``, the model settings), ``chat_template_kwargs`` merged; a bad
    value is a 400 naming the valid ones."""
    budget = getattr(body, "reasoning_budget_tokens", None)
    try:
        own = native_completion.check_chat_options(getattr(body, "chat_template_kwargs", None),
                                                   getattr(body, "reasoning_format", None),
                                                   None if budget is None or budget == -1 else budget)
    except ValueError as exc:
        raise APIError(400, str(exc), param="chat_template_kwargs") from exc
    return native_completion.over_model_defaults(llama, own)


def _native_chat_prompt(llama: Llama, templates: native_chat.ChatTemplates, msgs: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None, tool_choice: Any, body: Any, n_ctx: int | None,
                        options: dict[str, Any], tokenize: Any = None) -> ChatPrompt:
    """The prompt llama.cpp's chat layer renders (as ``NativeChatHandler`` builds it): the template's
    stops, and the answer's constraint as llama-server samples it (lazy tool-call grammar for
    ``tool_choice="auto"``, strict where the tool choice or response format forces one, the reasoning
    budget, the template's preserved tokens as text)."""
    if isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
        tool_choice = {"type": "function", "function": {"name": tool_choice}}  # a bare tool name
    if body.grammar and tools and tool_choice != "none":
        raise APIError(400, "a grammar cannot be combined with tools (the tool calls have their own grammar): drop "
                       'grammar, or send tool_choice "none"', param="grammar")
    reasoning_format = options.get("reasoning_format", "auto")
    opts: dict[str, Any] = {"tools": tools, "tool_choice": tool_choice,
                            "parallel_tool_calls": getattr(body, "parallel_tool_calls", None),
                            "reasoning_effort": getattr(body, "reasoning_effort", None),
                            "chat_template_kwargs": options.get("chat_template_kwargs")}
    try:
        native = templates.apply(msgs, json_schema=native_completion.response_format_schema(body.response_format),
                                 grammar=body.grammar, reasoning_format=reasoning_format, **opts)
    except ValueError as exc:  # TemplateError: a tool choice naming no tool, a bad schema...
        raise APIError(400, str(exc), param="tools") from exc
    if body.grammar and not native.grammar:  # the chat layer leaves the caller's grammar to the caller
        native = dataclasses.replace(native, grammar=body.grammar, grammar_lazy=False, grammar_triggers=())
    try:
        grammar = ChatConstraint(llama.native_model(), native, reasoning_budget=options.get("reasoning_budget", -1),
                                 reasoning_budget_message=getattr(body, "reasoning_budget_message", None) or "",
                                 user_grammar=bool(body.grammar))
    except ValueError as exc:  # a grammar llama.cpp refuses
        raise APIError(400, str(exc), param="grammar") from exc
    check_prompt_chars(llama.native_model(), native.prompt, llama.n_ctx() if n_ctx is None else n_ctx, "the chat prompt")
    def render(ms: list[Any]) -> str:
        return templates.apply(ms, **opts).prompt

    if tokenize is not None:  # a media chat: (entries, media spans) of the rendered text
        tokens, media = tokenize(native.prompt, render)
    else:
        tokens, media = prompt_tokens(llama, native.prompt, msgs, added_special=False, render=render), []
    if not tokens:
        raise APIError(400, "the chat renders to an empty prompt", param="messages")
    if not media:
        llama.native_model().check_tokens(tokens, "prompt token")
    return ChatPrompt(tokens, list(native.additional_stops), grammar, None, native, reasoning_format, media)


def media_chat_prompt(llama: Llama, body: Any, n_ctx: int) -> ChatPrompt:
    """A chat on a projector model (``llama.chat_handler``, an ``MTMDChatHandler``) as the slots take it:
    rendered as the handler renders it (llama.cpp's chat layer for tools, a response format or chat options,
    else the template), tokenized by mtmd with the media at their markers, each media chunk encoded now."""

    handler = llama.chat_handler
    with ENCODE_LOCK:  # the handler makes its mtmd context on first use; mtmd is used by one thread at a time
        engine = handler.engine_for(llama)
    tools, tool_choice = request_tools(body)
    opts = chat_options(llama, body)
    n_ubatch = min(llama.native_context().n_ubatch(), llama.native_context().n_batch())

    def entries(chunks: Any) -> tuple[list[int], list[Any]]:
        try:
            return media_prompt(engine.mtmd, chunks, n_ubatch)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from exc
        finally:
            chunks.close()

    layer = engine.chat_layer_for(tools, body.response_format, opts)
    if layer is not None:
        msgs, media = flatten_messages(body.messages, engine.mtmd.marker, engine.media_policy)

        def tokenize(text: str, render: Any) -> tuple[list[int], list[Any]]:
            if text.count(engine.mtmd.marker) != len(media):
                raise APIError(400, f"the chat template kept {text.count(engine.mtmd.marker)} of {len(media)} media "
                               "markers (it drops or rewrites some message contents)", param="messages")
            with ENCODE_LOCK:
                chunks = engine.chat_prompt(media, text, msgs, render=render)
            return entries(chunks)

        return _native_chat_prompt(llama, layer.templates_for(llama), msgs, tools, tool_choice, body, n_ctx, opts,
                                   tokenize)
    if tools or body.response_format:
        raise APIError(400, "tools and response_format need llama.cpp's chat layer over the model's own template "
                       "(and, for tools, a template that knows them); this chat renders with a named chat format "
                       "or a preset's template", param="tools" if tools else "response_format")
    with ENCODE_LOCK:
        chunks, template_stops = engine.tokenize_messages(body.messages)
    tokens, media = entries(chunks)
    return ChatPrompt(tokens, list(template_stops), None, None, media=media)


def chat_result(parts: list[dict[str, Any]], chat: ChatPrompt) -> dict[str, Any]:
    """A ``chat.completion`` from the ``text_completion`` chunks of ``chat``'s answer."""
    completion = _responses.join_chunks(parts)
    if chat.native is not None:
        out = native_completion.chat_response(completion, chat.native, reasoning_format=chat.reasoning_format)
    else:
        out = _responses.chat_response(completion, chat.tool_name)
    _carry_stop(parts[-1]["choices"][0], out["choices"][0])
    return out


def _carry_stop(src: dict[str, Any], dst: dict[str, Any]) -> None:
    """The stop string that ended the answer (the slots report it), for APIs that name it."""
    if src.get("stop_sequence") is not None:
        dst["stop_sequence"] = src["stop_sequence"]


def chat_chunks(chat: ChatPrompt) -> Any:
    """The converter of one choice's ``text_completion`` chunks for ``chat``."""
    if chat.native is not None:
        return NativeChatChunks(chat.native, reasoning_format=chat.reasoning_format)
    return _responses.ChatChunks(chat.tool_name)


def join_chat_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``chat.completion`` from ``chat.completion.chunk`` objects (the image-chat handler's stream): the
    content and reasoning joined, each tool call's id, name and arguments assembled by its index."""
    content, reasoning, calls = [], [], {}
    for c in chunks:
        if not c.get("choices"):
            continue
        delta = c["choices"][0].get("delta") or {}
        content.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning_content") or "")
        for d in delta.get("tool_calls") or []:
            call = calls.setdefault(d.get("index", 0), {"id": None, "type": "function",
                                                        "function": {"name": "", "arguments": ""}})
            call["id"] = d.get("id") or call["id"]
            fn = d.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or (None if calls else "")}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    last = chunks[-1]
    finish = next((c["choices"][0].get("finish_reason") for c in reversed(chunks)
                   if c.get("choices") and c["choices"][0].get("finish_reason")), "stop")
    return {"id": last["id"], "object": "chat.completion", "created": last["created"], "model": last["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": next((c["usage"] for c in reversed(chunks) if "usage" in c), None)}


__all__ = ["ChatPrompt", "NativeChatChunks", "chat_chunks", "chat_prompt", "chat_result", "check_prompt", "completion_tokens", "grammar",
           "join_chat_chunks", "logit_bias", "max_tokens", "media_chat_prompt", "prompt_list", "refuse_media",
           "request_tools", "stops", "tokenize"]

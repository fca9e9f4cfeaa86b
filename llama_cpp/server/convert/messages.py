"""Anthropic's Messages API as a translation onto the chat completion path.

:func:`chat_request` turns a ``/v1/messages`` body (``system``, content blocks ``text``/``image``/
``tool_use``/``tool_result``/``thinking``, ``tools``, ``tool_choice``, ``stop_sequences``) into chat
completion keywords; :func:`message` turns the ``chat.completion`` into a ``message`` (thinking, text
and tool_use blocks, ``stop_reason``); :class:`MessageEvents` turns the ``chat.completion.chunk``
stream into Anthropic's events (``message_start``, ``content_block_start/delta/stop``,
``message_delta``, ``message_stop``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from ..errors import APIError
from .tools import function_tool, has_tool, named_choice


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param)


# ------------------------------------------------------------------------------------------------
# request: messages with content blocks -> chat messages
# ------------------------------------------------------------------------------------------------

def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    src = block.get("source")
    if not isinstance(src, dict):
        raise _bad(f"{where}: an image block needs a source", f"{where}.source")
    if src.get("type") == "base64" and isinstance(src.get("data"), str) and isinstance(src.get("media_type"), str):
        url = f"data:{src['media_type']};base64,{src['data']}"
    elif src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise _bad(f"{where}.source must be {{type: base64, media_type, data}} or {{type: url, url}}",
                   f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _text(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}: a text block needs a string 'text'", f"{where}.text")
    return text


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    for j, b in enumerate(content):
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise _bad(f"{where}.content[{j}] must be a content block with a type", f"{where}.content[{j}]")
    return content


def system_text(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    if not isinstance(system, list):
        raise _bad("system must be a string or a list of text blocks", "system")
    texts = []
    for i, b in enumerate(system):
        if not isinstance(b, dict) or b.get("type") != "text":
            raise _bad(f"system[{i}] must be a text block", f"system[{i}]")
        texts.append(_text(b, f"system[{i}]"))
    return "\n".join(texts)


def _tool_result(block: Mapping[str, Any], where: str, open_calls: set[str]) -> dict[str, Any]:
    use_id = block.get("tool_use_id")
    if use_id not in open_calls:
        raise _bad(f"{where}: tool_use_id {use_id!r} matches no tool_use block in the previous assistant message: "
                   "each tool_result answers a tool_use the assistant made just before", f"{where}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for k, b in enumerate(_blocks(content, where)):
            if b["type"] == "text":
                parts.append({"type": "text", "text": _text(b, f"{where}.content[{k}]")})
            elif b["type"] == "image":
                parts.append(_image(b, f"{where}.content[{k}]"))
            else:
                raise _bad(f"{where}.content[{k}] has type {b['type']!r}: a tool_result holds text or image blocks",
                           f"{where}.content[{k}]")
        content = _joined(parts)
    elif not isinstance(content, str):
        raise _bad(f"{where}.content must be a string or a list of blocks", f"{where}.content")
    if block.get("is_error") and isinstance(content, str):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": use_id, "content": content}


def messages_from_request(system: Any, messages: list[Any]) -> list[dict[str, Any]]:
    """The chat messages for ``system`` and Anthropic ``messages``."""
    out: list[dict[str, Any]] = []
    sys_text = system_text(system)
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    open_calls: set[str] = set()  # the tool_use ids of the last assistant message
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise _bad(f"{where}.role must be user or assistant", f"{where}.role")
        blocks = _blocks(m.get("content"), where)
        if m["role"] == "assistant":
            text, thinking, calls = [], [], []
            for j, b in enumerate(blocks):
                at = f"{where}.content[{j}]"
                if b["type"] == "text":
                    text.append(_text(b, at))
                elif b["type"] == "thinking":
                    thinking.append(b.get("thinking") or "")
                elif b["type"] == "redacted_thinking":
                    continue  # opaque to any model but the one that wrote it
                elif b["type"] == "tool_use":
                    if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                        raise _bad(f"{at}: a tool_use block needs an id and a name", at)
                    if not isinstance(b.get("input", {}), dict):
                        raise _bad(f"{at}.input must be an object", f"{at}.input")
                    calls.append({"id": b["id"], "type": "function",
                                  "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
                else:
                    raise _bad(f"{at} has type {b['type']!r}: an assistant message holds text, thinking and "
                               "tool_use blocks", f"{at}.type")
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or (None if calls else "")}
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            open_calls = {c["id"] for c in calls}
            continue
        parts: list[dict[str, Any]] = []
        for j, b in enumerate(blocks):
            at = f"{where}.content[{j}]"
            if b["type"] == "tool_result":
                out.append(_tool_result(b, at, open_calls))
            elif b["type"] == "text":
                parts.append({"type": "text", "text": _text(b, at)})
            elif b["type"] == "image":
                parts.append(_image(b, at))
            else:
                raise _bad(f"{at} has type {b['type']!r}: a user message holds text, image and tool_result blocks",
                           f"{at}.type")
        if parts:
            out.append({"role": "user", "content": _joined(parts)})
        open_calls = set()
    return out


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{i}] needs a name (and an input_schema)", f"tools[{i}]")
        if t.get("type") not in (None, "custom"):
            raise _bad(f"tools[{i}] has type {t['type']!r}: this server runs client tools (name, input_schema) only",
                       f"tools[{i}].type")
        out.append(function_tool(t["name"], t.get("description"), t.get("input_schema")))
    return out


def chat_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, bool | None]:
    """``tool_choice`` as a chat tool choice, and ``parallel_tool_calls`` (False when parallel use is off)."""
    if choice is None:
        return None, None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice must be {type: auto | any | tool | none}", "tool_choice")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice["type"]
    if kind == "tool":
        name = choice.get("name")
        if not has_tool(tools, name):
            raise _bad(f"tool_choice names {name!r}, which is not among the tools", "tool_choice.name")
        return named_choice(name), parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def chat_request(body: Any) -> dict[str, Any]:
    """Chat completion keywords for a Messages request ``body``."""
    tools = chat_tools(body.tools)
    choice, parallel = chat_tool_choice(body.tool_choice, tools)
    kw: dict[str, Any] = {
        "model": body.model, "messages": messages_from_request(body.system, body.messages), "tools": tools,
        "tool_choice": choice if tools else None, "parallel_tool_calls": parallel, "max_tokens": body.max_tokens,
        "stop": body.stop_sequences or None, "stream": body.stream,
    }
    for name in ("temperature", "top_p", "top_k", "chat_template_kwargs", "lora"):
        if getattr(body, name, None) is not None:
            kw[name] = getattr(body, name)
    thinking = body.thinking or {}
    if thinking.get("type") == "enabled":  # the thinking budget, as llama-server maps it (10000 when unsaid)
        budget = thinking.get("budget_tokens", 10000)
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise _bad(f"thinking.budget_tokens must be a whole number of tokens, got {budget!r}", "thinking")
        kw["reasoning_budget_tokens"] = budget
    return kw


# ------------------------------------------------------------------------------------------------
# response: chat completion -> message
# ------------------------------------------------------------------------------------------------

def stop_reason(finish: str | None, stop_sequence: str | None) -> str:
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}  # a call cut off by max_tokens: its arguments never closed
    return value if isinstance(value, dict) else {"value": value}


def usage(u: Mapping[str, Any] | None) -> dict[str, Any]:
    u = u or {}
    cached = u.get("prompt_tokens_cached", 0)
    return {"input_tokens": u.get("prompt_tokens", 0) - cached, "output_tokens": u.get("completion_tokens", 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def message(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The ``message`` for a finished ``chat.completion``."""
    choice = chat["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for tc in msg.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                        "input": _input(tc["function"]["arguments"])})
    stop = choice.get("stop_sequence")
    return {"id": _id("msg"), "type": "message", "role": "assistant", "model": chat["model"], "content": content,
            "stop_reason": stop_reason(choice.get("finish_reason"), stop), "stop_sequence": stop,
            "usage": usage(chat.get("usage"))}


# ------------------------------------------------------------------------------------------------
# streaming: chat.completion.chunk objects -> Messages events
# ------------------------------------------------------------------------------------------------

class MessageEvents:
    """Anthropic's event sequence for one streamed chat completion: ``message_start``; per block
    ``content_block_start``, its deltas (``thinking_delta``, ``text_delta``, ``input_json_delta``) and
    ``content_block_stop``; then ``message_delta`` (stop reason, usage) and ``message_stop``."""

    def __init__(self, model: str, n_prompt: int = 0) -> None:
        self.model = model
        self.n_prompt = n_prompt
        self.index = -1
        self.kind: str | None = None  # the open block's type
        self.call_index: int | None = None
        self.finish: str | None = None
        self.stop: str | None = None
        self.usage: dict[str, Any] | None = None

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": {
            "id": _id("msg"), "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.n_prompt, "output_tokens": 0}}}]

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close()
        self.index += 1
        self.kind = block["type"]
        out.append({"type": "content_block_start", "index": self.index, "content_block": block})
        return out

    def _close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":  # the signature closes a thinking block (empty: nothing to verify)
            out.append({"type": "content_block_delta", "index": self.index,
                        "delta": {"type": "signature_delta", "signature": ""}})
        self.kind, self.call_index = None, None
        out.append({"type": "content_block_stop", "index": self.index})
        return out

    def chunk(self, c: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if c.get("usage"):
            self.usage = c["usage"]
        for choice in c.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if self.kind != "thinking":
                    out += self._open({"type": "thinking", "thinking": "", "signature": ""})
                out.append({"type": "content_block_delta", "index": self.index,
                            "delta": {"type": "thinking_delta", "thinking": delta["reasoning_content"]}})
            if delta.get("content"):
                if self.kind != "text":
                    out += self._open({"type": "text", "text": ""})
                out.append({"type": "content_block_delta", "index": self.index,
                            "delta": {"type": "text_delta", "text": delta["content"]}})
            for tc in delta.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if self.kind != "tool_use" or self.call_index != tc.get("index"):
                    out += self._open({"type": "tool_use", "id": tc.get("id") or _id("toolu"),
                                       "name": fn.get("name") or "", "input": {}})
                    self.call_index = tc.get("index")
                if fn.get("arguments"):
                    out.append({"type": "content_block_delta", "index": self.index,
                                "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                self.stop = choice.get("stop_sequence")
        return out

    def finish_events(self) -> list[dict[str, Any]]:
        out = self._close()
        u = usage(self.usage)
        out.append({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(self.finish, self.stop), "stop_sequence": self.stop},
                    "usage": {"output_tokens": u["output_tokens"], "input_tokens": u["input_tokens"],
                              "cache_read_input_tokens": u["cache_read_input_tokens"]}})
        out.append({"type": "message_stop"})
        return out


def sse_event(ev: Mapping[str, Any]) -> bytes:
    return f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()


__all__ = ["MessageEvents", "chat_request", "chat_tool_choice", "chat_tools", "message", "messages_from_request",
           "sse_event", "stop_reason", "system_text", "usage"]

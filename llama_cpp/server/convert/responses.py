"""OpenAI's Responses API as a translation onto the chat completion path.

:func:`chat_request` turns a ``/v1/responses`` body (``input`` as text or items, ``instructions``,
function ``tools``, ``text.format``, ``reasoning``) into chat completion keywords;
:func:`response` turns the ``chat.completion`` back into a ``response`` object (reasoning,
message and function call items); :class:`ResponseEvents` turns the ``chat.completion.chunk``
stream into the Responses event sequence (``response.created`` … ``response.completed``), each
event numbered by ``sequence_number``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import APIError
from .tools import function_tool, has_tool, named_choice


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, code="invalid_value", param=param)


# ------------------------------------------------------------------------------------------------
# request: input items -> chat messages
# ------------------------------------------------------------------------------------------------

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's ``content`` (text or parts) as chat content: text, or parts when an image is in it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts", f"{where}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise _bad(f"{at} ({kind}) needs a string 'text'", at)
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise _bad(f"{at}: an input_image needs an image_url (a URL or a data: URL); file_id is not "
                           "supported by this server", at)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _bad(f"{at} has type {kind!r}: use input_text, output_text or input_image", at)
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def messages_from_input(input_: str | list[Any], instructions: str | None, history: int = 0) -> list[dict[str, Any]]:
    """The chat messages for ``instructions`` and ``input`` (messages, function calls, their outputs,
    reasoning items). A function call output must answer a function call made earlier in ``input``.
    The first ``history`` items are a stored conversation's (errors name ``input`` past them)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        out.append({"role": "user", "content": input_})
        return out
    calls: set[str] = set()
    reasoning = ""  # a reasoning item belongs to the assistant turn after it

    def assistant() -> dict[str, Any]:
        """The assistant message a call or reasoning joins (the last one, when it is still open)."""
        nonlocal reasoning
        if not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": ""})
        if reasoning:
            out[-1]["reasoning_content"] = out[-1].get("reasoning_content", "") + reasoning
            reasoning = ""
        return out[-1]

    for i, item in enumerate(input_):
        where = f"input[{i - history}]" if i >= history else f"the stored conversation's item {i}"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object (a message, function_call or function_call_output item)", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{where}.role is {role!r}: use user, assistant, system or developer", f"{where}.role")
            content = _content(item.get("content"), where)
            if role == "assistant":
                msg = assistant()
                if msg.get("tool_calls") or not isinstance(content, str):
                    out.append({"role": "assistant", "content": content})
                else:
                    msg["content"] = (msg["content"] or "") + content
            else:
                out.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise _bad(f"{where}: a function_call needs call_id and name", where)
            if not isinstance(args, str):
                raise _bad(f"{where}.arguments must be a JSON string", f"{where}.arguments")
            msg = assistant()
            msg.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
            if not msg["content"]:
                msg["content"] = None
            calls.add(call_id)
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if call_id not in calls:
                raise _bad(f"{where}: no function_call with call_id {call_id!r} comes before this "
                           "function_call_output in input (or the previous response): send the call with its "
                           "output", f"{where}.call_id")
            if not isinstance(output, str):
                output = _content(output, where) if isinstance(output, list) else None
                if not isinstance(output, str):
                    raise _bad(f"{where}.output must be a string or text parts", f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            texts = [p.get("text", "") for p in (item.get("content") or item.get("summary") or [])
                     if isinstance(p, dict)]
            reasoning += "".join(t for t in texts if isinstance(t, str))
        else:
            raise _bad(f"{where} has type {kind!r}: this server takes message, function_call, "
                       "function_call_output and reasoning items", f"{where}.type")
    return out


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) as chat tools (``{"type": "function", "function": {...}}``)."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise _bad(f"tools[{i}] has type {kind!r}: this server runs function tools only", f"tools[{i}].type")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{i}] needs a name", f"tools[{i}].name")
        out.append(function_tool(t["name"], t.get("description"), t.get("parameters")))
    return out


def chat_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if not has_tool(tools, choice["name"]):
            raise _bad(f"tool_choice names {choice['name']!r}, which is not among the tools", "tool_choice")
        return named_choice(choice["name"])
    raise _bad("tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}", "tool_choice")


def response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format``."""
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format json_schema needs a 'schema' object", "text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "response"), "schema": fmt["schema"],
                                                       "strict": fmt.get("strict")}}
    raise _bad(f"text.format type {fmt.get('type')!r}: use text, json_object or json_schema", "text.format.type")


def input_items(input_: str | list[Any]) -> list[Any]:
    """``input`` as a list of items (a text is one user message)."""
    if isinstance(input_, str):
        return [{"type": "message", "role": "user", "content": input_}]
    return list(input_)


_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def stored_items(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as a stored response keeps and lists them (``input_items``): each with an ``id`` and
    a message's text content as parts (``input_text``; ``output_text`` for the assistant's), which read
    back as the same chat messages."""
    out = []
    for item in items:
        item = dict(item)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            item["type"] = "message"
            if isinstance(item.get("content"), str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": item["content"]}]
            item.setdefault("status", "completed")
        item.setdefault("id", _id(_ITEM_PREFIX.get(kind, "item")))
        out.append(item)
    return out


def chat_request(body: Any, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Chat completion keywords for a Responses request ``body``; ``history``: the items of the
    conversation it continues (its ``previous_response_id``'s input and output), before its ``input``."""
    tools = chat_tools(body.tools)
    conversation: str | list[Any] = history + input_items(body.input) if history else body.input
    messages = messages_from_input(conversation, body.instructions, len(history or ()))
    kw: dict[str, Any] = {
        "model": body.model, "messages": messages, "tools": tools,
        "tool_choice": chat_tool_choice(body.tool_choice, tools), "max_tokens": body.max_output_tokens,
        "response_format": response_format(body.text), "stream": body.stream, "seed": body.seed,
        "parallel_tool_calls": body.parallel_tool_calls,
        "reasoning_effort": (body.reasoning or {}).get("effort"),
    }
    if body.temperature is not None:
        kw["temperature"] = body.temperature
    if body.top_p is not None:
        kw["top_p"] = body.top_p
    lora = getattr(body, "lora", None)
    if lora is not None:  # llama-server's per-request LoRA scales, passed through
        kw["lora"] = lora
    return kw


# ------------------------------------------------------------------------------------------------
# response: chat completion -> response object
# ------------------------------------------------------------------------------------------------

def usage(u: Mapping[str, Any] | None, reasoning_tokens: int = 0) -> dict[str, Any]:
    u = u or {}
    prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": u.get("prompt_tokens_cached", 0), "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt + completion}


def envelope(body: Any, rid: str, created: float, model: str, status: str, output: list[dict[str, Any]],
             usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` object around ``output``."""
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": model,
        "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": body.reasoning or {"effort": None, "summary": None}, "store": bool(body.store),
        "temperature": body.temperature, "text": body.text or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "top_p": body.top_p,
        "truncation": "disabled", "usage": usage_, "user": body.user, "metadata": body.metadata or {},
    }


def _reasoning_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": _id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": _id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": _id("fc"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def response(body: Any, chat: Mapping[str, Any], count: Callable[[str], int] = lambda _: 0) -> dict[str, Any]:
    """The ``response`` object for a finished ``chat.completion`` (``count``: tokens of a text, for
    ``reasoning_tokens``)."""
    choice = chat["choices"][0]
    msg = choice["message"]
    output: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or ""
    if reasoning:
        output.append(_reasoning_item(reasoning))
    if msg.get("content"):
        output.append(_message_item(msg["content"]))
    for tc in msg.get("tool_calls") or []:
        output.append(_call_item(tc["id"], tc["function"]["name"], tc["function"]["arguments"]))
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    return envelope(body, _id("resp"), chat.get("created", time.time()), chat["model"], status, output,
                    usage(chat.get("usage"), count(reasoning) if reasoning else 0))


# ------------------------------------------------------------------------------------------------
# streaming: chat.completion.chunk objects -> Responses events
# ------------------------------------------------------------------------------------------------

class ResponseEvents:
    """The Responses event sequence for one streamed chat completion.

    :meth:`start` gives ``response.created`` and ``response.in_progress``; :meth:`chunk` the events a
    chunk's delta adds (an item is opened with ``output_item.added`` (and ``content_part.added``),
    grows by ``…delta`` events, and is closed with ``…done``, ``content_part.done`` and
    ``output_item.done`` when the next one starts or the stream ends); :meth:`finish` closes the
    last item and gives ``response.completed`` (``response.incomplete`` at the token limit).
    """

    def __init__(self, body: Any, model: str, count: Callable[[str], int] = lambda _: 0) -> None:
        self.body = body
        self.model = model
        self.count = count
        self.id = _id("resp")
        self.created = time.time()
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.item: dict[str, Any] | None = None  # the item growing now
        self.call_index: int | None = None  # its tool call's index in the chat stream
        self.text = ""
        self.reasoning = ""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def _snapshot(self, status: str, usage_: dict[str, Any] | None = None) -> dict[str, Any]:
        return envelope(self.body, self.id, self.created, self.model, status, list(self.output), usage_)

    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self._snapshot("in_progress")),
                self._event("response.in_progress", response=self._snapshot("in_progress"))]

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close()
        self.item = item
        self.output.append(item)
        idx = len(self.output) - 1
        if item["type"] in ("message", "reasoning"):
            item["content"] = []  # filled when the item is done
        out.append(self._event("response.output_item.added", output_index=idx, item=dict(item)))
        if item["type"] == "message":
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=idx,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                          "logprobs": []}))
        elif item["type"] == "reasoning":
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=idx,
                                   content_index=0, part={"type": "reasoning_text", "text": ""}))
        return out

    def _close(self) -> list[dict[str, Any]]:
        item = self.item
        if item is None:
            return []
        self.item, self.call_index = None, None
        idx = len(self.output) - 1
        ref = {"item_id": item["id"], "output_index": idx}
        out = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            out += [self._event("response.output_text.done", **ref, content_index=0, text=self.text, logprobs=[]),
                    self._event("response.content_part.done", **ref, content_index=0, part=part)]
            item["content"] = [part]
            self.text = ""
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": self.reasoning}
            out += [self._event("response.reasoning_text.done", **ref, content_index=0, text=self.reasoning),
                    self._event("response.content_part.done", **ref, content_index=0, part=part)]
            item["content"] = [part]
            self.reasoning = ""
        else:
            out.append(self._event("response.function_call_arguments.done", **ref, name=item["name"],
                                   arguments=item["arguments"]))
        item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=idx, item=dict(item)))
        return out

    def chunk(self, c: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if "usage" in c and c["usage"]:
            self.usage = c["usage"]
        for choice in c.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if self.item is None or self.item["type"] != "reasoning":
                    out += self._open(_reasoning_item("", "in_progress"))
                self.reasoning += delta["reasoning_content"]
                out.append(self._event("response.reasoning_text.delta", item_id=self.item["id"],
                                       output_index=len(self.output) - 1, content_index=0,
                                       delta=delta["reasoning_content"]))
            if delta.get("content"):
                if self.item is None or self.item["type"] != "message":
                    out += self._open(_message_item("", "in_progress"))
                self.text += delta["content"]
                out.append(self._event("response.output_text.delta", item_id=self.item["id"],
                                       output_index=len(self.output) - 1, content_index=0, delta=delta["content"],
                                       logprobs=[]))
            for tc in delta.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if self.item is None or self.item["type"] != "function_call" or self.call_index != tc.get("index"):
                    out += self._open(_call_item(tc.get("id") or _id("call"), fn.get("name") or "", "", "in_progress"))
                    self.call_index = tc.get("index")
                elif fn.get("name") and not self.item["name"]:
                    self.item["name"] = fn["name"]
                if fn.get("arguments"):
                    self.item["arguments"] += fn["arguments"]
                    out.append(self._event("response.function_call_arguments.delta", item_id=self.item["id"],
                                           output_index=len(self.output) - 1, delta=fn["arguments"]))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def finish(self) -> list[dict[str, Any]]:
        out = self._close()
        status = "incomplete" if self.finish_reason == "length" else "completed"
        reasoning = "".join(p["text"] for it in self.output if it["type"] == "reasoning" for p in it["content"])
        final = self._snapshot(status, usage(self.usage, self.count(reasoning) if reasoning else 0))
        out.append(self._event(f"response.{status}", response=final))
        return out

    def error(self, exc: Any) -> dict[str, Any]:
        """The ``error`` event for a failure after the stream started (``exc``: an APIError)."""
        return self._event("error", code=exc.code, message=exc.message, param=exc.param)


def sse_event(ev: Mapping[str, Any]) -> bytes:
    return f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()


__all__ = ["ResponseEvents", "chat_request", "chat_tool_choice", "chat_tools", "envelope", "input_items",
           "messages_from_input", "response", "response_format", "sse_event", "stored_items", "usage"]

"""OpenAI-style responses from ``text_completion`` chunks (:func:`llama_cpp._generation.loop.completion_chunks`):
the joined completion, and chat completions or chat chunks (plain content or one tool call)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def join_chunks(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``text_completion`` response from its chunks (text and logprobs concatenated)."""
    first, last = parts[0], parts[-1]
    lp: dict[str, Any] | None = None
    for p in parts:
        block = p["choices"][0]["logprobs"]
        if block is not None:
            if lp is None:
                lp = {k: [] for k in block}
            for k, v in block.items():
                lp[k].extend(v)
    return {
        "id": first["id"], "object": "text_completion", "created": first["created"], "model": first["model"],
        "choices": [{"text": "".join(p["choices"][0]["text"] for p in parts), "index": 0, "logprobs": lp,
                     "finish_reason": last["choices"][0]["finish_reason"]}],
        "usage": last["usage"],
    }


def chat_logprobs(lp: dict[str, Any] | None) -> dict[str, Any] | None:
    """A completion ``logprobs`` block in the chat shape (``content`` entries)."""
    if not lp:
        return None
    content = []
    for tok, val, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        content.append({"token": tok, "logprob": val, "bytes": None,
                        "top_logprobs": [{"token": k, "logprob": v, "bytes": None} for k, v in (top or {}).items()]})
    return {"content": content, "refusal": None}


def call_id(tool_name: str, completion_id: str, index: int = 0) -> str:
    """The id of a forced tool call: upstream llama-cpp-python's (unique per completion, reproducible)."""
    return f"call__{index}_{tool_name}_{completion_id}"


def chat_response(completion: dict[str, Any], tool_name: str | None = None) -> dict[str, Any]:
    """A ``chat.completion`` from a joined completion; with ``tool_name`` the text is that tool's arguments
    (as ``tool_calls`` and, for clients of the legacy ``functions`` API, ``function_call``)."""
    choice = completion["choices"][0]
    message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
    finish = choice["finish_reason"]
    if tool_name is not None:
        fn = {"name": tool_name, "arguments": choice["text"]}
        message = {"role": "assistant", "content": None, "function_call": fn,
                   "tool_calls": [{"id": call_id(tool_name, completion["id"]), "type": "function", "function": dict(fn)}]}
        finish = "tool_calls"
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": message, "logprobs": chat_logprobs(choice["logprobs"]),
                         "finish_reason": finish}],
            "usage": completion["usage"]}


class ChatChunks:
    """``text_completion`` chunks → ``chat.completion.chunk`` objects, one chunk at a time: the role, the
    content deltas (or, with ``tool_name``, the call's deltas as OpenAI streams them: id, type and name
    in the first, then arguments only), then the finish reason with the usage (and the stop string that
    ended the answer where the chunk names one, as the server's slots do)."""

    def __init__(self, tool_name: str | None = None) -> None:
        self.tool_name = tool_name
        self.first = True
        self.call_started = False

    def __call__(self, c: dict[str, Any]) -> list[dict[str, Any]]:
        choice = c["choices"][0]
        base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                "model": c["model"]}
        out = []
        if self.first:
            out.append({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None,
                                             "logprobs": None}]})
            self.first = False
        if choice["text"]:
            out.append({**base, "choices": [{"index": 0, "delta": self._delta(choice["text"], c["id"]),
                                             "finish_reason": None, "logprobs": chat_logprobs(choice["logprobs"])}]})
        if choice["finish_reason"] is not None:
            reason = "tool_calls" if self.tool_name is not None else choice["finish_reason"]
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason, "logprobs": None}]}
            if choice.get("stop_sequence") is not None:  # the stop string that ended it, where the chunk names one
                last["choices"][0]["stop_sequence"] = choice["stop_sequence"]
            if "usage" in c:
                last["usage"] = c["usage"]
            out.append(last)
        return out

    def _delta(self, text: str, completion_id: str) -> dict[str, Any]:
        if self.tool_name is None:
            return {"content": text}
        if self.call_started:
            return {"function_call": {"arguments": text}, "tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        self.call_started = True
        fn = {"name": self.tool_name, "arguments": text}
        return {"function_call": fn, "tool_calls": [{"index": 0, "id": call_id(self.tool_name, completion_id),
                                                     "type": "function", "function": dict(fn)}]}


def chat_stream(chunks: Iterator[dict[str, Any]], tool_name: str | None = None) -> Iterator[dict[str, Any]]:
    """The chat chunks of a stream of ``text_completion`` chunks (see :class:`ChatChunks`)."""
    convert = ChatChunks(tool_name)
    for c in chunks:
        yield from convert(c)


def to_chat(completion_or_chunks: Any, stream: bool, tool_name: str | None = None) -> Any:
    """:func:`chat_stream` of a chunk iterator, or :func:`chat_response` of a completion."""
    if stream:
        return chat_stream(completion_or_chunks, tool_name)
    return chat_response(completion_or_chunks, tool_name)


__all__ = ["ChatChunks", "call_id", "chat_logprobs", "chat_response", "chat_stream", "join_chunks", "to_chat"]

"""OpenAI-style responses from ``text_completion`` chunks (:func:`llama_cpp._generation.loop.completion_chunks`):
the joined completion, and chat completions or chat chunks (plain content or one tool call)."""

from __future__ import annotations

import uuid
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


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def chat_response(completion: dict[str, Any], tool_name: str | None = None) -> dict[str, Any]:
    """A ``chat.completion`` from a joined completion; with ``tool_name`` the text is that tool's arguments."""
    choice = completion["choices"][0]
    message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
    finish = choice["finish_reason"]
    if tool_name is not None:
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": _call_id(), "type": "function", "function": {"name": tool_name, "arguments": choice["text"]}}]}
        finish = "tool_calls"
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": message, "logprobs": chat_logprobs(choice["logprobs"]),
                         "finish_reason": finish}],
            "usage": completion["usage"]}


def chat_stream(chunks: Iterator[dict[str, Any]], tool_name: str | None = None) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects: the role, the content (or tool-call) deltas, then the finish
    reason with the usage."""
    first = True
    call_id = _call_id()
    for c in chunks:
        choice = c["choices"][0]
        base = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                "model": c["model"]}
        if first:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None,
                                        "logprobs": None}]}
            first = False
        if choice["text"]:
            if tool_name is None:
                delta: dict[str, Any] = {"content": choice["text"]}
            else:
                delta = {"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                         "function": {"name": tool_name, "arguments": choice["text"]}}]}
            yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                        "logprobs": chat_logprobs(choice["logprobs"])}]}
        if choice["finish_reason"] is not None:
            reason = "tool_calls" if tool_name is not None else choice["finish_reason"]
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason, "logprobs": None}]}
            if "usage" in c:
                last["usage"] = c["usage"]
            yield last


__all__ = ["chat_logprobs", "chat_response", "chat_stream", "join_chunks"]

"""``/v1/responses``: OpenAI's Responses API, translated onto the chat completion path
(:mod:`llama_cpp.server.convert.responses`). With ``store`` (the ``responses_store`` setting when a
request omits it) a response is kept in the server's bounded :class:`~llama_cpp.server.response_store.ResponseStore`
under the request's API key: ``previous_response_id`` continues its conversation, and
``GET``/``DELETE /v1/responses/{id}`` read and remove it, ``GET /v1/responses/{id}/input_items`` lists
what it answered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request

from ..convert import responses as convert
from ..errors import APIError, as_api_error
from ..http import presented_key
from ..response_store import ResponseStore, owner_of
from ..types import CreateChatCompletionRequest, CreateResponseRequest
from .chat import ChatStream, start_chat
from .common import AUTH, ClientGone, guarded, registry, server_settings, sse

router = APIRouter()


def token_counter(request: Request, model: str | None) -> Callable[[str], int]:
    """Tokens of a text under ``model`` (for usage details such as reasoning tokens)."""
    served = registry(request).get(model)

    def count(text: str) -> int:
        return len(served.llama.native_model().tokenize(text.encode("utf-8"), add_special=False, parse_special=False))
    return count


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses


def not_found(rid: str) -> APIError:
    """OpenAI's answer for a response id it does not have (also another key's: ids tell nothing across keys)."""
    return APIError(404, f"Response with id '{rid}' not found.")


@router.post("/v1/responses", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def create_response(request: Request, body: CreateResponseRequest) -> Any:
    store = store_of(request)
    owner = owner_of(presented_key(request))
    history: list[dict[str, Any]] = []
    if body.previous_response_id:
        prev = store.get(owner, body.previous_response_id)
        if prev is None:
            raise APIError(400, f"Previous response with id '{body.previous_response_id}' not found.",
                           code="previous_response_not_found", param="previous_response_id")
        history = prev.items
    wanted = body.store if body.store is not None else server_settings(request).responses_store
    body = body.model_copy(update={"store": bool(wanted) and store.enabled})  # answered as it is kept
    chat_body = CreateChatCompletionRequest(**convert.chat_request(body, history))  # the input checked
    conversation = history + convert.stored_items(convert.input_items(body.input))

    def keep(response: dict[str, Any]) -> None:
        if body.store:
            store.put(owner, response, conversation)

    out = await start_chat(request, chat_body)
    count = token_counter(request, body.model)
    if isinstance(out, dict):
        response = convert.response(body, out, count)
        keep(response)
        return response
    events = convert.ResponseEvents(body, body.model or registry(request).get(body.model).alias, count)
    return sse(response_events(events, out, keep), convert.sse_event)


@router.get("/v1/responses/{response_id}", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def retrieve_response(request: Request, response_id: str) -> Any:
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError(400, "stream: this server answers a stored response whole, not replayed as events",
                       code="invalid_value", param="stream")
    entry = store_of(request).get(owner_of(presented_key(request)), response_id)
    if entry is None:
        raise not_found(response_id)
    return entry.response


@router.get("/v1/responses/{response_id}/input_items", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def list_input_items(request: Request, response_id: str, limit: int = 20, order: str = "desc",
                           after: str | None = None) -> Any:
    """The input items a stored response answered (its previous responses' included), a page at a time
    as OpenAI lists them: ``order`` desc (newest first) by default, ``limit`` 1 to 100, ``after`` an item id."""
    if not 1 <= limit <= 100:
        raise APIError(400, f"limit={limit}: give 1 to 100", code="invalid_value", param="limit")
    if order not in ("asc", "desc"):
        raise APIError(400, f"order={order!r}: use asc or desc", code="invalid_value", param="order")
    entry = store_of(request).get(owner_of(presented_key(request)), response_id)
    if entry is None:
        raise not_found(response_id)
    items = entry.conversation if order == "asc" else entry.conversation[::-1]
    if after is not None:
        at = next((i for i, it in enumerate(items) if it.get("id") == after), None)
        if at is None:
            raise APIError(400, f"after={after!r} is not an input item of the response {response_id!r}",
                           code="invalid_value", param="after")
        items = items[at + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


@router.delete("/v1/responses/{response_id}", dependencies=AUTH, tags=["OpenAI V1"])
@guarded
async def delete_response(request: Request, response_id: str) -> Any:
    if not store_of(request).delete(owner_of(presented_key(request)), response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


async def response_events(conv: convert.ResponseEvents, chunks: ChatStream,
                          keep: Callable[[dict[str, Any]], None] = lambda _: None,
                          ) -> AsyncIterator[dict[str, Any] | None]:
    """The Responses events of a chat chunk stream; a failure after the start is an ``error`` event.
    The finished response goes to ``keep`` before its last event is sent (a client may continue from
    it as soon as it has read it)."""
    for ev in conv.start():
        yield ev
    try:
        async for c in chunks:
            if c is None:
                yield None  # keep-alive
                continue
            for ev in conv.chunk(c):
                yield ev
    except ClientGone:
        raise
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error is an event
        yield conv.error(as_api_error(exc))
        return
    final = conv.finish()
    keep(final[-1]["response"])
    for ev in final:
        yield ev


__all__ = ["create_response", "delete_response", "list_input_items", "response_events", "retrieve_response", "router",
           "store_of", "token_counter"]

"""Request handling the routes share: a request's jobs on its model's engine, their events collected
or streamed, the sampling keywords, and errors as :class:`~llama_cpp.server.errors.APIError`."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Depends, Request
from starlette.responses import Response

from .. import prompts
from ..engine import GenRequest, Job, QueueFull, SerialEngine, SlotEngine, collect_stats_stream
from ..errors import APIError, as_api_error, sse_error
from ..http import SSEResponse, authenticate, registry, server_settings
from ..models import ServedModel

log = logging.getLogger("llama_cpp.server")

POLL_S = 0.25  # how often a waiting handler checks whether its client went away
AUTH = [Depends(authenticate)]


class ClientGone(Exception):
    """The client closed its connection: its jobs are cancelled and nothing more is sent."""


class Group:
    """The jobs (choices) of one HTTP request, with their events merged on one queue."""

    def __init__(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        self.jobs = [IndexedJob(loop, self.queue, i) for i in range(n)]
        self._checked = time.monotonic()

    def cancel(self) -> None:
        for j in self.jobs:
            j.cancel()

    async def next(self, request: Request, timeout: float | None = None) -> tuple[int, str, Any] | None:
        """The next event; None after ``timeout`` s; raises CancelledError once the client has left
        (checked every ``POLL_S`` seconds, whether events keep coming or not)."""
        waited = 0.0
        while True:
            now = time.monotonic()
            if now - self._checked >= POLL_S:
                self._checked = now
                if await request.is_disconnected():
                    raise ClientGone
            try:
                return self.queue.get_nowait()
            except asyncio.QueueEmpty:
                pass
            try:
                return await asyncio.wait_for(self.queue.get(), POLL_S)
            except asyncio.TimeoutError:
                waited += POLL_S
                if timeout is not None and waited >= timeout:
                    return None


class IndexedJob(Job):
    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int) -> None:
        super().__init__(loop)
        self._queue = queue
        self.index = index

    def _deliver(self, kind: str, value: Any) -> None:
        self._queue.put_nowait((self.index, kind, value))



async def served_model(request: Request, name: str | None) -> ServedModel:
    served = registry(request).get(name)
    if not served.loaded:
        await asyncio.to_thread(served.load)
    return served


def check_limits(request: Request, n: int, max_tokens: int | None, stop: str | list[str] | None = None) -> None:
    s = server_settings(request)
    if n > s.max_n:
        raise APIError(400, f"n={n} exceeds this server's limit of {s.max_n} choices", code="invalid_value", param="n")
    if max_tokens is not None and max_tokens > s.max_tokens_limit:
        raise APIError(400, f"max_tokens={max_tokens} exceeds this server's limit of {s.max_tokens_limit}",
                       code="invalid_value", param="max_tokens")
    stops = prompts.stops(stop)
    if len(stops) > s.max_stop:
        raise APIError(400, f"{len(stops)} stop strings exceed this server's limit of {s.max_stop}",
                       code="invalid_value", param="stop")
    longest = max((len(x) for x in stops), default=0)
    if longest > s.max_stop_chars:
        raise APIError(400, f"a stop string of {longest} characters exceeds this server's limit of "
                       f"{s.max_stop_chars}", code="invalid_value", param="stop")


def engine_of(served: ServedModel) -> SlotEngine | SerialEngine:
    if served.engine is None:
        raise APIError(400, f"the model {served.alias!r} was loaded with vocab_only: it can only tokenize",
                       code="invalid_model")
    return served.engine


async def submit(request: Request, served: ServedModel, n: int,
                  make: Callable[[int], GenRequest | Callable[[Any], Any]], stream: bool = False) -> Group:
    engine = engine_of(served)
    if n > engine.capacity:  # even an idle server could not take it: not worth a retry (429)
        raise APIError(400, f"this request needs {n} generations at once; the model {served.alias!r} takes at most "
                       f"{engine.capacity} (slots + queue): ask for fewer prompts or a smaller n",
                       code="invalid_value", param="n")
    group = Group(n)
    for job in group.jobs:
        job.interruptible, job.owner = stream, group  # upstream's interrupt_requests ends streams only
    items = [(job, make(job.index)) for job in group.jobs]
    if isinstance(engine, SlotEngine):
        engine.submit_many(items)  # type: ignore[arg-type]
    else:
        try:
            for job, work in items:
                engine.submit(job, work)  # type: ignore[arg-type]
        except QueueFull:
            group.cancel()
            raise
    return group


async def first_events(request: Request, group: Group) -> list[tuple[int, str, Any]]:
    """Events up to the first chunk or result (so that a failure before it is an HTTP error)."""
    seen: list[tuple[int, str, Any]] = []
    try:
        while True:
            ev = await group.next(request)
            assert ev is not None
            if ev[1] == "error":
                raise ev[2]
            if ev[1] == "started":
                continue
            seen.append(ev)
            return seen
    except BaseException:
        group.cancel()
        raise


async def collect(request: Request, group: Group) -> dict[int, list[Any]]:
    """Every choice's chunks (or result), in order; cancels the rest on any failure."""
    out: dict[int, list[Any]] = {j.index: [] for j in group.jobs}
    open_ = set(out)
    try:
        while open_:
            ev = await group.next(request)
            assert ev is not None
            idx, kind, value = ev
            if kind == "error":
                raise value
            count_tokens(request, value)
            if kind == "chunk":
                out[idx].append(value)
            elif kind == "result":
                out[idx].append(value)
                open_.discard(idx)
            elif kind == "end":
                open_.discard(idx)
    except BaseException:
        group.cancel()
        raise
    return out


async def events(request: Request, group: Group, first: list[tuple[int, str, Any]],
                 convert: Callable[[int, dict[str, Any]], list[dict[str, Any]]],
                 ping: float | None = None) -> AsyncIterator[dict[str, Any] | None]:
    """Every choice's chunks as ``convert(index, chunk)`` makes them, in order; None each ``ping`` seconds
    without one (a keep-alive); a job's error is raised. The jobs are cancelled when it ends, whatever
    the reason (a client that left frees its slots now)."""
    open_ = {j.index for j in group.jobs}
    backlog = list(first)
    try:
        while open_:
            ev = backlog.pop(0) if backlog else await group.next(request, timeout=ping)
            if ev is None:
                yield None
                continue
            idx, kind, value = ev
            if kind == "chunk":
                count_tokens(request, value)
                for obj in convert(idx, value):
                    yield obj
            elif kind in ("end", "result"):
                open_.discard(idx)
            elif kind == "error":
                raise value
    finally:
        group.cancel()


def count_tokens(request: Request, value: Any) -> None:
    """A finished job's usage on its key's counters (``/metrics``)."""
    if isinstance(value, dict) and value.get("usage"):
        label = getattr(request.state, "key_label", None)
        if label is not None:
            usage = value["usage"]
            request.app.state.keys.tokens(label, usage)
            request.app.state.quotas.spent(label, int(usage.get("prompt_tokens", 0) or 0)
                                           + int(usage.get("completion_tokens", 0) or 0))


def ping_interval(request: Request) -> float | None:
    s = server_settings(request)
    return None if s.disable_ping_events else s.ping_interval


def sse(source: AsyncIterator[Any], encode: Callable[[Any], bytes], done: bytes = b"",
        error: Callable[[BaseException], bytes] = sse_error) -> SSEResponse:
    """Server-sent events from ``source``: each item ``encode``d (None: a ping comment), ``done`` at
    the end, and an error after the stream started as ``error(exc)`` (the status line is gone)."""
    async def body() -> AsyncIterator[bytes]:
        try:
            async for item in source:
                yield b": ping\n\n" if item is None else encode(item)
            if done:
                yield done
        except ClientGone:
            return
        except Exception as exc:  # noqa: BLE001 - the client gets it as an event
            yield error(exc)

    return SSEResponse(body(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def stream(request: Request, group: Group, first: list[tuple[int, str, Any]],
           convert: Callable[[int, dict[str, Any]], list[dict[str, Any]]]) -> SSEResponse:
    """OpenAI's stream: ``data: {chunk}`` events, then ``data: [DONE]``."""
    return sse(events(request, group, first, convert, ping_interval(request)),
               lambda obj: f"data: {json.dumps(obj)}\n\n".encode(), b"data: [DONE]\n\n")


def with_index(chunk: dict[str, Any], index: int) -> dict[str, Any]:
    for c in chunk.get("choices", []):
        c["index"] = index
    return chunk


def sampling(body: Any, llama: Any) -> dict[str, Any]:
    return {"temperature": body.temperature, "top_k": body.top_k, "top_p": body.top_p, "min_p": body.min_p,
            "typical_p": body.typical_p, "repeat_penalty": body.repeat_penalty,
            "frequency_penalty": body.frequency_penalty or 0.0, "presence_penalty": body.presence_penalty or 0.0,
            "penalty_last_n": None, "mirostat_mode": body.mirostat_mode, "mirostat_tau": body.mirostat_tau,
            "mirostat_eta": body.mirostat_eta, "seed": body.seed,
            "logit_bias": prompts.logit_bias(llama, body.logit_bias, body.logit_bias_type)}


def completion_kwargs(sampling: dict[str, Any]) -> dict[str, Any]:
    """``make_sampler`` keywords as ``Llama.create_completion`` keywords."""
    kw = dict(sampling)
    kw.pop("penalty_last_n")
    return kw



def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Route errors as :class:`APIError` (so that none reaches the server-error middleware)."""
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except ClientGone:
            log.info("client went away; its request was cancelled")
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        except APIError:
            raise
        except Exception as exc:
            raise as_api_error(exc) from exc
    return wrapper



def lora_scales(served: ServedModel, entries: Any) -> tuple[float, ...]:
    """A request's ``lora`` field as its adapter scales (a 400 for a bad one, or any on a model without)."""
    if served.lora is None:
        if entries:
            raise APIError(400, f"lora: the model {served.alias!r} has no LoRA adapters (serve it with "
                           "lora_adapters or lora_path)", code="invalid_value", param="lora")
        return ()
    return served.lora.resolve(entries)


def work(served: ServedModel, req: GenRequest) -> Any:
    """What the model's engine runs for ``req``: the request itself (slots) or a ``Llama`` call (serial)."""
    if isinstance(served.engine, SlotEngine):
        return req

    def run(llama: Any) -> Any:
        if served.lora is not None:
            served.lora.use(llama, req.lora)
        chunks = llama.create_completion(
            req.prompt_tokens, max_tokens=req.max_tokens, stop=req.stop or None, logprobs=req.logprobs,
            echo=req.echo, stream=True, grammar=req.grammar, model=req.model_name,
            **completion_kwargs(req.sampling))
        return collect_stats_stream(llama, chunks)
    return run



def merge_choices(responses: list[dict[str, Any]]) -> dict[str, Any]:
    """One response holding every choice; usage summed (a prompt counted once per distinct prompt)."""
    first = dict(responses[0])
    if len(responses) == 1:
        return first
    first["choices"] = [c for r in responses for c in r["choices"]]
    usage = [r.get("usage") or {} for r in responses]
    completion = sum(u.get("completion_tokens", 0) for u in usage)
    prompt = usage[0].get("prompt_tokens", 0)
    first["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if "prompt_tokens_cached" in usage[0]:  # the prompt's reused part, counted once as the prompt is
        cached = max(u.get("prompt_tokens_cached", 0) for u in usage)
        first["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        first["usage"]["prompt_tokens_cached"] = cached
    return first


__all__ = ["AUTH", "ClientGone", "Group", "check_limits", "collect", "completion_kwargs", "engine_of", "events",
           "count_tokens", "first_events", "ping_interval", "sse", "guarded", "merge_choices", "registry", "sampling", "server_settings", "served_model",
           "stream", "submit", "with_index", "work"]

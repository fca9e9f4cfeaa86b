"""The FastAPI application: routes, authentication, body limits and the models' lifecycle.

``create_app(settings | server_settings + model_settings)`` as upstream (``CONFIG_FILE`` in the
environment names a config file). Models load in the app's lifespan; on shutdown (SIGTERM
through uvicorn) the engines stop accepting (503), running and queued requests get
``shutdown_timeout`` seconds to finish, the rest are cancelled, and the contexts are freed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .._generation import responses as _responses
from .._safety.prompt_chars import check_prompt_chars
from .._version import __version__
from . import prompts
from .engine import GenRequest, Job, QueueFull, SerialEngine, SlotEngine, collect_stats_stream
from .errors import APIError, as_api_error, error_body, install, sse_error
from .models import ModelRegistry, ServedModel
from .settings import ConfigFileSettings, ModelSettings, ServerSettings, Settings
from .types import (
    CreateChatCompletionRequest,
    CreateCompletionRequest,
    CreateEmbeddingRequest,
    DetokenizeInputRequest,
    DetokenizeInputResponse,
    ModelData,
    ModelList,
    TokenizeInputCountResponse,
    TokenizeInputRequest,
    TokenizeInputResponse,
)

log = logging.getLogger("llama_cpp.server")

_POLL_S = 0.25  # how often a waiting handler checks whether its client went away


def load_config_file(path: str) -> ConfigFileSettings:
    """A JSON or YAML (``.yaml``/``.yml``) config file as :class:`ConfigFileSettings`."""
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} not found")
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return ConfigFileSettings.model_validate(yaml.safe_load(data) or {})
    return ConfigFileSettings.model_validate_json(data)


# ------------------------------------------------------------------------------------------------
# middleware and dependencies
# ------------------------------------------------------------------------------------------------

class BodyLimit:
    """Answers 413 for a body over ``limit`` bytes before any handler reads it (declared or streamed)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(send)
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send)
                return
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        msg = f"the request body exceeds {self.limit} bytes (the server's max_body_bytes): send less"
        payload = json.dumps(error_body(msg, code="body_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def _server_settings(request: Request) -> ServerSettings:
    return request.app.state.server_settings


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


async def authenticate(request: Request) -> None:
    """``Authorization: Bearer <api_key>`` when an API key is set (compared in constant time)."""
    key = _server_settings(request).api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <api_key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class SSEResponse(StreamingResponse):
    """Server-sent events; the producer is cancelled as soon as the client disconnects."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            async def stream() -> None:
                with contextlib.suppress(OSError):
                    await self.stream_response(send)
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


# ------------------------------------------------------------------------------------------------
# a request's jobs
# ------------------------------------------------------------------------------------------------

class ClientGone(Exception):
    """The client closed its connection: its jobs are cancelled and nothing more is sent."""


class Group:
    """The jobs (choices) of one HTTP request, with their events merged on one queue."""

    def __init__(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        self.jobs = [_IndexedJob(loop, self.queue, i) for i in range(n)]
        self._checked = time.monotonic()

    def cancel(self) -> None:
        for j in self.jobs:
            j.cancel()

    async def next(self, request: Request, timeout: float | None = None) -> tuple[int, str, Any] | None:
        """The next event; None after ``timeout`` s; raises CancelledError once the client has left
        (checked every ``_POLL_S`` seconds, whether events keep coming or not)."""
        waited = 0.0
        while True:
            now = time.monotonic()
            if now - self._checked >= _POLL_S:
                self._checked = now
                if await request.is_disconnected():
                    raise ClientGone
            try:
                return self.queue.get_nowait()
            except asyncio.QueueEmpty:
                pass
            try:
                return await asyncio.wait_for(self.queue.get(), _POLL_S)
            except asyncio.TimeoutError:
                waited += _POLL_S
                if timeout is not None and waited >= timeout:
                    return None


class _IndexedJob(Job):
    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int) -> None:
        super().__init__(loop)
        self._queue = queue
        self.index = index

    def _deliver(self, kind: str, value: Any) -> None:
        self._queue.put_nowait((self.index, kind, value))


# ------------------------------------------------------------------------------------------------
# shared request handling
# ------------------------------------------------------------------------------------------------

async def _served(request: Request, name: str | None) -> ServedModel:
    served = _registry(request).get(name)
    if not served.loaded:
        await asyncio.to_thread(served.load)
    return served


def _check_limits(request: Request, n: int, max_tokens: int | None, stop: str | list[str] | None = None) -> None:
    s = _server_settings(request)
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


def _engine(served: ServedModel) -> SlotEngine | SerialEngine:
    if served.engine is None:
        raise APIError(400, f"the model {served.alias!r} was loaded with vocab_only: it can only tokenize",
                       code="invalid_model")
    return served.engine


async def _submit(request: Request, served: ServedModel, n: int,
                  make: Callable[[int], GenRequest | Callable[[Any], Any]], stream: bool = False) -> Group:
    engine = _engine(served)
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


async def _first(request: Request, group: Group) -> list[tuple[int, str, Any]]:
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


async def _collect(request: Request, group: Group) -> dict[int, list[Any]]:
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


def _stream(request: Request, group: Group, first: list[tuple[int, str, Any]],
            convert: Callable[[int, dict[str, Any]], list[dict[str, Any]]]) -> SSEResponse:
    s = _server_settings(request)
    ping = None if s.disable_ping_events else s.ping_interval

    async def events() -> AsyncIterator[bytes]:
        open_ = {j.index for j in group.jobs}
        backlog = list(first)
        try:
            while open_:
                if backlog:
                    ev: tuple[int, str, Any] | None = backlog.pop(0)
                else:
                    ev = await group.next(request, timeout=ping)
                if ev is None:
                    yield b": ping\n\n"
                    continue
                idx, kind, value = ev
                if kind == "chunk":
                    for obj in convert(idx, value):
                        yield f"data: {json.dumps(obj)}\n\n".encode()
                elif kind in ("end", "result"):
                    open_.discard(idx)
                elif kind == "error":
                    yield sse_error(value)
                    return
            yield b"data: [DONE]\n\n"
        except ClientGone:
            return
        finally:
            group.cancel()  # a client that left frees its slots now

    return SSEResponse(events(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _with_index(chunk: dict[str, Any], index: int) -> dict[str, Any]:
    for c in chunk.get("choices", []):
        c["index"] = index
    return chunk


def _sampling(body: Any, llama: Any) -> dict[str, Any]:
    return {"temperature": body.temperature, "top_k": body.top_k, "top_p": body.top_p, "min_p": body.min_p,
            "typical_p": body.typical_p, "repeat_penalty": body.repeat_penalty,
            "frequency_penalty": body.frequency_penalty or 0.0, "presence_penalty": body.presence_penalty or 0.0,
            "penalty_last_n": None, "mirostat_mode": body.mirostat_mode, "mirostat_tau": body.mirostat_tau,
            "mirostat_eta": body.mirostat_eta, "seed": body.seed,
            "logit_bias": prompts.logit_bias(llama, body.logit_bias, body.logit_bias_type)}


def _completion_kwargs(sampling: dict[str, Any]) -> dict[str, Any]:
    """``_make_sampler`` keywords as ``Llama.create_completion`` keywords."""
    kw = dict(sampling)
    kw.pop("penalty_last_n")
    return kw


# ------------------------------------------------------------------------------------------------
# routes
# ------------------------------------------------------------------------------------------------

def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
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


def _routes(app: FastAPI) -> None:
    auth = [Depends(authenticate)]

    @app.get("/health", tags=["Extras"])
    @_guarded
    async def health(request: Request) -> JSONResponse:
        reg = _registry(request)
        lazy = _server_settings(request).lazy_load
        ready = lazy or all(m.loaded for m in reg)
        body: dict[str, Any] = {"status": "ok" if ready else "loading"}
        try:
            await authenticate(request)
        except APIError:
            pass  # liveness needs no key; the models (aliases may be file paths) need it
        else:
            body["models"] = {m.alias: (m.engine.stats() if m.engine is not None else {"loaded": m.loaded})
                              for m in reg}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/v1/models", dependencies=auth, tags=["OpenAI V1"], response_model_exclude_none=True)
    @_guarded
    async def list_models(request: Request) -> ModelList:
        return ModelList(data=[ModelData(id=m.alias, speculative=m.speculative_info()) for m in _registry(request)])

    @app.post("/v1/completions", dependencies=auth, tags=["OpenAI V1"])
    @app.post("/v1/engines/copilot-codex/completions", dependencies=auth, include_in_schema=False)
    @_guarded
    async def create_completion(request: Request, body: CreateCompletionRequest) -> Any:
        _check_limits(request, body.n, body.max_tokens, body.stop)
        served = await _served(request, body.model)
        _engine(served)  # a vocab-only model says so before its prompt is looked at
        llama = served.llama
        plist = prompts.prompt_list(body.prompt)
        s = _server_settings(request)
        if len(plist) > s.max_prompts:
            raise APIError(400, f"{len(plist)} prompts exceed this server's limit of {s.max_prompts} per request",
                           code="invalid_value", param="prompt")
        if body.echo and body.logprobs is not None and isinstance(served.engine, SlotEngine):
            raise APIError(400, "echo with logprobs (scores of the prompt's tokens) is not available from parallel "
                           f"slots; the model {served.alias!r} runs {served.engine.n_slots}: ask without echo, or "
                           "serve the model with n_parallel=0", code="invalid_value", param="echo")
        created = int(time.time())
        model_name = body.model or served.alias

        def requests() -> list[GenRequest]:  # tokenizing and grammar parsing: off the event loop
            grammar = prompts.grammar(body.grammar)
            out: list[GenRequest] = []
            for p in plist:
                toks = prompts.completion_tokens(llama, p, body.suffix, served.n_ctx_slot)
                prompts.check_prompt(llama, toks, served.n_ctx_slot)
                max_tokens = prompts.max_tokens(body.max_tokens, len(toks), served.n_ctx_slot, s.max_tokens_limit)
                for _ in range(body.n):
                    out.append(GenRequest(
                        prompt_tokens=toks, max_tokens=max_tokens, sampling=_sampling(body, llama), grammar=grammar,
                        stop=prompts.stops(body.stop), logprobs=body.logprobs, echo=body.echo,
                        completion_id=f"cmpl-{uuid.uuid4()}", created=created, model_name=model_name,
                        prompt_chars=len(p) if isinstance(p, str) and body.suffix is None else None))
            return out

        reqs = await asyncio.to_thread(requests)
        group = await _submit(request, served, len(reqs), lambda i: _work(served, reqs[i]), stream=body.stream)
        if body.stream:
            first = await _first(request, group)
            return _stream(request, group, first, lambda i, c: [_with_index(c, i)])
        parts = await _collect(request, group)
        joined = [_responses.join_chunks(parts[i]) for i in range(len(reqs))]
        return _merge_choices([dict(_with_index(j, i)) for i, j in enumerate(joined)])

    @app.post("/v1/chat/completions", dependencies=auth, tags=["OpenAI V1"])
    @_guarded
    async def create_chat_completion(request: Request, body: CreateChatCompletionRequest) -> Any:
        max_tokens = body.max_tokens if body.max_tokens is not None else body.max_completion_tokens
        _check_limits(request, body.n, max_tokens, body.stop)
        served = await _served(request, body.model)
        _engine(served)  # a vocab-only model says so before its prompt is looked at
        llama = served.llama
        s = _server_settings(request)
        created = int(time.time())
        model_name = body.model or served.alias
        if llama.chat_handler is not None:  # image chat: the handler runs the whole request
            return await _handler_chat(request, served, body, max_tokens)
        prompts.refuse_media(body.messages, served.alias)
        chat = await asyncio.to_thread(prompts.chat_prompt, llama, body, served.n_ctx_slot)  # off the loop
        prompts.check_prompt(llama, chat.tokens, served.n_ctx_slot)
        limit = prompts.max_tokens(max_tokens, len(chat.tokens), served.n_ctx_slot, s.max_tokens_limit)
        stop = chat.stops + prompts.stops(body.stop)
        reqs = [GenRequest(prompt_tokens=chat.tokens, max_tokens=limit, sampling=_sampling(body, llama),
                           grammar=chat.grammar, stop=stop, logprobs=(body.top_logprobs or 0) if body.logprobs else None,
                           completion_id=f"cmpl-{uuid.uuid4()}", created=created, model_name=model_name)
                for _ in range(body.n)]
        group = await _submit(request, served, body.n, lambda i: _work(served, reqs[i]), stream=body.stream)
        if body.stream:
            first = await _first(request, group)
            converters = [prompts.ChatChunks(chat.tool_name) for _ in reqs]
            return _stream(request, group, first, lambda i, c: [_with_index(x, i) for x in converters[i](c)])
        parts = await _collect(request, group)
        out = [_responses.chat_response(_responses.join_chunks(parts[i]), chat.tool_name) for i in range(body.n)]
        return _merge_choices([_with_index(o, i) for i, o in enumerate(out)])

    @app.post("/v1/embeddings", dependencies=auth, tags=["OpenAI V1"])
    @_guarded
    async def create_embedding(request: Request, body: CreateEmbeddingRequest) -> Any:
        served = await _served(request, body.model)
        if not served.settings.embedding:
            raise APIError(400, f"the model {served.alias!r} was not loaded for embeddings: start it with "
                           "--embedding true", code="invalid_model", param="model")
        inputs = [body.input] if isinstance(body.input, str) else list(body.input)
        if not inputs:
            raise APIError(400, "input is empty: give a string or a non-empty list of strings", param="input")
        limit = served.n_ctx_slot

        def check_lengths() -> None:
            for i, text in enumerate(inputs):
                check_prompt_chars(served.llama._need_model(), text, limit, f"input[{i}]")
                n = len(served.llama._need_model().tokenize(text.encode("utf-8"), add_special=True, parse_special=True))
                if n > limit:
                    raise APIError(400, f"input[{i}] has {n} tokens; the context holds {limit}: shorten it",
                                   code="context_length_exceeded", param="input")

        await asyncio.to_thread(check_lengths)
        name = body.model or served.alias
        group = await _submit(request, served, 1, lambda _: (lambda llama: llama.create_embedding(inputs, model=name)))
        result = (await _collect(request, group))[0][0]
        if body.encoding_format == "base64":
            for d in result["data"]:
                d["embedding"] = base64.b64encode(np.asarray(d["embedding"], dtype="<f4").tobytes()).decode()
        return result

    @app.post("/extras/tokenize", dependencies=auth, tags=["Extras"])
    @_guarded
    async def tokenize(request: Request, body: TokenizeInputRequest) -> TokenizeInputResponse:
        served = await _served(request, body.model)
        return TokenizeInputResponse(tokens=await asyncio.to_thread(prompts.tokenize, served.llama, body.input))

    @app.post("/extras/tokenize/count", dependencies=auth, tags=["Extras"])
    @_guarded
    async def count_tokens(request: Request, body: TokenizeInputRequest) -> TokenizeInputCountResponse:
        served = await _served(request, body.model)
        return TokenizeInputCountResponse(
            count=len(await asyncio.to_thread(prompts.tokenize, served.llama, body.input)))

    @app.post("/extras/detokenize", dependencies=auth, tags=["Extras"])
    @_guarded
    async def detokenize(request: Request, body: DetokenizeInputRequest) -> DetokenizeInputResponse:
        served = await _served(request, body.model)
        model = served.llama._need_model()
        model.check_tokens(body.tokens, "tokens entry")
        return DetokenizeInputResponse(text=model.detokenize(body.tokens).decode("utf-8", errors="replace"))


def _work(served: ServedModel, req: GenRequest) -> Any:
    """What the model's engine runs for ``req``: the request itself (slots) or a ``Llama`` call (serial)."""
    if isinstance(served.engine, SlotEngine):
        return req

    def run(llama: Any) -> Any:
        chunks = llama.create_completion(
            req.prompt_tokens, max_tokens=req.max_tokens, stop=req.stop or None, logprobs=req.logprobs,
            echo=req.echo, stream=True, grammar=req.grammar, model=req.model_name,
            **_completion_kwargs(req.sampling))
        return collect_stats_stream(llama, chunks)
    return run


async def _handler_chat(request: Request, served: ServedModel, body: CreateChatCompletionRequest,
                        max_tokens: int | None) -> Any:
    """Image chat through the model's chat handler (one request at a time)."""
    s = _server_settings(request)
    if body.tools or body.functions or body.response_format or body.grammar or body.logprobs:
        raise APIError(400, "tools, response_format, grammar and logprobs are not supported with image chat yet",
                       code="unsupported")
    limit = max_tokens if max_tokens else min(served.n_ctx_slot, s.max_tokens_limit)
    kwargs = dict(messages=body.messages, max_tokens=limit, temperature=body.temperature, top_p=body.top_p,
                  top_k=body.top_k, min_p=body.min_p, typical_p=body.typical_p, repeat_penalty=body.repeat_penalty,
                  frequency_penalty=body.frequency_penalty or 0.0, presence_penalty=body.presence_penalty or 0.0,
                  seed=body.seed, stop=body.stop, model=body.model or served.alias)

    def make(_: int) -> Callable[[Any], Any]:
        # the speculative statistics of a Llama whose handler drafts on media prompts
        return lambda llama: collect_stats_stream(llama, iter(llama.create_chat_completion(stream=True, **kwargs)))

    group = await _submit(request, served, body.n, make, stream=body.stream)
    if body.stream:
        first = await _first(request, group)
        return _stream(request, group, first, lambda i, c: [_with_index(c, i)])
    parts = await _collect(request, group)
    out = [prompts.join_chat_chunks(parts[i]) for i in range(body.n)]
    return _merge_choices([_with_index(o, i) for i, o in enumerate(out)])


def _merge_choices(responses: list[dict[str, Any]]) -> dict[str, Any]:
    """One response holding every choice; usage summed (a prompt counted once per distinct prompt)."""
    first = dict(responses[0])
    if len(responses) == 1:
        return first
    first["choices"] = [c for r in responses for c in r["choices"]]
    usage = [r.get("usage") or {} for r in responses]
    completion = sum(u.get("completion_tokens", 0) for u in usage)
    prompt = usage[0].get("prompt_tokens", 0)
    first["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return first


# ------------------------------------------------------------------------------------------------
# the application
# ------------------------------------------------------------------------------------------------

def create_app(settings: Settings | None = None, server_settings: ServerSettings | None = None,
               model_settings: list[ModelSettings] | None = None) -> FastAPI:
    """The server application (upstream's signature). ``CONFIG_FILE`` in the environment wins."""
    config_file = os.environ.get("CONFIG_FILE")
    if config_file:
        cfg = load_config_file(config_file)
        server_settings = ServerSettings.model_validate(cfg.model_dump(exclude={"models"}))
        model_settings = cfg.models
    if server_settings is None and model_settings is None:
        settings = settings if settings is not None else Settings()
        server_settings = ServerSettings.model_validate(settings.model_dump(include=set(ServerSettings.model_fields)))
        model_settings = [ModelSettings.model_validate(settings.model_dump(include=set(ModelSettings.model_fields)))]
    if server_settings is None or not model_settings:
        raise ValueError("create_app needs server_settings and model_settings together (or settings)")
    registry = ModelRegistry(model_settings, interrupt_requests=server_settings.interrupt_requests)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not server_settings.lazy_load:
            await asyncio.to_thread(registry.load_all)
        try:
            yield
        finally:
            log.info("shutting down: waiting up to %.1f s for running requests", server_settings.shutdown_timeout)
            await asyncio.to_thread(registry.drain, server_settings.shutdown_timeout)
            await asyncio.to_thread(registry.close)
            log.info("models freed")

    app = FastAPI(title="llama.cpp Python API", version=__version__, root_path=server_settings.root_path,
                  lifespan=lifespan)
    app.state.server_settings = server_settings
    app.state.registry = registry
    install(app)
    _routes(app)
    app.add_middleware(BodyLimit, limit=server_settings.max_body_bytes)
    if server_settings.allow_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # outermost, so that preflight requests are answered before the body limit and the routes
        app.add_middleware(CORSMiddleware, allow_origins=server_settings.allow_origins, allow_methods=["*"],
                           allow_headers=["*"], allow_credentials="*" not in server_settings.allow_origins)
    return app


__all__ = ["BodyLimit", "SSEResponse", "as_api_error", "authenticate", "create_app", "load_config_file"]

"""The FastAPI application: assembled from the routers (:mod:`.routes`), the error handlers, the body
limit and CORS middleware, and the models' lifecycle.

``create_app(settings | server_settings + model_settings)`` as upstream (``CONFIG_FILE`` in the
environment names a config file). Models load in the app's lifespan; on shutdown (SIGTERM
through uvicorn) the engines stop accepting (503), running and queued requests get
``shutdown_timeout`` seconds to finish, the rest are cancelled, and the contexts are freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI

from .._version import __version__
from .errors import as_api_error, install
from .http import AccessLog, BodyLimit, SSEResponse, authenticate
from .metrics import KeyCounters
from .models import ModelRegistry
from .quotas import QuotaGate, Quotas, keys_of
from .response_store import ResponseStore
from .routes import ROUTERS
from .settings import ConfigFileSettings, ModelSettings, ServerSettings, Settings

log = logging.getLogger("llama_cpp.server")

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
    app.state.keys = KeyCounters()
    limits = keys_of(server_settings)
    app.state.api_keys = [k.encode() for k in limits]
    app.state.quotas = Quotas(limits)
    app.state.responses = ResponseStore(server_settings.responses_store_max,
                                        int(server_settings.responses_store_mb * (1 << 20)))
    install(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(BodyLimit, limit=server_settings.max_body_bytes)
    if app.state.quotas.limits:
        app.add_middleware(QuotaGate, quotas=app.state.quotas)
    app.add_middleware(AccessLog, keys=app.state.keys)  # outermost but CORS: a 413 or 429 is logged too
    if server_settings.allow_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # outermost, so that preflight requests are answered before the body limit and the routes
        app.add_middleware(CORSMiddleware, allow_origins=server_settings.allow_origins, allow_methods=["*"],
                           allow_headers=["*"], allow_credentials="*" not in server_settings.allow_origins)
    return app


__all__ = ["BodyLimit", "SSEResponse", "as_api_error", "authenticate", "create_app", "load_config_file"]

"""The routers: each handler module mounts on its own app (testable one by one), and the table the app
includes serves every route once."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient


def test_a_router_serves_on_an_app_of_its_own(server):
    from llama_cpp.server.errors import install
    from llama_cpp.server.routes import tokenize

    app = FastAPI()
    for name in ("server_settings", "registry", "keys", "api_keys"):
        setattr(app.state, name, getattr(server.app.state, name))
    install(app)
    app.include_router(tokenize.router)
    with TestClient(app) as client:
        tokens = client.post("/extras/tokenize", json={"model": "spm", "input": "hello"}).json()["tokens"]
        assert client.post("/extras/detokenize", json={"model": "spm", "tokens": tokens}).json()["text"].strip() == \
            "hello"
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 404  # not this router's


def test_the_route_table_serves_each_path_once(server):
    from llama_cpp.server.routes import ROUTERS

    seen = [(m, r.path) for router in ROUTERS for r in router.routes for m in r.methods]
    assert len(seen) == len(set(seen))
    paths = {p for _, p in seen}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
            "/v1/embeddings", "/v1/rerank", "/metrics", "/slots", "/props", "/health", "/v1/models"} <= paths
    schema = {p for r in ROUTERS for rt in r.routes if rt.include_in_schema for p in [rt.path]}
    assert schema <= set(server.app.openapi()["paths"])

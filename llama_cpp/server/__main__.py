"""``python -m llama_cpp.server --model PATH [--flag VALUE ...]`` or ``--config_file FILE``.

Every setting is a flag (``--n_ctx 4096``, ``--embedding true``) and an environment variable
(``N_CTX=4096``); ``HOST``/``PORT`` in the environment override the settings, as upstream.
SIGTERM or Ctrl-C stops accepting, lets running requests finish for ``shutdown_timeout``
seconds, cancels the rest and frees the models.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .cli import add_args_from_model, parse_model_from_args
from .settings import ModelSettings, ServerSettings, Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llama_cpp.server",
                                     description="An OpenAI-compatible server for llama.cpp models.")
    add_args_from_model(parser, Settings)
    parser.add_argument("--config_file", type=str, help="A JSON or YAML file with server settings and a list of "
                        "models (see ConfigFileSettings).")
    return parser


def parse_settings(argv: list[str] | None = None) -> tuple[ServerSettings, list[ModelSettings]]:
    from .app import load_config_file

    parser = build_parser()
    args = parser.parse_args(argv)
    config_file = os.environ.get("CONFIG_FILE", args.config_file)
    try:
        if config_file:
            cfg = load_config_file(config_file)
            return ServerSettings.model_validate(cfg.model_dump(exclude={"models"})), list(cfg.models)
        return parse_model_from_args(ServerSettings, args), [parse_model_from_args(ModelSettings, args)]
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server_settings, model_settings = parse_settings(argv)
    import uvicorn

    from .app import create_app

    os.environ.pop("CONFIG_FILE", None)  # already read: create_app must not read it again
    app = create_app(server_settings=server_settings, model_settings=model_settings)
    config = uvicorn.Config(
        app, host=os.getenv("HOST", server_settings.host), port=int(os.getenv("PORT", server_settings.port)),
        ssl_keyfile=server_settings.ssl_keyfile, ssl_certfile=server_settings.ssl_certfile,
        timeout_graceful_shutdown=int(server_settings.shutdown_timeout) + 1, log_level="info")
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        sys.exit(3)


if __name__ == "__main__":
    main()

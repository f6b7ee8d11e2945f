"""``ceiling serve``: run the sidecar proxy."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the sidecar proxy")
    serve.add_argument("--config", "-c", help="sidecar YAML file (or CEILING_CONFIG)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.config import load_settings
    from context_ceiling.sidecar.logs import configure
    from context_ceiling.sidecar.server import uvicorn_options

    settings = load_settings(args.config)
    if args.host:
        settings.listen.host = args.host
    if args.port is not None:
        settings.listen.port = args.port
    configure(settings.log_level)
    app = create_app(settings)
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = "asyncio"
    uvicorn.run(
        app,
        host=settings.listen.host,
        port=settings.listen.port,
        loop=loop,
        log_level=settings.log_level,
        **uvicorn_options(settings),
    )
    return 0

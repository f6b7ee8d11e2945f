"""The ``ceiling`` command: one subcommand per area (``serve``; the sweep and push join later).

Bad input exits 2 with one line that says what is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from sidecar.app import create_app
    from sidecar.config import ConfigError, load_settings
    from sidecar.logs import configure

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
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
        http="httptools",
        access_log=False,
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ceiling", description="Keep LLM requests under their measured context ceiling."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the sidecar proxy")
    serve.add_argument("--config", "-c", help="sidecar YAML file (or CEILING_CONFIG)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.set_defaults(func=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except UsageError as exc:
        print(f"ceiling {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

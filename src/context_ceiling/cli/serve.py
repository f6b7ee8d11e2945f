"""``ceiling serve``: run the sidecar proxy."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from context_ceiling.cli import add_json, print_json


def add_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the sidecar proxy",
        description="Run the sidecar proxy: point your SDK's base_url at it.",
    )
    serve.add_argument("--config", "-c", help="sidecar YAML file (or CEILING_CONFIG)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.add_argument(
        "--workers",
        type=_workers,
        help="override workers: worker processes behind the one port (default 1)",
    )
    serve.add_argument(
        "--check",
        action="store_true",
        help="load the config, its tokenizers and the ceilings file as serving would, print one "
        "line and exit (0: it would start; 2: it would not, and why)",
    )
    add_json(serve)
    serve.set_defaults(func=serve_command)


def _workers(value: str) -> int:
    n = int(value)
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError("must be between 1 and 64")
    return n


def serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.config import load_settings
    from context_ceiling.sidecar.observability.logs import configure
    from context_ceiling.sidecar.server import SidecarServer, uvicorn_options

    settings = load_settings(args.config)
    if args.host:
        settings.listen.host = args.host
    if args.port is not None:
        settings.listen.port = args.port
    if args.workers is not None:
        settings.workers = args.workers
    if args.check:
        return _check(settings, args.json)
    configure(settings.log_level)
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = "asyncio"
    if settings.workers > 1:
        from context_ceiling.sidecar.workers.supervisor import serve_workers

        return serve_workers(settings, loop)
    app = create_app(settings, freeze_heap=True)
    config = uvicorn.Config(
        app,
        host=settings.listen.host,
        port=settings.listen.port,
        loop=loop,
        log_level=settings.log_level,
        **uvicorn_options(settings),
    )
    server = SidecarServer(config)
    if settings.listen.admin_port is None:
        server.run()
    else:  # traffic and admin on their own sockets, one server
        from context_ceiling.sidecar.server import sockets_for

        server.run(sockets=sockets_for(config, settings.listen.admin_port))
    return 0


def _start_and_stop(settings: Any) -> None:
    """Build the app as ``serve`` does and run its lifespan's startup and shutdown (the ceilings
    file applied, the metrics set, the capture store and background tasks started): whatever
    would stop ``serve`` stops the check, with its message."""
    import asyncio
    from collections.abc import MutableMapping

    from context_ceiling.core.errors import UserError
    from context_ceiling.sidecar.app import create_app

    app = create_app(settings)
    events = iter(({"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}))
    failed: list[str] = []

    async def receive() -> dict[str, Any]:
        return next(events)

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"].endswith(".failed"):
            failed.append(str(message.get("message") or message["type"]))

    asyncio.run(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    if failed:
        raise UserError(f"the sidecar would not start: {failed[0]}")


def _notes(models: Any) -> list[str]:
    """What loads but will not count as it reads: a model entry of another family counted
    with an OpenAI encoding."""
    from context_ceiling.core.models import foreign_tokenizer

    notes = []
    for spec in models:
        family = foreign_tokenizer(spec)
        if family is not None:
            notes.append(
                f"model entry {spec.match!r} is counted with {spec.tokenizer.encoding}, an "
                f"OpenAI encoding, not {family} tokenizer: its counts are estimates (a third "
                "off on short prompts); set its tokenizer (kind: calibrated with a fitted "
                "factor, huggingface, or upstream; see the counting docs)"
            )
    return notes


def _check(settings: Any, as_json: bool = False) -> int:
    """What startup would load, without listening: the registry (tokenizer files), the
    ceilings file against that registry, the admin token file."""
    from context_ceiling.ceilings.document import CeilingsError, fit_problems, load_document
    from context_ceiling.core.models import Registry
    from context_ceiling.core.tokenizers import TiktokenCounter
    from context_ceiling.sidecar.config import admin_token

    registry = Registry(settings.models, None, settings.counting.bpe)
    bpe = TiktokenCounter("o200k_base", settings.counting.bpe).engine
    notes = _notes(settings.models)
    for note in notes:
        print(f"ceiling serve --check: note: {note}", file=sys.stderr)
    admin = admin_token(settings)
    ceilings = "no ceilings file"
    version: int | None = None
    entries = 0
    if settings.ceilings_file is not None and settings.ceilings_file.exists():
        doc = load_document(settings.ceilings_file)
        problems = fit_problems(doc, {s.metric_label: s.window for s in registry.specs})
        if problems:
            raise CeilingsError(str(settings.ceilings_file), problems)
        ceilings = f"ceilings version {doc.version} ({len(doc.entries)} entries)"
        version, entries = doc.version, len(doc.entries)
    _start_and_stop(settings)  # exactly what serve runs on start, without listening
    capture = "capture off"
    store = None
    if settings.capture.enabled:
        from context_ceiling.core.capture import CaptureStore
        from context_ceiling.sidecar.capture.writer import hostname_path

        path = hostname_path(settings.capture.store)
        CaptureStore.open(path, create=True).close()
        capture = f"capture on ({path})"
        store = str(path)
    if as_json:
        print_json(
            {
                "ok": True,
                "models": len(registry.specs),
                "workloads": list(settings.workloads),
                "mode": str(settings.enforcement.mode),
                "ceilings_file": str(settings.ceilings_file) if settings.ceilings_file else None,
                "ceilings_version": version,
                "ceilings_entries": entries,
                "admin_api": bool(admin),
                "capture_store": store,
                "workers": settings.workers,
                "bpe": str(bpe),
                "notes": notes,
            }
        )
        return 0
    print(
        f"config ok: {len(registry.specs)} models, {len(settings.workloads)} workloads, "
        f"mode {settings.enforcement.mode}, {ceilings}, admin API {'on' if admin else 'off'}, "
        f"{capture}, {settings.workers} worker{'s' if settings.workers > 1 else ''}, "
        f"bpe {bpe}"
    )
    return 0

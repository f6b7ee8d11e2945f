"""The ``ceiling`` command: one subcommand per area (``serve``; the sweep and push join later).

Bad input exits 2 with one line that says what is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from context_ceiling.core.ceilings import CeilingsError
    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.config import ConfigError, load_settings
    from context_ceiling.sidecar.logs import configure
    from context_ceiling.sidecar.server import uvicorn_options

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    if args.host:
        settings.listen.host = args.host
    if args.port is not None:
        settings.listen.port = args.port
    configure(settings.log_level)
    try:
        app = create_app(settings)
    except (CeilingsError, ConfigError) as exc:
        raise UsageError(str(exc)) from exc
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


def _push(args: argparse.Namespace) -> int:
    from context_ceiling.core.ceilings import CeilingsError
    from context_ceiling.core.push import PushError, push

    if not args.to and not args.file and not args.to_configmap:
        raise UsageError(
            "say where to push: --to URL (a sidecar), --file PATH and/or --to-configmap NAME"
        )
    try:
        lines = push(
            args.document,
            args.to or [],
            args.file,
            configmap=args.to_configmap,
            namespace=args.namespace,
            dry_run=args.dry_run,
            force=args.force,
        )
    except CeilingsError as exc:
        raise UsageError(str(exc)) from exc
    except PushError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def _ceilings(args: argparse.Namespace) -> int:
    import json

    from context_ceiling.core.ceilings import CeilingsError, json_schema, load_document

    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    try:
        doc = load_document(args.path)
    except CeilingsError as exc:
        raise UsageError(str(exc)) from exc
    print(f"{args.path}: valid, version {doc.version}, {len(doc.entries)} entries")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ceiling", description="Keep LLM requests under their measured context ceiling."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser("serve", help="run the sidecar proxy")
    serve.add_argument("--config", "-c", help="sidecar YAML file (or CEILING_CONFIG)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.set_defaults(func=_serve)

    p = sub.add_parser("push", help="push a ceilings document to sidecars (admin API) or a file")
    p.add_argument("document", help="ceilings document (YAML or JSON)")
    p.add_argument("--to", action="append", metavar="URL", help="sidecar base URL; repeat for many")
    p.add_argument(
        "--file",
        metavar="PATH",
        help="write the document here atomically (e.g. a ConfigMap checkout)",
    )
    p.add_argument(
        "--to-configmap",
        metavar="NAME[/KEY]",
        help="update this ConfigMap (key ceilings.yaml) with the pod's service account",
    )
    p.add_argument("--namespace", help="the ConfigMap's namespace (default: the pod's)")
    p.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    p.add_argument("--force", action="store_true", help="apply even if the version is not newer")
    p.set_defaults(func=_push)

    from context_ceiling.cli.sweep import add_parsers

    add_parsers(sub, cli=main)

    c = sub.add_parser(
        "ceilings", help="the ceilings document: validate a file, print the JSON Schema"
    )
    c_sub = c.add_subparsers(dest="action", required=True)
    c_sub.add_parser("schema", help="print the JSON Schema of the ceilings document")
    v = c_sub.add_parser("validate", help="validate a ceilings document")
    v.add_argument("path")
    c.set_defaults(func=_ceilings)
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

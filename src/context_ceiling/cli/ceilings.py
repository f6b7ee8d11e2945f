"""``ceiling ceilings``: the ceilings document on its own (validate a file, alone or against a
sidecar config; print its schema)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from context_ceiling.cli import add_json, print_json

if TYPE_CHECKING:
    from context_ceiling.ceilings.document import CeilingsDocument


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "ceilings", help="the ceilings document: validate a file, print the JSON Schema"
    )
    c_sub = c.add_subparsers(dest="action", required=True)
    c_sub.add_parser("schema", help="print the JSON Schema of the ceilings document")
    v = c_sub.add_parser(
        "validate",
        help="validate a ceilings document (with --config: as that sidecar would at startup)",
    )
    v.add_argument("path", help="the ceilings document (YAML or JSON)")
    v.add_argument(
        "--config",
        "-c",
        metavar="SIDECAR_YAML",
        help="also check it against this sidecar config: windows against its model registry, "
        "models and workloads it does not know (offline; the admin API's checks but the version)",
    )
    v.add_argument(
        "--strict",
        action="store_true",
        help="with --config: entries that would enforce nothing are an error (exit 2)",
    )
    add_json(v)
    c.set_defaults(func=ceilings_command)


def ceilings_command(args: argparse.Namespace) -> int:
    from context_ceiling.ceilings.document import (
        CeilingsError,
        json_schema,
        load_document,
    )

    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    doc = load_document(args.path)
    result: dict[str, Any] = {
        "path": args.path,
        "valid": True,
        "version": doc.version,
        "entries": len(doc.entries),
    }
    if not args.config:
        if args.json:
            print_json(result)
        else:
            print(f"{args.path}: valid, version {doc.version}, {len(doc.entries)} entries")
        return 0
    notes = against_config(doc, args.path, args.config)
    if args.strict and notes:
        raise CeilingsError(f"{args.path} against {args.config} (strict)", notes)
    if args.json:
        print_json(
            result
            | {"config": args.config, "in_use": len(doc.entries) - len(notes), "notes": notes}
        )
        return 0
    print(
        f"{args.path}: valid against {args.config}, version {doc.version}, "
        f"{len(doc.entries) - len(notes)} of {len(doc.entries)} entries in use"
    )
    for n in notes:
        print(f"  warning: {n}")
    return 0


def against_config(doc: CeilingsDocument, path: str, config: str) -> list[str]:
    """A document checked against a sidecar config as that sidecar would at startup: raises
    :class:`CeilingsError` for what it would refuse (a window the registry disagrees with, a
    ceiling above it); returns why each entry would enforce nothing there."""
    from context_ceiling.ceilings.document import CeilingsError, fit_problems, unused_entries
    from context_ceiling.sidecar.config import load_settings

    settings = load_settings(config)
    windows = {s.metric_label: s.window for s in settings.models}
    problems = fit_problems(doc, windows)
    if problems:
        raise CeilingsError(f"{path} against {config}", problems)
    return unused_entries(doc, windows, settings.workloads)

"""``ceiling ceilings``: the ceilings document on its own (validate a file, alone or against a
sidecar config; print its schema)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from context_ceiling.cli import add_json, print_json


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
        fit_problems,
        json_schema,
        load_document,
        unused_entries,
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
    from context_ceiling.sidecar.config import load_settings

    settings = load_settings(args.config)
    windows = {s.metric_label: s.window for s in settings.models}
    problems = fit_problems(doc, windows)
    if problems:
        raise CeilingsError(f"{args.path} against {args.config}", problems)
    notes = unused_entries(doc, windows, settings.workloads)
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

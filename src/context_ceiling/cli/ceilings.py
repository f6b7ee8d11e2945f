"""``ceiling ceilings``: the ceilings document on its own (validate a file, print its schema)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "ceilings", help="the ceilings document: validate a file, print the JSON Schema"
    )
    c_sub = c.add_subparsers(dest="action", required=True)
    c_sub.add_parser("schema", help="print the JSON Schema of the ceilings document")
    v = c_sub.add_parser("validate", help="validate a ceilings document")
    v.add_argument("path")
    c.set_defaults(func=ceilings_command)


def ceilings_command(args: argparse.Namespace) -> int:
    from context_ceiling.core.ceilings import json_schema, load_document

    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    doc = load_document(args.path)
    print(f"{args.path}: valid, version {doc.version}, {len(doc.entries)} entries")
    return 0

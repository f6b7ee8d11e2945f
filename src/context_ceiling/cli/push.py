"""``ceiling push``: a ceilings document to running sidecars, a file and/or a ConfigMap."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from context_ceiling.cli import add_json, add_kube, print_json
from context_ceiling.core.errors import UserError


def add_parser(sub: Any) -> None:
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
        help="update this ConfigMap (key ceilings.yaml) as the kubeconfig says, or in a pod with "
        "its service account",
    )
    add_kube(p)
    p.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    p.add_argument("--force", action="store_true", help="apply even if the version is not newer")
    p.add_argument(
        "--config",
        "-c",
        metavar="SIDECAR_YAML",
        help="refuse, before any target is touched, a document this sidecar config's registry "
        "would refuse at startup (a window it disagrees with, a ceiling above it): use it with "
        "--to-configmap and --file, whose readers are pods that start later",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a document with entries that would enforce nothing (no model label or "
        "workload matches them): sidecars refuse it, and with --config nothing is touched",
    )
    add_json(p)
    p.set_defaults(func=push_command)


def push_command(args: argparse.Namespace) -> int:
    from context_ceiling.ceilings.push import PushError, push

    if not args.to and not args.file and not args.to_configmap:
        raise UserError(
            "say where to push: --to URL (a sidecar), --file PATH and/or --to-configmap NAME"
        )
    if args.config:
        from context_ceiling.ceilings.document import CeilingsError, load_document
        from context_ceiling.cli.ceilings import against_config

        unused = against_config(load_document(args.document), args.document, args.config)
        if args.strict and unused:
            raise CeilingsError(f"{args.document} against {args.config} (strict)", unused)
        for u in unused:
            print(f"ceiling push: warning: {u}", file=sys.stderr)
    try:
        lines = push(
            args.document,
            args.to or [],
            args.file,
            configmap=args.to_configmap,
            namespace=args.namespace,
            kubeconfig=args.kubeconfig,
            context=args.context,
            dry_run=args.dry_run,
            force=args.force,
            strict=args.strict,
        )
    except PushError as exc:
        if args.json:
            print_json({"ok": False, "dry_run": args.dry_run, "targets": _by_target(str(exc))})
            exc.reported = True  # its JSON is out: main prints no second object
        raise
    if args.json:
        print_json({"ok": True, "dry_run": args.dry_run, "targets": _by_target("\n".join(lines))})
    else:
        print("\n".join(lines))
    return 0


def _by_target(report: str) -> list[dict[str, Any]]:
    """The report's lines as one object per target line (``TARGET: what happened``), each with
    the entry changes printed under it."""
    out: list[dict[str, Any]] = []
    for line in report.splitlines():
        if line.startswith("  ") and out:
            out[-1]["changes"].append(line.strip())
            continue
        target, _, message = line.partition(": ")
        out.append({"target": target, "message": message, "changes": []})
    return out

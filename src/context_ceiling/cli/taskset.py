"""``ceiling taskset``: task sets from captured traffic: build, label (export / import), and
reference answers (the model's own, with only the evidence in context)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from context_ceiling.cli import add_json, options, print_json
from context_ceiling.core.errors import UserError
from context_ceiling.sweep.labelling import export, import_labels
from context_ceiling.sweep.traffic import BuildOptions, build, reference


def add_parser(sub: Any) -> None:
    t = sub.add_parser("taskset", help="task sets from captured traffic: build, label, reference")
    s = t.add_subparsers(dest="action", required=True)
    b = s.add_parser("build", help="build a task set from capture stores")
    b.add_argument(
        "--capture",
        dest="captures",
        action="append",
        required=True,
        metavar="STORE",
        help="a capture store (or a folder of them, one per replica); repeat for more",
    )
    b.add_argument("--out", required=True, help="the task set directory to write")
    b.add_argument("--name", help="the task set's name (default: the directory's)")
    b.add_argument(
        "--workload",
        dest="workloads",
        action="append",
        default=[],
        help="only this workload's captures; repeat for more (default: all)",
    )
    b.add_argument("--tolerance", type=float, default=0.05, help="what the sweep must resolve")
    b.add_argument("--repeats", type=int, default=3, help="the repeats the sweep will make")
    b.add_argument(
        "--min-items",
        type=int,
        help="the items the build must yield (default: what the tolerance needs)",
    )
    b.add_argument("--max-items", type=int, help="at most this many items (default: all)")
    b.add_argument(
        "--near-duplicate",
        type=float,
        default=0.8,
        help="word-set similarity from which two questions are merged",
    )
    b.add_argument("--seed", type=int, default=0, help="seeds the draw of items")
    add_json(b)
    e = s.add_parser("export", help="write items for labelling (.jsonl or .csv)")
    e.add_argument("taskset", help="the task set directory")
    e.add_argument("--out", required=True, help="labels.jsonl or labels.csv")
    i = s.add_parser("import", help="apply labels (exact / set / json) to a task set")
    i.add_argument("taskset", help="the task set directory")
    i.add_argument("labels", help="the labelled .jsonl or .csv")
    c = s.add_parser(
        "convert",
        help="write a task set directory from an evaluation task: inspect:FILE.py@TASK or "
        "records:FILE.jsonl (question / evidence / answer)",
    )
    c.add_argument("source", help="inspect:FILE.py@TASK, inspect:module@TASK or records:FILE")
    c.add_argument("--out", required=True, help="the task set directory to write")
    add_json(c)
    r = s.add_parser(
        "reference",
        help="make each unlabelled item's gold the model's answer with only its evidence",
    )
    r.add_argument("taskset", help="the task set directory")
    r.add_argument("--base-url", required=True, help="the model's API base URL")
    r.add_argument("--model", required=True, help="model name sent upstream")
    r.add_argument("--api", choices=("openai", "anthropic"), default="openai", help="the API style")
    r.add_argument("--max-tokens", type=int, default=200, help="output reservation per call")
    r.add_argument("--concurrency", type=int, default=4, help="calls in flight at once")
    t.set_defaults(func=taskset_command)


def taskset_command(args: argparse.Namespace) -> int:
    if args.action == "build":
        rep = build(options(BuildOptions, args))
        if args.json:
            print_json({"taskset": args.out} | dataclasses.asdict(rep))
            return 0
        print("\n".join(rep.lines()))
        print(
            f"{args.out}: {rep.items} items, unlabelled (graded as agreement with the answer "
            "production gave); next: ceiling taskset reference (the swept model's own "
            "evidence-only answers) and/or export / import labels"
        )
        return 0
    if args.action == "convert":
        from context_ceiling.sweep.external import PREFIXES, open_taskset, write_out

        if not args.source.startswith(PREFIXES):
            raise UserError(f"{args.source}: say what it is: {' or '.join(PREFIXES)}...")
        ts = open_taskset(args.source)
        write_out(ts, args.out)
        if args.json:
            print_json(
                {"taskset": args.out, "items": len(ts.items), "documents": len(ts.docs)}
                | {"metric": ts.metric, "hash": ts.hash}
            )
            return 0
        print(
            f"{args.out}: {len(ts.items)} items, {len(ts.docs)} evidence documents from "
            f"{args.source} (sweep it with --taskset {args.out}, or with the spec itself)"
        )
        return 0
    if args.action == "export":
        n = export(args.taskset, args.out)
        print(f"{args.out}: {n} items to label (answer_kind: exact, set or json; answer)")
        return 0
    if args.action == "import":
        labelled, total = import_labels(args.taskset, args.labels)
        print(
            f"{args.taskset}: {labelled} of {total} items labelled (graded as accuracy); "
            f"{total - labelled} unlabelled (graded as agreement)"
        )
        return 0
    from context_ceiling.sweep.solver import Endpoint

    ep = Endpoint(
        base_url=args.base_url,
        api=args.api,
        model=args.model,
        api_key=os.environ.get("OPENAI_API_KEY") or os.environ.get("ANTHROPIC_API_KEY"),
        max_tokens=args.max_tokens,
    )
    got, asked = reference(args.taskset, ep, args.concurrency)
    print(
        f"{args.taskset}: {got} of {asked} unlabelled items now agree-graded against "
        f"{args.model}'s evidence-only answer"
        + (f" ({asked - got} gave no answer: they keep the captured one)" if got < asked else "")
    )
    return 0

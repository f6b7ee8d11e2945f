"""``ceiling sweep run | derive | merge | report | job``: the arguments, and dispatch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from context_ceiling.sweep.job import JobError
from context_ceiling.sweep.results import SweepUsageError, derive, merge, report
from context_ceiling.sweep.run import run
from context_ceiling.sweep.taskset import TaskSetError


def add_parsers(sub: Any, cli: Callable[[Sequence[str]], int]) -> None:
    """``cli``: the ``ceiling`` entry point, which the Kubernetes sweep job runs its steps with
    (passed in by the command line that assembles the product: the sweep never imports it)."""
    sw = sub.add_parser("sweep", help="measure the usable context of a model on a workload")
    s = sw.add_subparsers(dest="action", required=True)
    r = s.add_parser("run", help="run (or --resume) a sweep")
    r.add_argument("--base-url", help="OpenAI-style base URL (with /v1) or Anthropic base URL")
    r.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    r.add_argument("--model", help="model name sent upstream")
    r.add_argument(
        "--api-key-env",
        help="env var holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY)",
    )
    r.add_argument("--taskset", default="contracts", help="bundled name or a task set directory")
    r.add_argument(
        "--items",
        type=int,
        help="items drawn (seeded) from the task set (default: as many as --tolerance needs, "
        "started at half and added adaptively where the decision is open)",
    )
    r.add_argument(
        "--levels",
        default="0.2,0.5,0.8,max",
        help="utilization levels; 'max' = the practical limit",
    )
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument(
        "--window", default="auto", help="context window in tokens, or auto (llama.cpp /props)"
    )
    r.add_argument(
        "--tokenizer", default="auto", choices=["auto", "engine", "o200k_base", "cl100k_base"]
    )
    r.add_argument(
        "--tokenize-url",
        help="the engine's root URL for /tokenize when --base-url is a sidecar or proxy",
    )
    r.add_argument("--max-tokens", type=int, default=100, help="output reservation per call")
    r.add_argument("--concurrency", type=int, default=1)
    r.add_argument(
        "--shared-haystack",
        action="store_true",
        help="many items' evidence in one haystack per level",
    )
    r.add_argument("--no-control", action="store_true", help="skip the closed-book control calls")
    r.add_argument("--max-calls", type=int)
    r.add_argument("--max-input-tokens", type=int, help="token budget for the whole run")
    r.add_argument(
        "--refine",
        action=argparse.BooleanOptionalAction,
        help="measure midpoints where accuracy drops (default on, except per shard)",
    )
    r.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        help="add items where the decision is still open (default on, except per shard)",
    )
    r.add_argument(
        "--low-fill",
        type=float,
        default=0.1,
        help="a control level below the reference, to see a drop that starts before it (0: none)",
    )
    r.add_argument(
        "--reasoning",
        choices=["auto", "off", "openai", "anthropic"],
        default="auto",
        help="reasoning models: openai = max_completion_tokens and no temperature, anthropic = "
        "extended thinking; auto switches to the openai form when the upstream refuses max_tokens "
        "or temperature",
    )
    r.add_argument(
        "--reasoning-tokens",
        type=int,
        default=0,
        help="reasoning reservation on top of --max-tokens (thinking budget for anthropic)",
    )
    r.add_argument("--tolerance", type=float, default=0.05)
    r.add_argument("--margin", type=float, default=0.1)
    r.add_argument("--resolution", type=float, default=0.05)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--bypass",
        action="store_true",
        help="going through a sidecar: send x-ceiling-bypass (CEILING_ADMIN_TOKEN)",
    )
    r.add_argument(
        "--no-json-mode", action="store_true", help="do not ask for response_format json_object"
    )
    r.add_argument("--out", help="run directory (default runs/<run id>)")
    r.add_argument(
        "--resume", action="store_true", help="continue the run in --out, skipping logged calls"
    )
    r.add_argument("--dry-run", action="store_true", help="print calls and tokens, spend nothing")
    r.add_argument(
        "--reduced",
        action="store_true",
        help="regression check against --baseline (its items, as many as the tolerance needs; 3 levels, 3 repeats)",
    )
    r.add_argument("--baseline", help="the stored run a --reduced sweep is paired against")
    r.add_argument(
        "--shard",
        help="i/n: run only haystack groups with index %% n == i (Kubernetes Indexed Job)",
    )
    r.add_argument("--no-progress", action="store_true")
    d = s.add_parser("derive", help="turn a run into a ceilings document entry")
    d.add_argument("run", help="run directory")
    d.add_argument("--model", required=True, help="the sidecar registry label of the model")
    d.add_argument("--workload", default="default")
    d.add_argument("--tolerance", type=float)
    d.add_argument("--margin", type=float)
    d.add_argument(
        "--merge", help="an existing ceilings document to add the entry to (version + 1)"
    )
    d.add_argument(
        "--min-accuracy",
        type=float,
        help="the accuracy floor the reference must reach (default 0.5)",
    )
    d.add_argument(
        "--accept-unresolved",
        action="store_true",
        help="write the ceiling although its deciding interval is wider than the tolerance "
        "(the provenance records it)",
    )
    d.add_argument(
        "--force",
        action="store_true",
        help="for demonstrations only: write the ceiling despite every refusal (each one is "
        "recorded in the provenance); never for a ceiling you enforce",
    )
    d.add_argument(
        "--include-closed-book",
        action="store_true",
        help="score items the model answers with no documents (left out by default)",
    )
    d.add_argument("--out", help="where to write the document (default RUN/ceilings.yaml)")
    d.add_argument(
        "--mode",
        choices=["off", "observe", "enforce"],
        help="the entry's mode (overrides the sidecar's)",
    )
    m = s.add_parser("merge", help="merge shard runs into one run directory and report it")
    m.add_argument("out", help="the merged run directory")
    m.add_argument("shards", nargs="+", help="shard run directories")
    from context_ceiling.sweep import job

    job.add_parser(s)
    p = s.add_parser("report", help="(re)write a run's report")
    p.add_argument("run")
    sw.set_defaults(func=main, cli=cli)


def main(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        if args.action == "run":
            return run(args, console)
        if args.action == "derive":
            return derive(args, console)
        if args.action == "merge":
            return merge(args, console)
        if args.action == "job":
            from context_ceiling.sweep import job

            return job.run(args, console, args.cli)
        return report(Path(args.run), console)
    except (SweepUsageError, TaskSetError, JobError) as exc:
        print(f"ceiling sweep {args.action}: {exc}", file=sys.stderr)
        return 2

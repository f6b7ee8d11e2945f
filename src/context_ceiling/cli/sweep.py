"""``ceiling sweep run | derive | merge | report | job``: the arguments, and dispatch to the
sweep's functions with typed options (the defaults are the options classes' own)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from context_ceiling.cli import Parser, add_json, add_kube, add_model_arguments, options
from context_ceiling.core.vocabulary import MODES
from context_ceiling.sweep.derive import DeriveOptions, derive
from context_ceiling.sweep.job import JobOptions, run_job
from context_ceiling.sweep.merge import merge
from context_ceiling.sweep.report import report
from context_ceiling.sweep.run import RunOptions, run


def add_parser(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="measure the usable context of a model on a workload")
    s = sw.add_subparsers(dest="action", required=True)
    r = s.add_parser("run", help="run (or --resume) a sweep")
    add_run_arguments(r)
    add_json(r)
    d = s.add_parser("derive", help="turn a run into a ceilings document entry")
    d.add_argument("run", help="run directory")
    d.add_argument("--model", required=True, help="the sidecar registry label of the model")
    d.add_argument("--workload", default="default", help="the workload the ceiling is for")
    d.add_argument(
        "--tolerance",
        type=float,
        help="largest accuracy drop from the reference that still passes (default: the run's)",
    )
    d.add_argument(
        "--margin",
        type=float,
        help="share of the passing fill held back below it (default: the run's)",
    )
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
        choices=MODES,
        help="the entry's mode (overrides the sidecar's)",
    )
    add_json(d)
    m = s.add_parser("merge", help="merge shard runs into one run directory and report it")
    m.add_argument("out", help="the merged run directory")
    m.add_argument("shards", nargs="+", help="shard run directories")
    _add_job_parser(s)
    p = s.add_parser("report", help="(re)write a run's report")
    p.add_argument("run", help="run directory")
    add_json(p)
    sw.set_defaults(func=sweep_command)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``sweep run`` (the job parses its run arguments with them too),
    generated from :class:`~context_ceiling.sweep.run.RunOptions`: names, types, defaults and
    help are the options model's own."""
    add_model_arguments(p, RunOptions)


def _add_job_parser(s: Any) -> None:
    j = s.add_parser(
        "job",
        help="one pod of an Indexed Job: run a shard; the last to finish merges, derives, updates",
        description="Run after '--' the same arguments as 'ceiling sweep run' (without --out, "
        "--shard, --resume).",
    )
    j.add_argument("--root", required=True, help="the volume every shard pod mounts")
    j.add_argument(
        "--run-id",
        default=os.environ.get("JOB_NAME"),
        help="one directory per sweep under --root (default $JOB_NAME: the Job's name)",
    )
    j.add_argument(
        "--index",
        type=int,
        default=_env_int("JOB_COMPLETION_INDEX"),
        help="this pod's shard (default $JOB_COMPLETION_INDEX)",
    )
    j.add_argument("--shards", type=int, required=True, help="the Job's completions")
    j.add_argument("--model-label", required=True, help="the sidecar registry label to derive for")
    j.add_argument("--workload", default="default", help="the workload the ceiling is for")
    j.add_argument("--mode", choices=MODES, help="the entry's mode (overrides the sidecar's)")
    j.add_argument(
        "--configmap",
        metavar="NAME[/KEY]",
        help="update this ceilings ConfigMap (service account: get + patch on it)",
    )
    add_kube(j)
    j.add_argument(
        "--accept-unresolved",
        action="store_true",
        help="derive even when the deciding interval is wider than the tolerance",
    )
    j.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then 'sweep run' arguments")


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v and v.isdigit() else None


def sweep_command(args: argparse.Namespace) -> int:
    if getattr(args, "json", False):  # stdout carries the JSON result alone
        console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 160)
    else:
        console = Console(width=None if sys.stdout.isatty() else 160)
    if args.action == "run":
        return run(options(RunOptions, args), console)
    if args.action == "derive":
        return derive(options(DeriveOptions, args), console)
    if args.action == "merge":
        return merge(Path(args.out), [Path(d) for d in args.shards], console)
    if args.action == "job":
        run_parser = Parser(prog="ceiling sweep job -- (sweep run arguments)")
        add_run_arguments(run_parser)
        run_args = run_parser.parse_args([a for a in args.run_args or [] if a != "--"])
        return run_job(
            options(JobOptions, args),
            options(RunOptions, run_args),
            console,
        )
    return report(Path(args.run), console, args.json)

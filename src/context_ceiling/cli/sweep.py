"""``ceiling sweep run | derive | merge | report | job``: the arguments, and dispatch to the
sweep's functions with typed options (the defaults are the options classes' own)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from context_ceiling.cli import Parser, add_json, add_kube, options
from context_ceiling.core.vocabulary import MODES
from context_ceiling.formats import SWEEP_APIS
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
    """The arguments of ``sweep run`` (the job parses its run arguments with them too)."""
    p.add_argument("--base-url", help="OpenAI-style base URL (with /v1) or Anthropic base URL")
    p.add_argument("--api", choices=list(SWEEP_APIS), help="the upstream's API style")
    p.add_argument("--model", help="model name sent upstream")
    p.add_argument(
        "--api-key-env",
        help="env var holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY)",
    )
    p.add_argument(
        "--taskset",
        help="bundled name, a task set directory, inspect:FILE.py@TASK (an inspect_ai task) or "
        "records:FILE.jsonl (question / evidence / answer)",
    )
    p.add_argument(
        "--items",
        type=int,
        help="items drawn (seeded) from the task set (default: as many as --tolerance needs, "
        "started at half and added adaptively where the decision is open)",
    )
    p.add_argument(
        "--levels",
        help="utilization levels; 'max' = the practical limit",
    )
    p.add_argument("--repeats", type=int, help="calls per item and level")
    p.add_argument(
        "--window",
        help="context window in tokens, or auto: a llama.cpp server's own, else the model's "
        "advertised window in the price data set",
    )
    p.add_argument(
        "--tokenizer",
        choices=["auto", "engine", "o200k_base", "cl100k_base"],
        help="how fill is counted: engine = the server's /tokenize; auto = engine when it answers",
    )
    p.add_argument(
        "--tokenize-url",
        help="the engine's root URL for /tokenize when --base-url is a sidecar or proxy",
    )
    p.add_argument("--max-tokens", type=int, help="output reservation per call")
    p.add_argument("--concurrency", type=int, help="calls in flight at once")
    p.add_argument(
        "--shared-haystack",
        action="store_true",
        help="many items' evidence in one haystack per level",
    )
    p.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="skip the closed-book control calls",
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help="send each step's calls through the provider's batch API (OpenAI Batch, Anthropic "
        "Message Batches): half the price, results within 24 hours; --resume waits on batches "
        "already sent",
    )
    p.add_argument(
        "--batch-poll",
        type=float,
        dest="batch_poll_s",
        metavar="SECONDS",
        help="how often a batch's status is read (default 30)",
    )
    p.add_argument("--max-calls", type=int, help="stop starting calls after this many")
    p.add_argument("--max-input-tokens", type=int, help="token budget for the whole run")
    p.add_argument(
        "--price",
        metavar="IN,OUT[,CACHED]",
        help="dollars per million input, output (and cached input) tokens; 0 for a self-hosted "
        "model (default: the model's list price from the genai-prices data set)",
    )
    p.add_argument(
        "--budget-usd",
        type=float,
        help="a hard cap on the run's dollars: no call starts that would cross it (the adaptive "
        "design stops adding items; the decision may stay open)",
    )
    p.add_argument(
        "--refine",
        action=argparse.BooleanOptionalAction,
        help="measure midpoints where accuracy drops (default on, except per shard)",
    )
    p.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        help="add items where the decision is still open (default on, except per shard)",
    )
    p.add_argument(
        "--low-fill",
        type=float,
        help="a control level below the reference, to see a drop that starts before it (0: none)",
    )
    p.add_argument(
        "--reasoning",
        choices=["auto", "off", "openai", "anthropic"],
        help="reasoning models: openai = max_completion_tokens and no temperature, anthropic = "
        "extended thinking; auto switches to the openai form when the upstream refuses max_tokens "
        "or temperature",
    )
    p.add_argument(
        "--reasoning-tokens",
        type=int,
        help="reasoning reservation on top of --max-tokens (thinking budget for anthropic)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        help="largest accuracy drop from the reference that still passes; sizes the sweep",
    )
    p.add_argument("--margin", type=float, help="share of the passing fill held back below it")
    p.add_argument(
        "--resolution",
        type=float,
        help="smallest gap in utilization the refinement between levels measures",
    )
    p.add_argument("--seed", type=int, help="seeds the item draw, the haystacks and the calls")
    p.add_argument(
        "--bypass",
        action="store_true",
        help="going through a sidecar: send x-ceiling-bypass (CEILING_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--no-json-mode",
        dest="json_mode",
        action="store_false",
        help="do not ask for response_format json_object",
    )
    p.add_argument("--out", help="run directory (default runs/<run id>)")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out, skipping logged calls"
    )
    p.add_argument("--dry-run", action="store_true", help="print calls and tokens, spend nothing")
    p.add_argument(
        "--reduced",
        action="store_true",
        help="regression check against --baseline (its items, as many as the tolerance needs; 3 levels, 3 repeats)",
    )
    p.add_argument("--baseline", help="the stored run a --reduced sweep is paired against")
    p.add_argument(
        "--shard",
        help="i/n: run only haystack groups with index %% n == i (Kubernetes Indexed Job)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress bar (a line per step is still printed)",
    )
    p.set_defaults(**{f.name: f.default for f in dataclasses.fields(RunOptions)})


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

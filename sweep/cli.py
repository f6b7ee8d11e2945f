"""``ceiling sweep run | derive | report``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ceiling.ceilings import CeilingsError, dump_document, load_document, write_atomically
from ceiling.engine import SyncEngine
from ceiling.models import ChatFormat, UpstreamSpec
from ceiling.tokenizers import TiktokenCounter
from ceiling.utilization import practical_limit
from sweep.analysis import analyse, refinements
from sweep.context import ContextBuilder, Meter, group_items
from sweep.derive import DeriveError, entry_from, merged
from sweep.job import JobError
from sweep.regression import compare, reduced_levels
from sweep.report import write
from sweep.runner import Budget, CallLog, Endpoint, Runner
from sweep.taskset import TaskSetError, load_taskset


class SweepUsageError(Exception):
    """One line for the user; exit status 2."""


def add_parsers(sub: Any) -> None:
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
        help="items drawn (seeded) from the task set (default 30; 10 with --reduced)",
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
    r.add_argument("--refine", action="store_true", help="measure midpoints where accuracy drops")
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
        help="regression check against --baseline (10 items, 3 levels, 3 repeats)",
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
    d.add_argument("--out", help="where to write the document (default RUN/ceilings.yaml)")
    d.add_argument(
        "--mode",
        choices=["off", "observe", "enforce"],
        help="the entry's mode (overrides the sidecar's)",
    )
    m = s.add_parser("merge", help="merge shard runs into one run directory and report it")
    m.add_argument("out", help="the merged run directory")
    m.add_argument("shards", nargs="+", help="shard run directories")
    from sweep import job

    job.add_parser(s)
    p = s.add_parser("report", help="(re)write a run's report")
    p.add_argument("run")
    sw.set_defaults(func=main)


def _root(base_url: str) -> str:
    u = base_url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def _window(arg: str, base_url: str) -> int:
    if arg != "auto":
        try:
            return int(arg)
        except ValueError as exc:
            raise SweepUsageError(
                f"--window must be a number of tokens or auto, not {arg!r}"
            ) from exc
    try:
        props = httpx.get(_root(base_url) + "/props", timeout=10, trust_env=False).json()
        return int(props["default_generation_settings"]["n_ctx"])
    except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
        raise SweepUsageError(
            "--window auto needs a llama.cpp server (/props); pass --window N"
        ) from exc


def _meter(kind: str, base_url: str, console: Console) -> Meter:
    if kind in ("auto", "engine"):
        engine = SyncEngine(UpstreamSpec(kind="upstream", url=_root(base_url), style="llamacpp"))
        try:
            engine.count("probe")
            return Meter(TiktokenCounter("o200k_base"), ChatFormat(), engine)
        except Exception as exc:
            engine.close()
            if kind == "engine":
                raise SweepUsageError(
                    f"--tokenizer engine: {_root(base_url)}/tokenize is not usable ({exc})"
                ) from exc
            console.print(
                f"[yellow]note:[/] {_root(base_url)} has no /tokenize: counting with o200k_base, an "
                "estimate for other models (pass --tokenize-url ENGINE or --tokenizer)"
            )
    return Meter(TiktokenCounter("o200k_base" if kind == "auto" else kind))


def _levels(spec: str, window: int, reservation: int) -> list[float]:
    limit = round(practical_limit(window, reservation + 16), 4)
    out = []
    for part in spec.split(","):
        part = part.strip()
        try:
            v = limit if part == "max" else float(part)
        except ValueError as exc:
            raise SweepUsageError(f"--levels: {part!r} is not a number or 'max'") from exc
        if not 0 < v <= limit:
            raise SweepUsageError(
                f"--levels: {v} is outside (0, {limit}] (the practical limit for this window)"
            )
        out.append(round(v, 4))
    return sorted(set(out))


def _run(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out) if args.out else None
    plan: dict[str, Any]
    if args.resume:
        if out is None or not (out / "plan.json").exists():
            raise SweepUsageError("--resume needs --out pointing at an existing run directory")
        plan = json.loads((out / "plan.json").read_text())
    else:
        base: dict[str, Any] = {}
        if args.reduced:
            if not args.baseline or not (Path(args.baseline) / "plan.json").exists():
                raise SweepUsageError(
                    "--reduced needs --baseline pointing at a finished run directory"
                )
            base_analysis, base, _ = _analysis(Path(args.baseline))
            args.base_url = args.base_url or base["base_url"]
            args.model = args.model or base["model"]
        if not args.base_url or not args.model:
            raise SweepUsageError("--base-url and --model are required")
        run_id = (out.name if out else None) or datetime.now(UTC).strftime(
            "run-%Y%m%d-%H%M%S-"
        ) + secrets.token_hex(2)
        out = out or Path("runs") / run_id
        if (out / "calls.jsonl").exists() and not args.dry_run:
            raise SweepUsageError(f"{out} already holds a run; use --resume or another --out")
        plan = {
            "run_id": run_id,
            "created_at": datetime.now(UTC).isoformat(),
            "base_url": args.base_url,
            "api": args.api,
            "model": args.model,
            "taskset_arg": args.taskset,
            "items": args.items,
            "levels_arg": args.levels,
            "repeats": args.repeats,
            "window_arg": args.window,
            "tokenizer": args.tokenizer,
            "tokenize_url": args.tokenize_url,
            "max_tokens": args.max_tokens,
            "shared_haystack": args.shared_haystack,
            "control": not args.no_control,
            "seed": args.seed,
            "json_mode": not args.no_json_mode,
            "tolerance": args.tolerance,
            "margin": args.margin,
            "resolution": args.resolution,
            "shard": _shard(args.shard),
        }
        if args.refine and plan["shard"]:
            raise SweepUsageError(
                "--refine needs the whole curve: refine after 'sweep merge', not per shard"
            )
        if args.items is None:
            plan["items"] = 10 if args.reduced else 30
        if args.reduced:
            keep = (
                "taskset_arg",
                "window",
                "tokenizer",
                "max_tokens",
                "shared_haystack",
                "seed",
                "json_mode",
                "tolerance",
                "margin",
            )
            plan |= {k: base[k] for k in keep} | {
                "levels": reduced_levels(base_analysis),
                "repeats": 3,
                "control": False,
                "refine": False,
                "item_ids": base["item_ids"][: plan["items"]],
                "baseline": str(Path(args.baseline).resolve()),
                "tokenize_url": args.tokenize_url or base.get("tokenize_url"),
            }
    try:
        ts = load_taskset(plan["taskset_arg"])
    except TaskSetError as exc:
        raise SweepUsageError(str(exc)) from exc
    window = int(plan.get("window") or _window(str(plan["window_arg"]), plan["base_url"]))
    levels = plan.get("levels") or _levels(plan["levels_arg"], window, plan["max_tokens"])
    meter = _meter(plan["tokenizer"], plan.get("tokenize_url") or plan["base_url"], console)
    builder = ContextBuilder(ts, meter, plan["seed"])
    if plan.get("item_ids"):
        by_id = {it.id: it for it in ts.items}
        items = [by_id[i] for i in plan["item_ids"] if i in by_id]
    else:
        rng = random.Random(plan["seed"])
        items = sorted(ts.items, key=lambda _: rng.random())[: plan["items"]]
    groups = group_items(builder, items, round(min(levels) * window), plan["shared_haystack"])
    if plan.get("shard"):
        shard_i, shard_n = plan["shard"]
        groups = [g for k, g in enumerate(groups) if k % shard_n == shard_i]
    key_env = args.api_key_env or (
        "ANTHROPIC_API_KEY" if plan["api"] == "anthropic" else "OPENAI_API_KEY"
    )
    headers = {}
    if args.bypass:
        token = os.environ.get("CEILING_ADMIN_TOKEN")
        if not token:
            raise SweepUsageError("--bypass needs CEILING_ADMIN_TOKEN (the sidecar's admin token)")
        headers["x-ceiling-bypass"] = token
    ep = Endpoint(
        base_url=plan["base_url"],
        api=plan["api"],
        model=plan["model"],
        api_key=os.environ.get(key_env),
        headers=headers,
        max_tokens=plan["max_tokens"],
        json_mode=plan["json_mode"],
    )
    docs = [builder.doc_tokens(d) for d in ts.docs]
    plan |= {
        "window": window,
        "levels": levels,
        "counter": meter.name,
        "endpoint": {"base_url": plan["base_url"], "api": plan["api"], "model": plan["model"]},
        "taskset": {
            "name": ts.meta.name,
            "hash": ts.hash,
            "corpus_hash": ts.corpus_hash,
            "skeleton_hash": ts.skeleton.hash,
        },
        "item_ids": [it.id for it in items],
        "groups": len(groups),
        "system_tokens": meter.text(ts.skeleton.system),
        "mean_doc_tokens": round(sum(docs) / len(docs), 1),
    }
    runner = Runner(
        builder,
        ep,
        CallLog(out / "calls.jsonl"),
        window,
        args.concurrency,
        Budget(args.max_calls, args.max_input_tokens),
        progress=not args.no_progress,
    )
    samples = runner.plan(groups, levels, plan["repeats"], plan["control"])
    if args.dry_run:
        calls, tokens = runner.estimate(samples)
        console.print(
            f"dry run: {calls} calls, about {tokens:,} tokens (window {window:,}, levels "
            f"{', '.join(f'{lv:g}' for lv in levels)}, {plan['repeats']} repeats, {len(items)} items, "
            f"{len(groups)} haystack group(s)); nothing was sent"
        )
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan, indent=2))
    console.print(
        f"[bold]run[/] {plan['run_id']} -> {out}  (window {window:,}, counter {meter.name})"
    )
    try:
        asyncio.run(runner.run(samples))
        while plan.get("refine", args.refine) and not runner.exhausted:
            a = analyse(
                CallLog(out / "calls.jsonl").records().values(),
                {i.id: i for i in items},
                window,
                plan["tolerance"],
                plan["margin"],
                plan["seed"],
            )
            new = refinements(a.levels, plan["tolerance"], plan["resolution"], set(plan["levels"]))
            if not new:
                break
            console.print(
                f"refining: measuring {', '.join(f'{x:g}' for x in new)} where accuracy drops"
            )
            plan["levels"] = sorted(set(plan["levels"]) | set(new))
            (out / "plan.json").write_text(json.dumps(plan, indent=2))
            asyncio.run(runner.run(runner.plan(groups, new, plan["repeats"], controls=False)))
    except KeyboardInterrupt:
        console.print(
            f"\n[yellow]interrupted[/]: every finished call is in {out / 'calls.jsonl'}; "
            f"continue with: ceiling sweep run --resume --out {out}"
        )
        return 130
    if runner.exhausted:
        console.print(
            "[yellow]budget reached[/]: stopped starting calls; raise it and --resume to finish"
        )
    code = _report(out, console)
    if plan.get("baseline"):
        return _verdict(out, Path(plan["baseline"]), console)
    return code


def _shard(spec: str | None) -> list[int] | None:
    if spec is None:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError as exc:
        raise SweepUsageError(f"--shard must look like i/n (e.g. 0/4), not {spec!r}") from exc
    if not 0 <= i < n:
        raise SweepUsageError(f"--shard {spec}: need 0 <= i < n")
    return [i, n]


def _verdict(out: Path, baseline: Path, console: Console) -> int:
    new, plan, records = _analysis(out)
    old, _, base_records = _analysis(baseline)
    ts = load_taskset(plan["taskset_arg"])
    v = compare(old, new, base_records, records, {i.id: i for i in ts.items}, plan["seed"])
    (out / "verdict.json").write_text(json.dumps(v.to_json(), indent=2))
    for e in v.levels:
        console.print(
            f"level {e.level:g}: baseline {e.baseline_accuracy:.0%} -> now {e.accuracy:.0%} "
            f"(paired change {e.change:+.0%}, 95% CI {e.change_ci[0]:+.0%}..{e.change_ci[1]:+.0%})"
        )
    console.print(("[bold green]" if v.holds else "[bold red]") + v.text)
    return 0 if v.holds else 1


def _merge(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out)
    plans = []
    for d in args.shards:
        p = Path(d) / "plan.json"
        if not p.exists():
            raise SweepUsageError(f"{d}: not a run directory (no plan.json)")
        plans.append(json.loads(p.read_text()))
    same = (
        "taskset",
        "model",
        "window",
        "levels",
        "repeats",
        "seed",
        "max_tokens",
        "shared_haystack",
    )
    for p in plans[1:]:
        for k in same:
            if p.get(k) != plans[0].get(k):
                raise SweepUsageError(
                    f"the shards disagree on {k}: they are not parts of one sweep"
                )
    parts = [tuple(p["shard"]) for p in plans if p.get("shard")]
    if parts:
        n = parts[0][1]
        indices = sorted(i for i, _ in parts)
        if len(parts) != len(plans) or any(m != n for _, m in parts) or indices != list(range(n)):
            raise SweepUsageError(
                f"the shards are not one whole sweep: got {', '.join(f'{i}/{m}' for i, m in parts) or 'none'}"
                f" for {len(plans)} run(s); give each of 0/{n}..{n - 1}/{n} once"
            )
    merged_plan = dict(plans[0]) | {
        "shard": None,
        "run_id": out.name,
        "merged_from": [p["run_id"] for p in plans],
        "item_ids": sorted({i for p in plans for i in p["item_ids"]}),
    }
    out.mkdir(parents=True, exist_ok=True)
    log = CallLog(out / "calls.jsonl")
    have = set(log.records())
    for d in args.shards:
        for key, rec in CallLog(Path(d) / "calls.jsonl").records().items():
            if key not in have:
                log.append(rec)
                have.add(key)
    (out / "plan.json").write_text(json.dumps(merged_plan, indent=2))
    console.print(f"merged {len(args.shards)} shard(s): {len(have)} calls -> {out}")
    return _report(out, console)


def _analysis(
    out: Path, tolerance: float | None = None, margin: float | None = None
) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    plan = json.loads((out / "plan.json").read_text())
    ts = load_taskset(plan["taskset_arg"])
    items = {i.id: i for i in ts.items if i.id in set(plan["item_ids"])}
    records = list(CallLog(out / "calls.jsonl").records().values())
    a = analyse(
        records,
        items,
        plan["window"],
        tolerance if tolerance is not None else plan["tolerance"],
        margin if margin is not None else plan["margin"],
        plan["seed"],
    )
    return a, plan, records


def _report(out: Path, console: Console) -> int:
    a, plan, _ = _analysis(out)
    paths = write(out, a, plan, console)
    console.print(f"report: {paths['html']}  plot: {paths['png']}  summary: {paths['json']}")
    return 0


def _derive(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.run)
    if not (out / "plan.json").exists():
        raise SweepUsageError(f"{out}: not a run directory (no plan.json)")
    a, plan, records = _analysis(out, args.tolerance, args.margin)
    try:
        entry = entry_from(a, plan, records, args.model, args.workload)
        if args.mode:
            entry = entry.model_copy(update={"mode": args.mode})
        existing = load_document(args.merge) if args.merge else None
    except (DeriveError, CeilingsError) as exc:
        raise SweepUsageError(str(exc)) from exc
    doc = merged(existing, entry)
    target = Path(args.out) if args.out else out / "ceilings.yaml"
    write_atomically(target, dump_document(doc))
    console.print(
        f"{entry.model}/{entry.workload}: ceiling {entry.ceiling_tokens:,} tokens "
        f"({entry.ceiling_utilization:.1%} of {entry.window:,}), document version {doc.version} -> {target}"
    )
    return 0


def main(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        if args.action == "run":
            return _run(args, console)
        if args.action == "derive":
            return _derive(args, console)
        if args.action == "merge":
            return _merge(args, console)
        if args.action == "job":
            from ceiling.cli import main as ceiling_main
            from sweep import job

            return job.run(args, console, ceiling_main)
        return _report(Path(args.run), console)
    except (SweepUsageError, TaskSetError, JobError) as exc:
        print(f"ceiling sweep {args.action}: {exc}", file=sys.stderr)
        return 2

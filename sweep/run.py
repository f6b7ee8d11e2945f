"""``ceiling sweep run``: plan a sweep (or resume one from its log) and run it.

The plan (task set, levels, repeats, window, counter, seed, shard) is written to ``plan.json``
before the first call, so a resumed or sharded run measures exactly what was planned."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ceiling.engine import SyncEngine
from ceiling.models import ChatFormat, UpstreamSpec
from ceiling.tokenizers import TiktokenCounter
from ceiling.utilization import practical_limit
from sweep.analysis import analyse, refinements
from sweep.context import ContextBuilder, Meter, group_items
from sweep.regression import reduced_levels
from sweep.results import SweepUsageError, analysis_of, report, verdict
from sweep.runner import Budget, CallLog, Endpoint, Runner
from sweep.taskset import TaskSetError, load_taskset


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


def run(args: argparse.Namespace, console: Console) -> int:
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
            base_analysis, base, _ = analysis_of(Path(args.baseline))
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
    code = report(out, console)
    if plan.get("baseline"):
        return verdict(out, Path(plan["baseline"]), console)
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

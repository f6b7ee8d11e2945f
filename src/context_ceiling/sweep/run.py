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

from context_ceiling.core.engine import SyncEngine
from context_ceiling.core.models import ChatFormat, UpstreamSpec
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.core.utilization import practical_limit
from context_ceiling.sweep.context import ContextBuilder, Meter, group_items
from context_ceiling.sweep.design import batch_size, next_step
from context_ceiling.sweep.regression import reduced_levels
from context_ceiling.sweep.results import SweepUsageError, analysis_of, report, verdict
from context_ceiling.sweep.runner import Budget, CallLog, Endpoint, Runner
from context_ceiling.sweep.stats import MIN_ITEMS, expected_half_width, items_for
from context_ceiling.sweep.taskset import Item, TaskSetError, load_taskset


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


def _levels(spec: str, window: int, reservation: int, low_fill: float = 0.0) -> list[float]:
    """The planned levels; ``low_fill`` (a control below the reference) is added when it lies
    below the lowest level asked for."""
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
    if 0 < low_fill < min(out):
        out.append(round(low_fill, 4))
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
        whole = not plan["shard"]
        plan |= {
            "refine": whole if args.refine is None else args.refine,
            "adaptive": whole if args.adaptive is None else args.adaptive,
            "low_fill": args.low_fill,
            "reasoning": args.reasoning,
            "reasoning_tokens": args.reasoning_tokens,
        }
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
                "reasoning",
                "reasoning_tokens",
            )
            plan |= {k: base[k] for k in keep if k in base} | {
                "levels": reduced_levels(base_analysis),
                "reference": base_analysis.reference_level,
                "repeats": 3,
                "control": False,
                "refine": False,
                "adaptive": False,
                "item_ids": _reduced_items(base, args.items, plan["tolerance"]),
                "baseline": str(Path(args.baseline).resolve()),
                "tokenize_url": args.tokenize_url or base.get("tokenize_url"),
            }
    try:
        ts = load_taskset(plan["taskset_arg"])
    except TaskSetError as exc:
        raise SweepUsageError(str(exc)) from exc
    window = int(plan.get("window") or _window(str(plan["window_arg"]), plan["base_url"]))
    levels: list[float] = plan.get("levels") or _levels(
        plan["levels_arg"], window, plan["max_tokens"], plan.get("low_fill") or 0.0
    )
    reference = plan.get("reference") or min(
        (lv for lv in levels if lv != plan.get("low_fill")), default=levels[0]
    )
    meter = _meter(plan["tokenizer"], plan.get("tokenize_url") or plan["base_url"], console)
    builder = ContextBuilder(ts, meter, plan["seed"])
    by_id = {it.id: it for it in ts.items}
    order = [it.id for it in _order(ts.items, plan["seed"])]
    repeats = int(plan["repeats"])
    planned = min(len(order), items_for(plan["tolerance"], repeats))
    if plan.get("items"):
        target_items = min(len(order), int(plan["items"]))  # a fixed design
    elif plan.get("adaptive"):
        target_items = len(order)  # up to every item, where the decision is open
    else:
        target_items = planned
    if plan.get("item_ids"):
        drawn = [i for i in plan["item_ids"] if i in by_id]
    elif plan.get("adaptive") and not plan.get("items"):
        drawn = order[: min(target_items, max(MIN_ITEMS, -(-planned // 2)))]
    else:
        drawn = order[:target_items]
    batches: list[int] = plan.get("batches") or [len(drawn)]
    n_at: dict[str, int] = plan.get("n_at") or {f"{lv:.4f}": len(drawn) for lv in levels}
    n_control = int(plan.get("n_control", len(drawn) if plan["control"] else 0))
    smallest = round(min(levels) * window)

    def groups_upto(n: int) -> list[list[Item]]:
        out: list[list[Item]] = []
        lo = 0
        for hi in batches:
            if hi > n:
                break
            out += group_items(
                builder, [by_id[i] for i in drawn[lo:hi]], smallest, plan["shared_haystack"]
            )
            lo = hi
        if plan.get("shard"):
            shard_i, shard_n = plan["shard"]
            out = [g for k, g in enumerate(out) if k % shard_n == shard_i]
        return out

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
        reasoning=plan.get("reasoning") or "auto",
        reasoning_tokens=int(plan.get("reasoning_tokens") or 0),
    )
    docs = [builder.doc_tokens(d) for d in ts.docs]

    def save() -> None:
        plan.update(
            levels=sorted(levels),
            item_ids=drawn,
            batches=batches,
            n_at=n_at,
            n_control=n_control,
            reference=reference,
            planned_items=planned,
            item_cap=target_items,
        )
        assert out is not None
        (out / "plan.json").write_text(json.dumps(plan, indent=2))

    plan |= {
        "window": window,
        "counter": meter.name,
        "endpoint": {"base_url": plan["base_url"], "api": plan["api"], "model": plan["model"]},
        "taskset": {
            "name": ts.meta.name,
            "hash": ts.hash,
            "corpus_hash": ts.corpus_hash,
            "skeleton_hash": ts.skeleton.hash,
        },
        "groups": len(groups_upto(len(drawn))),
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

    def samples_for(lvs: list[float], control_n: int = 0) -> list[Any]:
        got = runner.plan(groups_upto(control_n), [], 0, controls=True) if control_n else []
        for lv in sorted(lvs):
            got += runner.plan(groups_upto(n_at[f"{lv:.4f}"]), [lv], repeats, controls=False)
        return got

    samples = samples_for(levels, n_control)
    if args.dry_run:
        calls, tokens = runner.estimate(samples)
        hw = expected_half_width(len(drawn), repeats)
        more = (
            f"; {planned} items are planned for ±{expected_half_width(planned, repeats):.1%}: "
            f"adaptive, up to {target_items} items (±{expected_half_width(target_items, repeats):.1%})"
            " where the decision is still open"
            if plan.get("adaptive") and target_items > len(drawn)
            else ""
        )
        console.print(
            f"dry run: {calls} calls, about {tokens:,} tokens (window {window:,}, levels "
            f"{', '.join(f'{lv:g}' for lv in levels)}, {repeats} repeats, {len(drawn)} items, "
            f"{plan['groups']} haystack group(s)); expected paired-difference 95% CI "
            f"±{hw:.1%} at 80% accuracy against a tolerance of {plan['tolerance']:.0%}{more}; "
            "nothing was sent"
        )
        return 0
    out.mkdir(parents=True, exist_ok=True)
    save()
    console.print(
        f"[bold]run[/] {plan['run_id']} -> {out}  (window {window:,}, counter {meter.name}, "
        f"{len(drawn)} items, expected CI ±{expected_half_width(len(drawn), repeats):.1%})"
    )
    try:
        asyncio.run(runner.run(samples))
        while not runner.exhausted:
            step = next_step(
                analysis_of(out)[0],
                drawn=len(drawn),
                target_items=target_items,
                refine=bool(plan.get("refine")),
                adaptive=bool(plan.get("adaptive")),
                resolution=plan["resolution"],
                batch=batch_size(planned),
            )
            if step is None:
                break
            where = ", ".join(f"{x:g}" for x in step.levels)
            if step.kind == "items":
                new_ids = [i for i in order if i not in set(drawn)][: step.new_items]
                if not new_ids:
                    break
                drawn += new_ids
                batches.append(len(drawn))
                for lv in step.levels:
                    n_at[f"{lv:.4f}"] = len(drawn)
                if plan["control"]:
                    n_control = len(drawn)
                console.print(
                    f"adding {len(new_ids)} items at {where} where the decision is open "
                    f"(now {len(drawn)} items)"
                )
                todo = samples_for(list(step.levels), n_control if plan["control"] else 0)
            else:
                console.print(f"refining: measuring {where} where accuracy drops")
                for lv in step.levels:
                    n_at[f"{lv:.4f}"] = n_at[f"{reference:.4f}"]
                levels = sorted(set(levels) | set(step.levels))
                todo = samples_for(list(step.levels))
            save()
            asyncio.run(runner.run(todo))
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


def _order(items: list[Item], seed: int) -> list[Item]:
    """The seeded order items are drawn in: a larger run is a superset of a smaller one."""
    rng = random.Random(seed)
    return sorted(items, key=lambda _: rng.random())


def _reduced_items(base: dict[str, Any], items: int | None, tolerance: float) -> list[str]:
    """The baseline's items a regression check pairs against: as many as the tolerance needs for a
    difference in differences (twice the variance of one paired difference), at most all."""
    ids: list[str] = base["item_ids"]
    want = items or items_for(tolerance / 2**0.5, 3)
    return ids[: min(len(ids), want)]


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

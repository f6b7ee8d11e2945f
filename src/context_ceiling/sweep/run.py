"""``ceiling sweep run``: plan a sweep (or resume one from its log) and run it.

The plan (:mod:`context_ceiling.sweep.plan`) is written before the first call; then the planned
calls run (:mod:`context_ceiling.sweep.solver`), and while the decision is open the design grows
(:func:`context_ceiling.sweep.design.next_step`: more items where the deciding interval still
reaches the tolerance, refined levels where accuracy drops), each step saved to the plan before
its calls. The report, and a regression verdict for a ``--reduced`` run, close it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from rich.console import Console

from context_ceiling.core.engine_tokenize import SyncEngine
from context_ceiling.core.errors import UserError
from context_ceiling.core.models import ChatFormat, UpstreamSpec
from context_ceiling.core.options import Option
from context_ceiling.core.prices import lookup, parse_price
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.formats import APIS
from context_ceiling.sweep.analysis import analysis_of, design_of, final_items
from context_ceiling.sweep.calllog import CallLog
from context_ceiling.sweep.corpora import extend, reach
from context_ceiling.sweep.design import (
    Step,
    affordable,
    first_items,
    next_step,
    opening,
    staged,
)
from context_ceiling.sweep.external import open_taskset
from context_ceiling.sweep.plan import (
    SPEC,
    Material,
    Plan,
    TaskSetRef,
    engine_root,
    finished,
    item_order,
    level_key,
    levels_for,
    opened_on,
    parse_shard,
    window_of,
)
from context_ceiling.sweep.price import Estimate, Pricing, bought, budget_lines, cost_line
from context_ceiling.sweep.prompts import ContextBuilder, Meter, group_items
from context_ceiling.sweep.regression import reduced_levels, verdict
from context_ceiling.sweep.report import report
from context_ceiling.sweep.solver import Endpoint, Runner, Sample, SpendCap
from context_ceiling.sweep.spec import Asked, Spec
from context_ceiling.sweep.statistics import (
    ADDED_REPEATS,
    expected_half_width,
    items_for,
    tolerance_for,
)
from context_ceiling.sweep.taskset import Item


class RunOptions(Asked):
    """``ceiling sweep run``: what the command line (or the Kubernetes sweep job) asks for, the
    spec's fields (:class:`~context_ceiling.sweep.spec.Asked`) and how this run spends, stops,
    resumes and reports. The command's options are generated from these fields."""

    api_key_env: str | None = None
    """env var holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY)"""
    concurrency: int = 1
    """calls in flight at once"""
    batch_poll_s: Annotated[float, Option(flag="--batch-poll", metavar="SECONDS")] = 30.0
    """how often a batch's status is read"""
    max_calls: int | None = None
    """stop starting calls after this many"""
    max_input_tokens: int | None = None
    """token budget for the whole run"""
    price: Annotated[str | None, Option(metavar="IN,OUT[,CACHED]")] = None
    """dollars per million input, output (and cached input) tokens; 0 for a self-hosted model
    (default: the model's list price from the genai-prices data set)"""
    budget_usd: float | None = None
    """a hard cap on the run's dollars: no call starts that would cross it (the adaptive design
    stops adding items; the decision may stay open)"""
    refine: bool | None = None
    """measure midpoints where accuracy drops (default on, except per shard)"""
    adaptive: bool | None = None
    """add items where the decision is still open (default on, except per shard)"""
    bypass: bool = False
    """going through a sidecar: send x-ceiling-bypass (CEILING_ADMIN_TOKEN)"""
    out: str | None = None
    """run directory (default runs/<run id>)"""
    resume: bool = False
    """continue the run in --out, skipping logged calls"""
    dry_run: bool = False
    """print calls and tokens, spend nothing"""
    reduced: bool = False
    """regression check against --baseline (its items, as many as the tolerance needs; 3
    levels, 3 repeats)"""
    baseline: str | None = None
    """the stored run a --reduced sweep is paired against"""
    shard: str | None = None
    """i/n: run only haystack groups with index %% n == i (Kubernetes Indexed Job)"""
    no_progress: bool = False
    """no live progress bar (a line per step is still printed)"""
    as_json: Annotated[bool, Option(flag="--json", elsewhere=True)] = False
    """the result as one JSON object on stdout (the console is on stderr)"""


def run(opts: RunOptions, console: Console) -> int:
    out, plan = _resumed(opts) if opts.resume else _planned(opts)
    sweep = _Sweep(plan, opts, out, console)
    if not opts.resume:
        sweep.fit_opening()  # the dry run prices what the budget affords, as the run does
    if opts.dry_run:
        return sweep.dry_run()
    out.mkdir(parents=True, exist_ok=True)
    sweep.save()
    plan = sweep.plan  # finished: items drawn, opening sized
    console.print(
        f"[bold]run[/] {plan.run_id} -> {out}  (window {sweep.window:,}, counter "
        f"{sweep.meter.name}, {len(plan.item_ids)} item{'' if len(plan.item_ids) == 1 else 's'}, "
        "margin of error "
        f"±{expected_half_width(len(plan.item_ids), plan.spec.repeats):.1%})"
    )
    opening, grid = sweep.estimates()
    spend = sweep.pricing.spend(*opening)
    console.print(cost_line(sweep.pricing.costs(*opening, spend, grid), plan.spec.model, spend))
    try:
        sweep.run()
    except KeyboardInterrupt:
        console.print(
            f"\n[yellow]interrupted[/]: every finished call is in {out / 'calls.jsonl'}; "
            f"continue with: ceiling sweep run --resume --out {out}"
        )
        return 130
    if sweep.runner.exhausted or sweep.stopped_by_budget:
        console.print(
            "[yellow]budget reached[/]: no more calls started; the ceiling is derived at the "
            "tolerance the data resolve (raise the budget and --resume to narrow it)"
        )
    code = report(out, console)
    if plan.baseline:
        code = verdict(out, Path(plan.baseline), console)
    if opts.as_json:
        summary = json.loads((out / "summary.json").read_text())
        print(json.dumps({"run": str(out), "exit_status": code, "summary": summary}, indent=2))
    return code


def _resumed(opts: RunOptions) -> tuple[Path, Plan]:
    if opts.out is None or not (Path(opts.out) / "plan.json").exists():
        raise UserError("--resume needs --out pointing at an existing run directory")
    return Path(opts.out), Plan.load(Path(opts.out))


def _planned(opts: RunOptions) -> tuple[Path, Plan]:
    """A new plan from the options (a ``--reduced`` one from its baseline's)."""
    base_url, model = opts.base_url, opts.model
    baseline = None
    if opts.reduced:
        if not opts.baseline or not (Path(opts.baseline) / "plan.json").exists():
            raise UserError("--reduced needs --baseline pointing at a finished run directory")
        baseline = analysis_of(Path(opts.baseline))
        base_url = base_url or baseline.plan.spec.base_url
        model = model or baseline.plan.spec.model
    if not base_url or not model:
        raise UserError("--base-url and --model are required")
    out = Path(opts.out) if opts.out else None
    run_id = (out.name if out else None) or datetime.now(UTC).strftime(
        "run-%Y%m%d-%H%M%S-"
    ) + secrets.token_hex(2)
    out = out or Path("runs") / run_id
    if (out / "calls.jsonl").exists() and not opts.dry_run:
        raise UserError(f"{out} already holds a run; use --resume or another --out")
    shard = parse_shard(opts.shard)
    if opts.refine and shard:
        raise UserError("--refine needs the whole curve: refine after 'sweep merge', not per shard")
    asked = {f: getattr(opts, f) for f in SPEC if f not in ("base_url", "model")}
    plan = Plan(
        run_id=run_id,
        created_at=datetime.now(UTC).isoformat(),
        spec=Spec(base_url=base_url, model=model, **asked),
        shard=shard,
        refine=not shard if opts.refine is None else opts.refine,
        adaptive=not shard if opts.adaptive is None else opts.adaptive,
    )
    if baseline is not None:
        b = baseline.plan
        # the baseline's material, counter, calls and decision; three repeats, no control
        kept = b.spec.model_dump(
            include={
                "taskset",
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
            }
        )
        spec = plan.spec.model_copy(
            update=kept
            | {
                "repeats": 3,
                "control": False,
                "tokenize_url": opts.tokenize_url or b.spec.tokenize_url,
            }
        )
        plan = plan.model_copy(
            update={
                "spec": spec,
                "window": b.window,
                "levels": reduced_levels(baseline.analysis),
                "reference": baseline.analysis.reference_level,
                "refine": False,
                "adaptive": False,
                "item_ids": _reduced_items(b, opts.items, b.spec.tolerance),
                "baseline": str(Path(opts.baseline or "").resolve()),
            }
        )
    return out, plan


class _Sweep:
    """One run of a plan: the task set, the counter and the solver, and the design as it grows
    (held in the plan itself, so saving the plan saves the design)."""

    def __init__(self, plan: Plan, opts: RunOptions, out: Path, console: Console) -> None:
        self.opts, self.out, self.console = opts, out, console
        self.window = plan.window or window_of(
            plan.spec.window, plan.spec.base_url, plan.spec.model
        )
        levels = plan.levels or levels_for(
            plan.spec.levels, self.window, plan.spec.max_tokens, plan.spec.low_fill
        )
        # a bundled corpus grows with the window (more of its own kind of document), so the
        # highest level can be filled whatever the window
        self.ts = extend(open_taskset(plan.spec.taskset), reach(levels, self.window))
        self.meter = _meter(
            plan.spec.tokenizer, plan.spec.tokenize_url or plan.spec.base_url, console
        )
        self.builder = ContextBuilder(self.ts, self.meter, plan.spec.seed)
        self.by_id = {it.id: it for it in self.ts.items}
        self.order = [it.id for it in item_order(self.ts.items, plan.spec.seed)]
        # fixed once: the pass test's bets are tuned to it, so a resumed run keeps it
        self.planned = plan.planned_items or min(
            len(self.order), items_for(plan.spec.tolerance, plan.spec.repeats)
        )
        self.opening = opening(
            len(self.order), self.planned, plan.spec.items, plan.adaptive and not plan.spec.items
        )
        self.target_items = self.opening.target
        self.smallest = round(min(levels) * self.window)
        docs = [self.builder.doc_tokens(d) for d in self.ts.docs]
        material = Material(
            window=self.window,
            levels=levels,
            order=self.order,
            counter=self.meter.name,
            taskset=TaskSetRef(
                name=self.ts.meta.name,
                hash=self.ts.hash,
                corpus_hash=self.ts.corpus_hash,
                skeleton_hash=self.ts.skeleton.hash,
                metric=self.ts.metric,
                fingerprint=self.ts.fingerprint,
            ),
            system_tokens=self.meter.text(self.ts.skeleton.system),
            mean_doc_tokens=round(sum(docs) / len(docs), 1),
        )
        self.plan = finished(plan, material, self.opening, self.planned, self._group_count)
        self._check_reach(sum(docs))
        plan = self.plan
        self.price = (
            parse_price(opts.price)
            if opts.price
            else lookup(plan.spec.model, batch=plan.spec.batch)
        )
        self.stopped_by_budget = False
        #: what each call may write: the answer and the reasoning reserved beside it
        self.output_reservation = plan.spec.max_tokens + (plan.spec.reasoning_tokens or 0)
        self.pricing = Pricing(
            plan,
            self.price,
            self.output_reservation,
            self.window,
            task_items=len(self.order),
            planned=self.planned,
            target_items=self.target_items,
            budget_usd=opts.budget_usd,
            max_calls=opts.max_calls,
            max_input_tokens=opts.max_input_tokens,
        )
        if opts.budget_usd is not None and self.price is None:
            raise UserError(
                f"--budget-usd: the price data set has no price for {plan.spec.model}; say what it "
                "costs with --price IN,OUT (dollars per million tokens)"
            )
        self.runner = Runner(
            self.builder,
            _endpoint(plan, opts),
            CallLog(out / "calls.jsonl"),
            self.window,
            opts.concurrency,
            SpendCap(
                opts.max_calls,
                opts.max_input_tokens,
                opts.budget_usd,
                self.price,
                self.output_reservation,
            ),
            progress=not opts.no_progress,
        )

    def _check_reach(self, corpus_tokens: int) -> None:
        """Refuse a level the task set's corpus cannot fill: padding comes from the corpus only,
        so a prompt holds at most every document once; measured there, the level would be
        labelled with a fill it never had (its points drawn at the wrong place on the curve)."""
        longest = max(self.ts.items, key=lambda it: len(it.question))
        reach = self.builder.base_tokens(longest.question) + corpus_tokens
        short = [lv for lv in self.plan.levels if lv * self.window > reach]
        if short:
            top = math.floor(reach / self.window * 100) / 100  # rounded down: it must be accepted
            raise UserError(
                f"--levels: the {self.ts.meta.name} corpus fills at most {reach:,} tokens, "
                f"{reach / self.window:.0%} of the {self.window:,}-token window, so level(s) "
                f"{', '.join(f'{lv:g}' for lv in short)} cannot be measured: choose levels up to "
                f"{top:.2f}, a smaller --window, or a task set with a larger corpus (your own "
                "traffic: ceiling taskset build)"
            )

    def fit_opening(self) -> None:
        """Fixed-budget planning: when the opening design would cross a budget (``--max-calls``,
        ``--max-input-tokens``, ``--budget-usd``), open on as many items as the budget affords
        (calls and tokens grow with the items), so the ceiling comes at the tolerance those items
        resolve rather than from levels left half measured."""
        plan = self.plan
        drawn = len(plan.item_ids)
        calls, tokens = self.opening_estimate()
        budget = self.runner.budget
        if drawn == 0 or budget.fits(calls, tokens):
            return
        n = affordable(
            drawn, lambda k: budget.fits(round(calls * k / drawn), round(tokens * k / drawn))
        )
        self.plan = opened_on(plan, n, self._group_count)
        self.pricing.plan = self.plan
        self.console.print(
            f"[yellow]budget[/]: the opening design fits {n} of {drawn} items: "
            f"{bought(tolerance_for(n, plan.spec.repeats))} (what each budget buys: --dry-run)"
        )

    def save(self) -> None:
        self.plan.levels = sorted(self.plan.levels)
        self.plan.save(self.out)

    def batch_groups(self, n: int) -> list[tuple[list[list[Item]], int]]:
        """The haystack groups of the first ``n`` drawn items, batch by batch (a later batch
        never regroups an earlier one), this shard's only, each batch with its repeats."""
        return self._batch_groups(self.plan, n)

    def _batch_groups(self, plan: Plan, n: int) -> list[tuple[list[list[Item]], int]]:
        out: list[tuple[list[list[Item]], int]] = []
        lo = k = 0
        ids = plan.item_ids
        for b, hi in enumerate(plan.batches):
            if hi > n:
                break
            items = [self.by_id[i] for i in ids[lo:hi]]
            groups = group_items(self.builder, items, self.smallest, plan.spec.shared_haystack)
            if plan.shard:
                shard_i, shard_n = plan.shard
                groups = [g for j, g in enumerate(groups, start=k) if j % shard_n == shard_i]
            k += len(groups)
            out.append((groups, plan.repeats_at(b)))
            lo = hi
        return out

    def _group_count(self, plan: Plan, n: int) -> int:
        """How many haystack groups the first ``n`` items of ``plan`` make."""
        return sum(len(groups) for groups, _ in self._batch_groups(plan, n))

    def groups_upto(self, n: int) -> list[list[Item]]:
        """The haystack groups of the first ``n`` drawn items (see :meth:`batch_groups`)."""
        return [g for groups, _ in self.batch_groups(n) for g in groups]

    def samples_for(
        self, levels: list[float], control_n: int = 0, whole: bool = False, second: bool = False
    ) -> list[Sample]:
        """The calls that measure ``levels`` on their items (and the closed-book control on the
        first ``control_n``); ``whole``: a deferred grid level on the opening's items, as a
        fixed design measures it; ``second``: the opening's second stage too
        (``design.staged``), as every sweep past the accuracy floor measures it."""
        runner, plan = self.runner, self.plan
        got = runner.plan(self.groups_upto(control_n), [], 0, controls=True) if control_n else []
        # the deferred levels measured here on the opening's items
        later: set[float] = set()
        if whole:
            later = set(plan.grid_left)
        elif second:
            later = set(self._second_stage())
        for lv in sorted(levels):
            at = plan.repeats_at_level(lv)
            n = plan.batches[0] if lv in later else plan.items_at(lv)
            for groups, repeats in self.batch_groups(n):
                got += runner.plan(groups, [lv], min(repeats, at), False)
        return got

    def _second_stage(self) -> list[float]:
        """The opening's second stage while it waits (``design.staged``)."""
        return staged(self.plan.levels, self.plan.chain_reference, self.plan.grid_left)

    def opening_estimate(self, whole: bool = False) -> Estimate:
        """The opening's calls and input tokens, both its stages (``whole``: on the whole grid,
        the levels the adaptive design defers included)."""
        plan = self.plan
        return self.runner.estimate(
            self.samples_for(plan.levels, plan.n_control or 0, whole, second=True)
        )

    def estimates(self) -> tuple[Estimate, Estimate]:
        """The opening's calls and input tokens, and the same on the whole grid (what the
        price's upper end and a fixed design count)."""
        opening = self.opening_estimate()
        return opening, self.opening_estimate(whole=True) if self.plan.grid_left else opening

    def dry_run(self) -> int:
        plan = self.plan
        (calls, tokens), grid = self.estimates()
        drawn = len(plan.item_ids)
        hw = expected_half_width(drawn, plan.spec.repeats)
        spend = self.pricing.spend(calls, tokens)
        more = (
            f"; {self.planned} items are planned for "
            f"±{expected_half_width(self.planned, plan.spec.repeats):.1%}: adaptive, up to "
            f"{self.target_items} items (±{expected_half_width(self.target_items, plan.spec.repeats):.1%})"
            " where the decision is still open"
            + (", as far as the budget allows" if spend["budget_input_tokens"] is not None else "")
            if plan.adaptive and self.target_items > drawn
            else ""
        )
        cost = self.pricing.costs(calls, tokens, spend, grid)
        budgets = self.pricing.budgets(*grid)
        later = _waiting(plan.grid_left, self._second_stage())
        self.console.print(
            f"dry run: {calls} calls, about {tokens:,} tokens to open (window {self.window:,}, "
            f"levels {', '.join(f'{lv:g}' for lv in plan.levels)}{later}, "
            f"{plan.spec.repeats} repeats, {drawn} items, "
            f"{plan.groups} haystack group(s)); the pass test's expected margin of error "
            f"±{hw:.1%} at 80% {self.ts.metric} against a tolerance of {plan.spec.tolerance:.0%}{more}; "
            "nothing was sent"
        )
        self.console.print(cost_line(cost, plan.spec.model, spend))
        self.console.print(
            "what a budget buys (a fixed design of that many items; --items N or --budget-usd):"
        )
        for line in budget_lines(budgets):
            self.console.print(line)
        if self.opts.as_json:
            estimate = {
                "dry_run": True,
                "calls": calls,
                "input_tokens": tokens,
                "window": self.window,
                "levels": list(plan.levels),
                "deferred_levels": list(plan.grid_left),
                "repeats": plan.spec.repeats,
                "items": drawn,
                "items_planned": self.planned,
                "items_max": self.target_items if plan.adaptive else drawn,
                "haystack_groups": plan.groups,
                "expected_half_width": hw,
                "tolerance": plan.spec.tolerance,
                **spend,
                "cost_usd": cost,
                "budgets": budgets,
            }
            print(json.dumps(estimate, indent=2))
        return 0

    def run(self) -> None:
        """The planned calls, then each step of the adaptive design until the decision closes,
        the budget is spent or the task set has no more items."""
        asyncio.run(self.runner.run(self.samples_for(self.plan.levels, self.plan.n_control or 0)))
        while not self.runner.exhausted:
            a = analysis_of(self.out).analysis
            step = next_step(
                a,
                drawn=len(self.plan.item_ids),
                target_items=self.target_items,
                refine=self.plan.refine,
                adaptive=self.plan.adaptive,
                resolution=self.plan.spec.resolution,
                batch=self.opening.batch,
                grid=self.plan.grid_left,
                opened=self.plan.batches[0] if self.plan.batches else None,
            )
            before = self.plan.model_copy(deep=True)
            todo = self.grow(step) if step is not None else None
            if todo is None:
                return
            done = self.runner.log.done()
            calls, tokens = self.runner.estimate([s for s in todo if s.key not in done])
            if not self.runner.budget.fits(calls, tokens):
                # a step is measured whole or not at all: half a step would leave its levels
                # incomplete, and an incomplete level fails (the decision stays open instead)
                self.plan = before
                self.stopped_by_budget = True
                self.console.print(
                    f"[yellow]budget[/]: the next step ({calls:,} calls, about {tokens:,} tokens) "
                    "would cross it: the design stops here and the decision stays open"
                )
                return
            self.save()
            asyncio.run(self.runner.run(todo))

    def grow(self, step: Step) -> list[Sample] | None:
        """Apply one step of the design to the plan; the samples it adds (None: nothing to add)."""
        plan = self.plan
        where = ", ".join(f"{x:g}" for x in step.levels)
        if step.kind == "items":
            have = set(plan.item_ids)
            new_ids = [i for i in self.order if i not in have][: step.new_items]
            if not new_ids:
                return None
            plan.item_ids = plan.item_ids + new_ids
            drawn = len(plan.item_ids)
            repeats = min(plan.spec.repeats, ADDED_REPEATS)
            before = [plan.repeats_at(b) for b in range(len(plan.batches))]
            plan.batches = [*plan.batches, drawn]
            plan.batch_repeats = [*before, repeats]
            if repeats != plan.spec.repeats and plan.spec.repeats == before[-1]:
                self.console.print(
                    f"items added from here on are asked {repeats} time(s) at each level, not "
                    f"{plan.spec.repeats}: a new item buys more precision than a repeat"
                )
            plan.n_at = plan.n_at | {level_key(lv): drawn for lv in step.levels}
            if plan.spec.control:
                plan.n_control = drawn
            self.console.print(
                f"adding {len(new_ids)} items at {where} where the decision is open "
                f"(now {drawn} items)"
            )
            return self.samples_for(
                list(step.levels), (plan.n_control or 0) if plan.spec.control else 0
            )
        if step.kind == "extend":
            [lv] = step.levels
            hi = min(b for b in plan.batches if b > plan.items_at(lv))
            plan.n_at = plan.n_at | {level_key(lv): hi}
            self.console.print(
                f"measuring {where} on {hi} of the {len(plan.item_ids)} items drawn, where the "
                "decision is open"
            )
            return self.samples_for([lv])
        if step.kind in ("grid", "stage"):
            [lv] = step.levels
            n = plan.batches[0]
            plan.grid_left = [x for x in plan.grid_left if x != lv]
            plan.n_at = plan.n_at | {level_key(lv): n}
            why = (
                "the opening's second stage"
                if step.kind == "stage"
                else "every level below it passes"
            )
            self.console.print(f"measuring {where} on the opening's {n} items: {why}")
            return self.samples_for([lv])
        if step.kind == "scan":
            self.console.print(f"scanning {where} for a dip between passing levels")
            plan.scanned = [*plan.scanned, *(lv for lv in step.levels if lv not in plan.scanned)]
        elif step.kind == "probe":
            self.console.print(f"probing {where} on the opening's items for where accuracy drops")
            plan.probed = [*plan.probed, *(lv for lv in step.levels if lv not in plan.probed)]
        else:
            self.console.print(f"refining: testing {where} where accuracy drops")
            plan.refined = [*plan.refined, *(lv for lv in step.levels if lv not in plan.refined)]
        # the opening's items first where the level stays open only while it has not clearly
        # dropped (design.first_items); the share of the error a midpoint's test gets follows
        # its place among the refined levels, so the design is read after it joins them
        design = design_of(plan) if step.kind == "levels" else None
        ref_n = plan.items_at(plan.chain_reference)
        opening_n = plan.batches[0] if plan.batches else None
        for lv in step.levels:
            final = final_items(design, lv, plan.spec.tolerance) if design is not None else 0
            had = plan.n_at.get(level_key(lv), 0)  # a probe tested as the midpoint: its items
            plan.n_at = plan.n_at | {
                level_key(lv): first_items(step.kind, final, ref_n, opening_n, had)
            }
        plan.levels = sorted(set(plan.levels) | set(step.levels))
        return self.samples_for(list(step.levels))


def _waiting(grid_left: list[float], second: list[float]) -> str:
    """The dry run's note on the levels the opening does not measure first (empty: none)."""
    parts = []
    stage = [f"{lv:g}" for lv in grid_left if lv in second]
    rest = [f"{lv:g}" for lv in grid_left if lv not in second]
    if stage:
        parts.append(f"{', '.join(stage)} once the reference holds the floor")
    if rest:
        parts.append(f"{', '.join(rest)} once every level below passes")
    return f" ({'; '.join(parts)})" if parts else ""


def _endpoint(plan: Plan, opts: RunOptions) -> Endpoint:
    key_env = opts.api_key_env or APIS[plan.spec.api].key_env
    headers = {}
    if opts.bypass:
        token = os.environ.get("CEILING_ADMIN_TOKEN")
        if not token:
            raise UserError("--bypass needs CEILING_ADMIN_TOKEN (the sidecar's admin token)")
        headers["x-ceiling-bypass"] = token
    ep = Endpoint.for_spec(plan.spec, os.environ.get(key_env), headers)
    return replace(ep, batch_poll_s=opts.batch_poll_s) if plan.spec.batch else ep


def _meter(kind: str, base_url: str, console: Console) -> Meter:
    """The sweep's counter: the engine's own tokenizer when it has one (exact fill), else a
    tiktoken encoding (an estimate for other models, said so)."""
    if kind in ("auto", "engine"):
        root = engine_root(base_url)
        engine = SyncEngine(UpstreamSpec(kind="upstream", url=root, style="llamacpp"))
        try:
            engine.count("probe")
            return Meter(TiktokenCounter("o200k_base"), ChatFormat(), engine)
        except Exception as exc:
            engine.close()
            if kind == "engine":
                raise UserError(
                    f"--tokenizer engine: {root}/tokenize is not usable ({exc})"
                ) from exc
            console.print(
                f"[yellow]note:[/] {root} has no /tokenize: counting with o200k_base, an "
                "estimate for other models (pass --tokenize-url ENGINE or --tokenizer)"
            )
    return Meter(TiktokenCounter("o200k_base" if kind == "auto" else kind))


def _reduced_items(base: Plan, items: int | None, tolerance: float) -> list[str]:
    """The baseline's items a regression check pairs against: as many as the tolerance needs for a
    difference in differences (twice the variance of one paired difference), at most all."""
    want = items or items_for(tolerance / 2**0.5, 3)
    return base.item_ids[: min(len(base.item_ids), want)]

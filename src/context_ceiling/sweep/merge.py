"""``ceiling sweep merge``: the shard runs of one sweep (a Kubernetes Indexed Job) into one run.

Shards must agree on everything that defines the measurement and together be each of ``0/n`` ..
``n-1/n`` once; calls are unioned by key (a key in two shards is one call), and the merged plan
is the first shard's with the union of their items.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from context_ceiling.core.errors import UserError
from context_ceiling.sweep.calllog import CallLog
from context_ceiling.sweep.plan import Plan
from context_ceiling.sweep.report import report

#: what every shard of one sweep must share
#: what every shard of one sweep shares: the resolved task set, window and levels, and the spec's
#: model, repeats, seed, output cap and haystacks
SAME = ("taskset", "window", "levels")
SAME_SPEC = ("model", "repeats", "seed", "max_tokens", "shared_haystack")


def merge(out: Path, shards: list[Path], console: Console) -> int:
    plans = [Plan.load(d) for d in shards]
    first = plans[0]
    for p in plans[1:]:
        pairs = [(k, getattr(p, k), getattr(first, k)) for k in SAME]
        pairs += [(k, getattr(p.spec, k), getattr(first.spec, k)) for k in SAME_SPEC]
        for k, mine, theirs in pairs:
            if mine != theirs:
                raise UserError(f"the shards disagree on {k}: they are not parts of one sweep")
    parts = [p.shard for p in plans if p.shard]
    if parts:
        n = parts[0][1]
        indices = sorted(i for i, _ in parts)
        if len(parts) != len(plans) or any(m != n for _, m in parts) or indices != list(range(n)):
            got = ", ".join(f"{i}/{m}" for i, m in parts) or "none"
            raise UserError(
                f"the shards are not one whole sweep: got {got} for {len(plans)} run(s); "
                f"give each of 0/{n}..{n - 1}/{n} once"
            )
    same_items = all(p.item_ids == first.item_ids for p in plans)
    merged_plan = first.model_copy(
        update={
            "shard": None,
            "run_id": out.name,
            "merged_from": [p.run_id for p in plans],
            "item_ids": first.item_ids
            if same_items
            else sorted({i for p in plans for i in p.item_ids}),
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    log = CallLog(out / "calls.jsonl")
    have = set(log.records())
    for d in shards:
        for key, rec in CallLog(d / "calls.jsonl").records().items():
            if key not in have:
                log.append(rec)
                have.add(key)
    merged_plan.save(out)
    console.print(f"merged {len(shards)} shard(s): {len(have)} calls -> {out}")
    return report(out, console)

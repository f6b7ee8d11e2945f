"""Real agent trajectories, and generated loops beside them, replayed turn by turn through the
real sidecar in enforce mode at ceilings of 40% and 70% of each conversation's peak.

The trajectories (``testkit/traffic/trajectories.py``) are model-generated runs of three agent
frameworks from public repositories: a bash-only coding agent on SWE-bench tasks (its harness
inserts format errors as user messages mid-loop), a multi-turn customer-service agent with a
simulated user and 14 tools, and SWE-agent's short coding and CTF runs (function calling, and a
command per reply). Each is written in every API's shape. The generated loops
(``testkit/traffic/agent_loops.py``) run 60, 150 and 300 rounds, with tool results dominating
the history and with tool results a third of it (the rest the model's own text and tool inputs).

Per conversation, API and ceiling:

- rejected, over (forwarded above the budget by an independent recount), invalid (forwarded
  requests that break the provider's tool-use rules);
- events: clearing events the sidecar reported (``x-ceiling-clearing-event``), against the
  bound ``1 + (peak - ceiling) / (clear_at_least x ceiling)``;
- prefix: of the trimmed turns after the first, the share that repeat >= 90% of the previous
  forwarded request byte for byte at their start (what a provider's prefix cache serves);
- uncached and cost: input tokens not served from the cache, and the input cost with cached
  tokens at a tenth, against the same conversation untrimmed;
- reappeared: tool results or rounds cut at one turn and forwarded whole at a later one;
- latest cut: turns where one of the ``keep`` newest tool results was cut while an older one
  was still forwarded whole.

``python -m benchmarks.agent_trajectories [--quick] [--in-process] [--data DIR] [--out out/bench/agent_trajectories.md]``
(``--in-process`` runs ``context_ceiling.fit`` instead of the sidecar: the same decisions, no
HTTP; ``--data DIR`` replays the trajectories ``python -m devtools.trajectory_data --out DIR``
converted from a local clone, for more of them than ship).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.agent_loop import _send, sidecar
from context_ceiling import Policy, count, fit
from context_ceiling.core.vocabulary import Shape
from testkit.traffic.agent_loops import Loop, history_of, prefix_share, provider_valid
from testkit.traffic.trajectories import Trajectory, load_all, turns

APIS: tuple[Shape, ...] = ("openai", "anthropic", "responses", "gemini")
CEILINGS = (0.4, 0.7)
#: what a cached input token costs against an uncached one
CACHED = 0.1

#: generated loops beside the real ones: (name, rounds, result words, input words, parallel)
GENERATED = (
    ("60 rounds, results dominant", 60, (150, 1500), (0, 0), 1),
    ("60 rounds, results a third", 60, (150, 1500), (300, 2400), 1),
    ("150 rounds x 3 parallel, results a third", 150, (100, 600), (150, 900), 3),
    ("300 rounds, results dominant", 300, (150, 1500), (0, 0), 1),
    ("300 rounds, results a third", 300, (150, 1500), (300, 2400), 1),
)

#: one turn through the enforcer: (status, forwarded body or None, trimmed, clearing event)
Send = Callable[[dict[str, Any]], tuple[int, dict[str, Any] | None, bool, bool]]


@dataclass
class Row:
    source: str
    name: str
    api: Shape
    ceiling: float
    peak: int = 0
    budget: int = 0
    turns: int = 0
    trimmed: int = 0
    rejected: int = 0
    over: int = 0
    invalid: int = 0
    events: int = 0
    prefix_turns: int = 0
    prefix_kept: int = 0
    uncached: float = 0.0
    uncached_base: float = 0.0
    cost: float = 0.0
    cost_base: float = 0.0
    reappeared: int = 0
    latest_cut: int = 0
    cut: set[str] = field(default_factory=set)

    @property
    def bound(self) -> float:
        step = Policy().clear_at_least * self.budget
        return 1 + (self.peak - self.budget) / step if self.budget else 0.0

    def passes(self) -> dict[str, bool]:
        """The targets, on this conversation (a third: the ceiling cuts at least a third)."""
        deep = self.peak - self.budget >= self.peak / 3
        return {
            "valid": self.invalid == 0 and self.over == 0,
            "prefix": self.prefix_turns == 0 or self.prefix_kept >= 0.9 * self.prefix_turns,
            "uncached": self.uncached <= 1.5 * self.uncached_base,
            "cost": not deep or self.cost <= 0.9 * self.cost_base,
            "events": self.events <= self.bound,
            "reappeared": self.reappeared == 0,
            "latest": self.latest_cut == 0,
        }


def results_of(api: Shape, body: dict[str, Any]) -> dict[str, str]:
    """Each tool result of a request by its call id, as serialized."""
    out: dict[str, str] = {}
    for m in history_of(api, body):
        if api == "openai" and m.get("role") == "tool":
            out[m["tool_call_id"]] = orjson.dumps(m.get("content")).decode()
        elif api == "responses" and m.get("type") == "function_call_output":
            out[m["call_id"]] = orjson.dumps(m.get("output")).decode()
        elif api == "anthropic" and isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out[b["tool_use_id"]] = orjson.dumps(b.get("content")).decode()
        elif api == "gemini":
            for p in m.get("parts") or []:
                fr = p.get("functionResponse") if isinstance(p, dict) else None
                if isinstance(fr, dict):
                    out[str(fr.get("id"))] = orjson.dumps(fr.get("response")).decode()
    return out


def sent_bytes(api: Shape, body: dict[str, Any]) -> bytes:
    """What a prefix cache compares: the system prompt, then the history, as serialized."""
    system = body.get({"anthropic": "system", "responses": "instructions"}.get(api, "-"))
    if api == "gemini":
        system = body.get("systemInstruction")
    return orjson.dumps([system, history_of(api, body)])


def _uncached(prev: bytes | None, cur: bytes, tokens: int) -> float:
    """The tokens of a request a prefix cache does not serve: the share of its bytes after the
    longest prefix it shares with the previous request."""
    if prev is None:
        return float(tokens)
    common = prefix_share(prev, cur) * len(prev.rstrip(b"]}"))
    return tokens * (1 - min(1.0, common / max(1, len(cur))))


def replay(row: Row, bodies: list[dict[str, Any]], send: Send, keep: int = 3) -> Row:
    """Every turn of one conversation through ``send``, judged into ``row``."""
    prev = prev_base = None
    for body in bodies:
        row.turns += 1
        whole = sent_bytes(row.api, body)
        tokens = count(body, shape=row.api).total
        base = _uncached(prev_base, whole, tokens)
        row.uncached_base += base
        row.cost_base += base + CACHED * (tokens - base)
        prev_base = whole
        status, sent, trimmed, event = send(body)
        if sent is None:
            row.rejected += status == 400
            continue
        row.events += event
        forwarded = count(sent, shape=row.api).total
        row.over += forwarded > row.budget
        row.invalid += not provider_valid(row.api, sent)
        cur = sent_bytes(row.api, sent)
        unc = _uncached(prev, cur, forwarded)
        row.uncached += unc
        row.cost += unc + CACHED * (forwarded - unc)
        if trimmed:
            if row.trimmed and prev is not None:
                row.prefix_turns += 1
                row.prefix_kept += prefix_share(prev, cur) >= 0.9
            row.trimmed += 1
        prev = cur
        given, got = results_of(row.api, body), results_of(row.api, sent)
        for cid, text in given.items():
            if got.get(cid) != text:
                row.cut.add(cid)
            elif cid in row.cut:
                row.reappeared += 1
                row.cut.discard(cid)
        ids = list(given)
        cut_at = max(0, len(ids) - keep)
        newest, older = ids[cut_at:], ids[:cut_at]
        if any(got.get(c) != given[c] for c in newest) and any(
            got.get(c) == given[c] for c in older
        ):
            row.latest_cut += 1
    return row


def in_process(api: Shape, budget: int) -> Send:
    def send(body: dict[str, Any]) -> tuple[int, dict[str, Any] | None, bool, bool]:
        out, report = fit(body, shape=api, budget=budget)
        if not report.fits:
            return 400, None, False, False
        return 200, out, report.trimmed > 0, report.clearing_event

    return send


def via_sidecar(client: httpx.Client, url: str, double: Any, api: Shape) -> Send:
    def send(body: dict[str, Any]) -> tuple[int, dict[str, Any] | None, bool, bool]:
        r = _send(client, url, api, body)
        if r.status_code != 200:
            return r.status_code, None, False, False
        trimmed = int(r.headers.get("x-ceiling-trimmed-tokens", "0")) > 0
        event = r.headers.get("x-ceiling-clearing-event") == "1"
        return 200, orjson.loads(double.last), trimmed, event

    return send


def _trajectory(t: Trajectory, api: Shape) -> list[dict[str, Any]]:
    return list(turns(t, api))


def _generated(
    rounds: int, out: tuple[int, int], inp: tuple[int, int], parallel: int, api: Shape
) -> list[dict[str, Any]]:
    return list(Loop(api, rounds, out, parallel, seed=1, input_words=inp).turns())


Bodies = Callable[[Shape], list[dict[str, Any]]]


def conversations(quick: bool, data: Path | None = None) -> list[tuple[str, str, Bodies]]:
    """(source, name, the bodies of its turns in an API's shape) for every conversation: the
    shipped trajectories and the generated loops, or only the trajectories converted into
    ``data`` (``devtools.trajectory_data --out``)."""
    found = load_all() if data is None else load_all(data=data)
    if quick:
        found = [t for t in found if t.framework == "tau-bench"][:1] + [
            t for t in found if t.framework == "mini-swe-agent"
        ][:1]
    out: list[tuple[str, str, Bodies]] = [
        (t.framework, t.name, functools.partial(_trajectory, t)) for t in found
    ]
    generated = GENERATED[: 1 if quick else None] if data is None else ()
    for name, rounds, out_words, in_words, parallel in generated:
        bodies = functools.partial(_generated, rounds, out_words, in_words, parallel)
        out.append(("generated", name, bodies))
    return out


def run(quick: bool, through_sidecar: bool, data: Path | None = None) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for source, name, bodies_of in conversations(quick, data):
            for api in APIS[:2] if quick else APIS:
                bodies = bodies_of(api)
                peak = max(count(b, shape=api).total for b in bodies)
                for ceiling in CEILINGS:
                    budget = int(ceiling * peak)
                    row = Row(source, name, api, ceiling, peak=peak, budget=budget)
                    if through_sidecar:
                        with sidecar({}, budget, Path(tmp)) as (url, d), httpx.Client() as client:
                            replay(row, bodies, via_sidecar(client, url, d, api))
                    else:
                        replay(row, bodies, in_process(api, budget))
                    rows.append(row)
                print(f"{source} / {name} / {api}: done", file=sys.stderr)
    return rows


def report(rows: Iterable[Row]) -> str:
    lines = [
        "| source | conversation | API | ceiling | turns | trimmed | rejected | invalid / over "
        "| events (bound) | prefix >= 90% | uncached | cost | reappeared | latest cut |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        prefix = f"{r.prefix_kept / r.prefix_turns:.0%}" if r.prefix_turns else "-"
        lines.append(
            f"| {r.source} | {r.name} | {r.api} | {r.ceiling:.0%} | {r.turns} | {r.trimmed} | "
            f"{r.rejected} | {r.invalid} / {r.over} | {r.events} ({r.bound:.1f}) | {prefix} | "
            f"x{r.uncached / max(1, r.uncached_base):.2f} | x{r.cost / max(1, r.cost_base):.2f} | "
            f"{r.reappeared} | {r.latest_cut} |"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """Per source and ceiling: conversations x APIs meeting each target, and the ranges."""
    lines = [
        "| source | ceiling | runs | rejected | valid | prefix | uncached (max) | cost (max) "
        "| events within bound | reappeared | latest cut |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r.source, r.ceiling) for r in rows})
    for source, ceiling in keys:
        group = [r for r in rows if r.source == source and r.ceiling == ceiling]
        ok = [r.passes() for r in group]
        n = len(group)

        def share(k: str, ok: list[dict[str, bool]] = ok) -> str:
            return f"{sum(o[k] for o in ok)}/{len(ok)}"

        unc = max(r.uncached / max(1, r.uncached_base) for r in group)
        cost = max(r.cost / max(1, r.cost_base) for r in group)
        lines.append(
            f"| {source} | {ceiling:.0%} | {n} | {sum(r.rejected for r in group)} | "
            f"{share('valid')} | {share('prefix')} | x{unc:.2f} | x{cost:.2f} | "
            f"{share('events')} | {sum(r.reappeared for r in group)} | "
            f"{sum(r.latest_cut for r in group)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two trajectories, one loop, two APIs")
    ap.add_argument("--in-process", action="store_true", help="fit() instead of the sidecar")
    ap.add_argument("--out", default="out/bench/agent_trajectories.md")
    ap.add_argument(
        "--data",
        type=Path,
        help="replay the trajectories converted into this folder (devtools.trajectory_data --out)"
        " instead of the shipped ones and the generated loops",
    )
    args = ap.parse_args()
    rows = run(args.quick, not args.in_process, args.data)
    text = summary(rows) + "\n\n" + report(rows)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()

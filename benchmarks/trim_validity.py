"""Does trimming keep agent traffic valid, honest and minimal? Side by side with LiteLLM.

Generated conversations of both APIs (``testkit/traffic/agent_traffic.py``: agent loops with parallel tool
calls, tool results plus text in one Anthropic user message, thinking, documents, search
results, images, cache_control, prefill, RAG) are fitted at random budgets with
``context_ceiling.core.trim.fit`` and judged by validators of the providers' published rules. Reported per
API: requests the provider would reject, "fits" that are over budget, ``after`` against a recount,
and, at 1% over budget, how much was removed against what was needed. For OpenAI-shaped traffic
LiteLLM's ``trim_messages`` (its own venv, ``scripts/litellm.sh``) runs on the same conversations
and budgets, judged the same way.

``python -m benchmarks.trim_validity [--n 10000] [--seed 1] [--no-litellm]``
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN, Part
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.core.trim import Policy
from context_ceiling.core.utilization import Component
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import fit
from context_ceiling.formats.anthropic import count as count_anthropic
from context_ceiling.formats.openai_chat import count as count_openai
from testkit.traffic.agent_traffic import KINDS, generate, violations

ENC = TiktokenCounter("o200k_base")
CHUNKS = re.compile(DEFAULT_CHUNK_PATTERN)
LITELLM = Path.home() / ".cache" / "context-ceiling" / "litellm" / "bin" / "python"
LITELLM_SCRIPT = """
import json, sys
from litellm.utils import trim_messages
jobs = json.load(open(sys.argv[1]))
out = []
for j in jobs:
    try:
        out.append(trim_messages(j["messages"], model="gpt-4o", max_tokens=j["budget"]))
    except Exception as exc:
        out.append({"error": type(exc).__name__})
json.dump(out, open(sys.argv[2], "w"))
"""


def count(api: str, body: dict[str, Any]) -> Any:
    fn = count_openai if api == "openai" else count_anthropic
    return fn(body, ENC, None, CHUNKS)


def largest_unit(api: str, body: dict[str, Any], parts: list[Part]) -> int:
    """The largest thing one trimming step may remove whole: a retrieved chunk or a turn."""
    chunk = max((p.tokens for p in parts if p.component is Component.RETRIEVED), default=0)
    turn, best = 0, 0
    for i, m in enumerate(body["messages"]):
        starts = m.get("role") == "user" and not (
            api == "anthropic"
            and isinstance(m.get("content"), list)
            and any(b.get("type") == "tool_result" for b in m["content"])
        )
        if starts:
            best, turn = max(best, turn), 0
        turn += sum(p.tokens for p in parts if p.message == i)
    return max(chunk, best, turn)


def run_api(api: str, n: int, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    shape: Shape = api
    rng = random.Random(seed)
    invalid = fits_over = after_off = 0
    ratios: list[float] = []
    by_kind: dict[str, list[float]] = {k: [] for k in KINDS[api]}
    beyond_unit = 0
    jobs = []
    t0 = time.perf_counter()
    for k in range(n):
        kind = KINDS[api][k % len(KINDS[api])]
        body = generate(api, rng, kind)
        c = count(api, body)
        budget = int(c.total * rng.uniform(0.05, 1.0))
        out, report = fit(
            body, shape=shape, budget=budget, count=c, policy=Policy(tool_result_max_tokens=64)
        )
        after = count(api, out).total
        invalid += bool(violations(api, out))
        fits_over += report.fits and after > budget
        after_off += report.after != after
        # at 1% over budget: removed against needed
        tight = int(c.total / 1.01)
        _out2, rep2 = fit(
            body, shape=shape, budget=tight, count=c, policy=Policy(tool_result_max_tokens=64)
        )
        if rep2.fits:
            needed = c.total - tight
            removed = c.total - rep2.after
            ratios.append(removed / needed)
            by_kind[kind].append(removed / needed)
            beyond_unit += removed > needed + largest_unit(api, body, c.parts)
        if api == "openai":
            jobs.append({"messages": body["messages"], "budget": budget, "total": c.total})
    elapsed = time.perf_counter() - t0
    ratios.sort()
    return (
        {
            "api": api,
            "conversations": n,
            "invalid": invalid,
            "fits_but_over": fits_over,
            "after_not_recount": after_off,
            "median_removed_over_needed": statistics.median(ratios) if ratios else None,
            "p90_removed_over_needed": ratios[int(0.9 * (len(ratios) - 1))] if ratios else None,
            "removed_beyond_needed_plus_one_unit": beyond_unit,
            "median_by_kind": {k: round(statistics.median(v), 2) for k, v in by_kind.items() if v},
            "seconds": round(elapsed, 1),
        },
        jobs,
    )


def litellm(jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not LITELLM.exists():
        return None
    with tempfile.TemporaryDirectory() as d:
        src, dst, script = Path(d) / "in.json", Path(d) / "out.json", Path(d) / "t.py"
        src.write_text(json.dumps(jobs))
        script.write_text(LITELLM_SCRIPT)
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"}
        r = subprocess.run(
            [str(LITELLM), str(script), str(src), str(dst)], capture_output=True, text=True, env=env
        )
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return None
        outs = json.loads(dst.read_text())
    invalid = over = altered = 0
    for job, out in zip(jobs, outs, strict=True):
        if isinstance(out, dict):  # it raised
            invalid += 1
            continue
        body = {"model": "gpt-4o", "messages": out}
        invalid += bool(violations("openai", body)) or not out
        over += count("openai", body).total > job["budget"]
        originals = {m["x_id"]: m for m in job["messages"]}
        altered += any(m.get("x_id") in originals and m != originals[m["x_id"]] for m in out)
    return {
        "api": "openai (LiteLLM trim_messages)",
        "conversations": len(jobs),
        "invalid": invalid,
        "fits_but_over": over,
        "altered_kept_messages": altered,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| trimmer | conversations | provider-invalid outputs | over budget | after != recount | "
        "removed / needed at 1% over (median, p90) | removed > needed + one unit |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    kinds = [
        f"{r['api']}: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["median_by_kind"].items())
        for r in rows
        if r.get("median_by_kind")
    ]
    for r in rows:
        med = r.get("median_removed_over_needed")
        ratio = f"{med:.2f}x, {r['p90_removed_over_needed']:.2f}x" if med is not None else "-"
        lines.append(
            f"| {r['api']} | {r['conversations']:,} | {r['invalid']:,} | {r['fits_but_over']:,} | "
            f"{r.get('after_not_recount', '-')} | {ratio} | "
            f"{r.get('removed_beyond_needed_plus_one_unit', '-')} |"
        )
    return (
        "\n".join(lines) + "\n\nmedian removed / needed at 1% over, by shape: " + "; ".join(kinds)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="conversations per API")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-litellm", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    jobs: list[dict[str, Any]] = []
    for api in ("openai", "anthropic"):
        row, j = run_api(api, args.n, args.seed)
        rows.append(row)
        jobs += j
    if not args.no_litellm:
        peer = litellm(jobs)
        if peer is not None:
            rows.append(peer)
            print(f"LiteLLM altered kept messages in {peer['altered_kept_messages']:,} outputs")
        else:
            print("(LiteLLM not installed: bash scripts/litellm.sh)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

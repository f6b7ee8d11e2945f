"""Trimming cost at 10k, 100k and 1M tokens: must grow about linearly.

Each request is an agent/RAG conversation (system prompt, turns with tool calls and results,
retrieved chunks in the latest message) fitted to half its size, so every stage runs. Reports
the count (one tokenization) and the fit (no re-tokenization of the whole) separately, medians
over repeats, and the growth ratio 1M/100k (linear would be 10x).
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from typing import Any

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.tokenizers import RequestMemo, TiktokenCounter
from context_ceiling.core.trim import Policy
from context_ceiling.formats import fit
from context_ceiling.formats.openai_chat import count as count_openai

CLAUSE = "Clause {i}: the renewal fee of contract K-{i} is {f} EUR; notice {n} days; governed by the law of Ruritania. "


def conversation(tokens: int) -> dict[str, Any]:
    per_turn = 2000
    turns = max(1, tokens // (2 * per_turn))
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a contracts assistant. " * 20}
    ]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Question {t}: what changed in contract K-{t}?"})
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{t}",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "K"}'},
                    }
                ],
            }
        )
        msgs.append(
            {"role": "tool", "tool_call_id": f"c{t}", "content": CLAUSE.format(i=t, f=t, n=t) * 45}
        )
        msgs.append({"role": "assistant", "content": "Noted. " * 20})
    chunks = "\n".join(
        f'<document id="{i}">' + CLAUSE.format(i=i, f=i, n=i) * 20 + "</document>"
        for i in range(max(1, tokens // 2 // 560))
    )
    msgs.append({"role": "user", "content": chunks + "\nWhich contract has the lowest fee?"})
    return {"model": "gpt-4o", "messages": msgs}


def measure() -> dict[str, Any]:
    enc = TiktokenCounter("o200k_base")
    pattern = re.compile(DEFAULT_CHUNK_PATTERN)
    rows: list[dict[str, Any]] = []
    for size in (10_000, 100_000, 1_000_000):
        body = conversation(size)
        reps = 5 if size < 1_000_000 else 3
        counts, fits = [], []
        for _ in range(reps):
            # as the sidecar does it: one per-request memo, so the recount after trimming
            # encodes only the texts the trimmer rewrote
            memo = RequestMemo(enc)
            t0 = time.perf_counter()
            c = count_openai(body, memo, None, pattern)
            t1 = time.perf_counter()
            _, report = fit(
                body,
                shape="openai",
                budget=c.total // 2,
                counter=memo,
                count=c,
                policy=Policy(tool_result_max_tokens=256),
                chunk_pattern=pattern,
            )
            t2 = time.perf_counter()
            counts.append(t1 - t0)
            fits.append(t2 - t1)
        assert report.fits
        rows.append(
            {
                "tokens": c.total,
                "count_ms": statistics.median(counts) * 1e3,
                "fit_ms": statistics.median(fits) * 1e3,
                "removed": dict(report.removed),
            }
        )
    r100, r1m = rows[1], rows[2]
    return {
        "rows": rows,
        "growth_1m_over_100k": (r1m["count_ms"] + r1m["fit_ms"])
        / (r100["count_ms"] + r100["fit_ms"]),
        "count_growth": r1m["count_ms"] / r100["count_ms"],
        "fit_growth": r1m["fit_ms"] / r100["fit_ms"],
    }


def table(m: dict[str, Any]) -> list[str]:
    """The Markdown table of a ``measure()`` result (printed here and in ``run.py``'s report)."""
    lines = [
        "| tokens | count ms | fit ms (no re-tokenization of the whole) | removed: tool results / retrieved / history |",
        "|---:|---:|---:|---|",
    ]
    for r in m["rows"]:
        rm = r["removed"]
        lines.append(
            f"| {r['tokens']:,} | {r['count_ms']:.1f} | {r['fit_ms']:.2f} | "
            f"{rm['tool_results']:,} / {rm['retrieved']:,} / {rm['history']:,} |"
        )
    return lines


def main() -> int:
    m = measure()
    print("\n".join(table(m)))
    print(
        f"\ngrowth 100k -> 1M (10x tokens): count x{m['count_growth']:.1f}, fit x{m['fit_growth']:.1f}, "
        f"count+fit x{m['growth_1m_over_100k']:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make bench``: the sidecar side by side with the alternatives, in one run on one machine.

Against the same loopback upstream (``upstream_double``, a test double for a hosted API that
answers at once, so everything measured is proxy cost): the client calling it directly, a bare
pass-through proxy, LiteLLM's proxy, the sidecar observing, and the sidecar enforcing a ceiling that
trims every request. Load comes from a separate process (``wrk``; ``hey`` for the time to first
byte of streams) at concurrency 1, 16 and 64, for
requests of 1k, 8k and 64k tokens (RAG-shaped: retrieved chunks in the user turn), streamed and
not. Each figure is a median over rounds with the min-max; targets are visited in a rotated order
each round, and every ratio is paired with the direct run of the same round. Also measured: CPU
time per request and peak RSS of each proxy's process tree, token counting against raw tiktoken,
trimming growth (``trim.py``), and memory under 500 concurrent slow streams (``streams.py``).
Writes ``out/bench/results.json`` and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks import targets as tg
from benchmarks.bodies import body_of, body_path
from benchmarks.load import LEAD_IN, Load, fmt, hey, lead_in, spread, wrk
from benchmarks.paired import pairs_of_every_cell, pairs_table
from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.tokenizers import TiktokenCounter, TokenizerError
from context_ceiling.formats.openai_chat import count as count_openai

ROOT = Path(__file__).resolve().parent.parent

#: the upstream itself first, then every target of the main table (the baselines of a paired
#: run only, ``targets.PAIRED_ONLY``, left out: ``python -m benchmarks.paired answers-off sidecar``)
ORDER = ["direct", *(n for n in tg.NAMES if n not in tg.PAIRED_ONLY)]


def counting(body: bytes, text: str, reps: int) -> dict[str, Any]:
    """One whole-request count (parse + walk + find chunks + tokenize) against raw tiktoken on the
    same text, and the same count encoded by tiktoken and by gigatoken instead of riptoken
    (``counting.bpe``); best of ``reps`` each (gigatoken's piece cache warm: the same body)."""
    import re

    enc = TiktokenCounter("o200k_base", "riptoken")
    slow = TiktokenCounter("o200k_base", "tiktoken")
    try:
        giga: TiktokenCounter | None = TiktokenCounter("o200k_base", "gigatoken")
    except TokenizerError:
        giga = None
    raw = enc.encoding.encode_ordinary
    pattern = re.compile(DEFAULT_CHUNK_PATTERN)

    def best_time(fn: Any) -> float:
        # the minimum, as timeit advises: noise only ever adds time
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    t_raw = best_time(lambda: raw(text))
    t_ours = best_time(lambda: count_openai(orjson.loads(body), enc, None, pattern))
    t_slow = best_time(lambda: count_openai(orjson.loads(body), slow, None, pattern))
    out = {
        "raw_tiktoken_ms": t_raw * 1e3,
        "sidecar_count_ms": t_ours * 1e3,
        "sidecar_count_tiktoken_ms": t_slow * 1e3,
        "bpe": enc.engine,
        "ratio": t_ours / t_raw,
    }
    if giga is not None:
        out["sidecar_count_gigatoken_ms"] = 1e3 * best_time(
            lambda: count_openai(orjson.loads(body), giga, None, pattern)
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="load duration per measurement")
    ap.add_argument(
        "--lead-in",
        type=float,
        default=LEAD_IN,
        help="seconds of the same load, not measured, before each measurement (0: none)",
    )
    ap.add_argument(
        "--sizes", type=tg.sizes_arg, default=list(tg.SIZES), help="tokens, comma-separated"
    )
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--targets", default=",".join(ORDER))
    ap.add_argument("--streams", type=int, default=500, help="concurrent slow streams (0: skip)")
    ap.add_argument(
        "--pairs",
        type=int,
        default=15,
        help="c=1 rounds of the bare pass-through against the sidecar back to back (0: skip)",
    )
    ap.add_argument("--no-trim", action="store_true", help="skip the trimming growth benchmark")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ceiling-bench-"))
    hey_bin, wrk_bin = tg.binary("hey"), tg.binary("wrk")
    sizes: list[int] = args.sizes
    levels = [int(c) for c in args.concurrency.split(",")]
    wanted = args.targets.split(",")

    up = tg.upstream(work)
    base = up.url.removesuffix("/v1/chat/completions")
    started: dict[str, tg.Target] = {"direct": up}
    try:
        for name in sorted(ORDER[1:], key=lambda n: n == "litellm"):  # LiteLLM last: slowest
            if name not in wanted:
                continue
            t = tg.start(name, base, work)
            if t is None:  # only LiteLLM can be missing
                print("LiteLLM is not installed (bash scripts/litellm.sh); measuring without it")
            else:
                started[name] = t
        names = [n for n in ORDER if n in started]
        for t in started.values():
            t.start_sampling()
        cells: list[dict[str, Any]] = []
        for size in sizes:
            for stream in (False, True):
                body, text = body_of(size, stream)
                path = body_path(work, size, stream)
                path.write_bytes(body)
                for n in names:  # warm up: connections, caches, LiteLLM's first-call setup
                    hey(hey_bin, started[n].url, path, 4, 0.5)
                for conc in levels:
                    rounds: list[dict[str, tuple[Load, float]]] = []
                    for r in range(args.rounds):
                        order = names[r % len(names) :] + names[: r % len(names)]
                        this: dict[str, tuple[Load, float]] = {}
                        for name in order:
                            t = started[name]
                            # sustained load: not the CPU credit a target saved up while the
                            # others ran (benchmarks/load.py, LEAD_IN)
                            lead_in(wrk_bin, t.url, path, conc, args.lead_in)
                            cpu0 = t.cpu_seconds()
                            load = wrk(wrk_bin, t.url, path, conc, args.seconds)
                            cpu = t.cpu_seconds() - cpu0
                            if stream:  # the first byte of a stream, from hey's per-request rows
                                ttfb = hey(hey_bin, t.url, path, conc, 1.0).ttfb_p50
                                load = dataclasses.replace(load, ttfb_p50=ttfb)
                            this[name] = (load, cpu)
                        rounds.append(this)
                    cell: dict[str, Any] = {
                        "tokens": size,
                        "stream": stream,
                        "concurrency": conc,
                        "targets": {},
                        "rounds": [
                            {
                                n: {
                                    "rps": ld.rps,
                                    "p50_ms": ld.p50 * 1e3,
                                    "p99_ms": ld.p99 * 1e3,
                                    "ttfb_ms": ld.ttfb_p50 * 1e3,
                                }
                                for n, (ld, _) in rd.items()
                            }
                            for rd in rounds
                        ],
                    }
                    for name in names:
                        loads = [rd[name][0] for rd in rounds]
                        cpu_ms = [rd[name][1] / max(1, rd[name][0].requests) * 1e3 for rd in rounds]
                        row: dict[str, Any] = {
                            "rps": spread([x.rps for x in loads]),
                            "p50_ms": spread([x.p50 * 1e3 for x in loads]),
                            "p99_ms": spread([x.p99 * 1e3 for x in loads]),
                            "errors": sum(x.errors for x in loads),
                            "cpu_ms_per_request": spread(cpu_ms),
                        }
                        if name != "direct":
                            row["rps_vs_direct"] = spread(
                                [rd[name][0].rps / rd["direct"][0].rps for rd in rounds]
                            )
                            row["added_p50_ms"] = spread(
                                [(rd[name][0].p50 - rd["direct"][0].p50) * 1e3 for rd in rounds]
                            )
                            row["added_p99_ms"] = spread(
                                [(rd[name][0].p99 - rd["direct"][0].p99) * 1e3 for rd in rounds]
                            )
                            if stream:
                                row["added_ttfb_ms"] = spread(
                                    [
                                        (rd[name][0].ttfb_p50 - rd["direct"][0].ttfb_p50) * 1e3
                                        for rd in rounds
                                    ]
                                )
                        cell["targets"][name] = row
                    if conc == levels[0]:
                        cell["counting"] = counting(body, text, 20 if size > 8000 else 100)
                    cells.append(cell)
                    s = cell["targets"]
                    print(
                        f"{size:>6} tok stream={stream!s:5} c={conc:<3} "
                        + "  ".join(
                            f"{n} {s[n]['rps']['median']:.0f}/s"
                            + (
                                f" +{s[n]['added_p50_ms']['median']:.2f}ms"
                                if "added_p50_ms" in s[n]
                                else ""
                            )
                            for n in names
                        ),
                        flush=True,
                    )
        paired = (
            pairs_of_every_cell(started, sizes, args.pairs, wrk_bin, work) if args.pairs else []
        )
        peak = {n: started[n].peak_rss / 2**20 for n in names}
        actions = {
            n: tg.over_ceiling(started[n])
            for n in ("sidecar", "default", "first", "bounded", "workers", "cached", "enforce")
            if n in started
        }
    finally:
        for t in started.values():
            t.stop()

    from benchmarks.streams import slow_streams
    from benchmarks.trim import measure as trim_measure

    streams = slow_streams(work, args.streams) if args.streams else None
    trim = None if args.no_trim else trim_measure()
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.platform(terse=True)}"
    )
    result = {
        "machine": machine,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "lead_in": args.lead_in,
        "targets": names,
        "cells": cells,
        "c1_paired": paired,
        "peak_rss_mib": peak,
        "over_ceiling": actions,
        "slow_streams": streams,
        "trim": trim,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


def report(res: dict[str, Any]) -> str:
    """The report's tables and the target verdicts, from a results.json."""
    from benchmarks.verdicts import verdicts

    names = res["targets"]
    lines = [
        f"Machine: {res['machine']}; {res['rounds']} rounds of {res['seconds']:g} s per "
        f"measurement, each after {res.get('lead_in', 0):g} s of the same load (sustained "
        "load), load from `wrk` (1 thread) in its own process, time to first byte from "
        "`hey`; median (min-max) over rounds; ratios "
        "and added latency paired with the direct run of the same round.",
        "",
        "| tokens | stream | c | target | req/s | vs direct | added p50 ms | added p99 ms | added TTFB ms | CPU ms/req |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res["cells"]:
        for n in names:
            t = c["targets"][n]
            lines.append(
                f"| {c['tokens']:,} | {'yes' if c['stream'] else 'no'} | {c['concurrency']} | {n} | "
                f"{fmt(t['rps'], 0)} | {fmt(t.get('rps_vs_direct'))} | {fmt(t.get('added_p50_ms'))} | "
                f"{fmt(t.get('added_p99_ms'))} | {fmt(t.get('added_ttfb_ms'))} | "
                f"{fmt(t['cpu_ms_per_request'])} |"
                + (f" {t['errors']} errors" if t["errors"] else "")
            )
    lines += ["", *readme_tables(res)]
    lines += ["", "Peak RSS of each process tree over the whole run (MiB): "]
    lines[-1] += ", ".join(f"{n} {v:.0f}" for n, v in res["peak_rss_mib"].items())
    for n, acts in res.get("over_ceiling", {}).items():
        lines.append(f"Requests over the ceiling, by action ({n}): {acts}")
    s = res["slow_streams"]
    if s:
        lines += [
            "",
            f"{s['streams']} concurrent slow streams ({s['seconds']:g} s each), RSS in MiB: "
            + "; ".join(
                f"{n}: {v['completed']} completed, idle {v['idle_mib']:.1f}, peak {v['peak_mib']:.1f} "
                f"(+{v['per_stream_kib']:.0f} KiB per stream), after {v['after_mib']:.1f}"
                for n, v in s["targets"].items()
            ),
        ]
    if res["trim"]:
        from benchmarks.trim import table

        lines += ["", *table(res["trim"])]
    lines += ["", "| target | figure | verdict |", "|---|---|---|"]
    for v in verdicts(res):
        lines.append(f"| {v['target']} | {v['figure']} | {'met' if v['met'] else '**missed**'} |")
    return "\n".join(lines)


def _levers(res: dict[str, Any]) -> list[str]:
    """The levers against each other at c=16, as paired throughput ratios."""
    pairs = [
        ("exact vs LiteLLM", "sidecar", "litellm"),
        ("exact, tiktoken, vs LiteLLM", "tiktoken", "litellm"),
        ("riptoken vs tiktoken (exact)", "sidecar", "tiktoken"),
        ("exact, gigatoken, vs LiteLLM", "gigatoken", "litellm"),
        ("gigatoken vs riptoken (exact)", "gigatoken", "sidecar"),
        ("exact, counted first, vs LiteLLM", "first", "litellm"),
        ("default vs LiteLLM", "default", "litellm"),
        ("default vs bare on aiohttp", "default", "bare-aiohttp"),
        ("bounded vs LiteLLM", "bounded", "litellm"),
        ("2 workers (exact) vs LiteLLM", "workers", "litellm"),
        ("bounded vs bare", "bounded", "bare"),
        ("bounded vs bare on aiohttp", "bounded", "bare-aiohttp"),
        ("enforce vs observe, both counted first", "first", "enforce"),
        ("enforce vs observe as deployed", "sidecar", "enforce"),
    ]
    cells = [c for c in res["cells"] if c["concurrency"] == 16]
    have = [x for x in pairs if all(x[1] in c["targets"] and x[2] in c["targets"] for c in cells)]
    out = [
        "| tokens | stream | "
        + " | ".join(h for h, _, _ in have)
        + " | CPU ms/req first -> exact -> bounded |",
        "|---:|---|" + "---:|" * (len(have) + 1),
    ]
    for c in cells:
        row = [
            "x" + fmt(spread([r[a]["rps"] / r[b]["rps"] for r in c["rounds"]])) for _, a, b in have
        ]
        cpu = " -> ".join(
            f"{c['targets'][n]['cpu_ms_per_request']['median']:.2f}"
            for n in ("first", "sidecar", "bounded")
            if n in c["targets"]
        )
        out.append(
            f"| {c['tokens']:,} | {'yes' if c['stream'] else 'no'} | "
            + " | ".join(row)
            + f" | {cpu} |"
        )
    return out


def readme_tables(res: dict[str, Any]) -> list[str]:
    """The report's two summary tables: concurrency 16 against LiteLLM (paired per round), and
    the latency each proxy adds at concurrency 1."""
    names = [n for n in res["targets"] if n != "direct"]
    out = [
        "| tokens | stream | target | req/s | vs LiteLLM (paired) | added p50 ms | added TTFB ms "
        "| CPU ms/req |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in (c for c in res["cells"] if c["concurrency"] == 16):
        for n in names:
            t = c["targets"][n]
            vs = (
                fmt(spread([r[n]["rps"] / r["litellm"]["rps"] for r in c["rounds"]]))
                if "litellm" in c["targets"] and n != "litellm"
                else None
            )
            out.append(
                f"| {c['tokens']:,} | {'yes' if c['stream'] else 'no'} | {n} | {fmt(t['rps'], 0)} "
                f"| {'x' + vs if vs else '-'} | {fmt(t.get('added_p50_ms'))} "
                f"| {fmt(t.get('added_ttfb_ms'))} | {fmt(t['cpu_ms_per_request'])} |"
            )
    out += ["", *_levers(res)]
    one = [c for c in res["cells"] if c["concurrency"] == 1]
    cols = [
        n
        for n in names
        if n in ("bare", "bare-aiohttp", "sidecar", "gigatoken", "first", "bounded")
    ]
    out += [
        "",
        "| tokens | stream | direct p50 ms | "
        + " | ".join(f"{n} added p50 ms" for n in cols)
        + " | counting ms | LiteLLM added p50 ms |",
        "|---:|---|---:|" + "---:|" * (len(cols) + 2),
    ]
    for c in one:
        t = c["targets"]
        k = c.get("counting") or {}
        giga = (
            f"; with gigatoken {k['sidecar_count_gigatoken_ms']:.2f}"
            if "sidecar_count_gigatoken_ms" in k
            else ""
        )
        counting = (
            f"{k['sidecar_count_ms']:.2f} (raw tiktoken {k['raw_tiktoken_ms']:.2f}; counted "
            f"with tiktoken {k['sidecar_count_tiktoken_ms']:.2f}{giga})"
            if k and "sidecar_count_tiktoken_ms" in k
            else (
                f"{k['sidecar_count_ms']:.2f} (tiktoken {k['raw_tiktoken_ms']:.2f})" if k else "-"
            )
        )
        out.append(
            f"| {c['tokens']:,} | {'yes' if c['stream'] else 'no'} | {fmt(t['direct']['p50_ms'])} | "
            + " | ".join(fmt(t[n].get("added_p50_ms")) for n in cols)
            + f" | {counting} | {fmt(t['litellm'].get('added_p50_ms')) if 'litellm' in t else '-'} |"
        )
    out += pairs_table(res.get("c1_paired") or [])
    return out


if __name__ == "__main__":
    sys.exit(main())

"""Latency at concurrency 1 measured in tight pairs: the instrument for a sub-millisecond claim.

The main table visits every target once a round, so two targets' c=1 figures are taken tens of
seconds apart, and on a shared 2-core machine the p50 of one target drifts by ±0.5 ms between
hours. A claim like "within 0.5 ms of the bare pass-through" cannot be judged from three such
rounds. Here the compared targets run back to back, in alternating order, for many short rounds;
each round gives one difference (p50, and CPU per request), and the figure is their median with
the min-max. Drift slower than a round cancels out.

``python -m benchmarks.paired BASELINE TARGET...`` runs only those (any target of
:func:`benchmarks.targets.start` but LiteLLM, whose seconds-long rounds this instrument is not
for) in front of the upstream double, 15 pairs per cell, and prints the table: with no other
target alive (e.g. ``bare-aiohttp bounded``). ``-c N`` pairs them at concurrency N
instead, and each round also gives the baseline's throughput over the target's: the instrument for
"enforcing within 1.2x of observing" (``-c 16 first enforce``), a ratio that three
rotated rounds of the full run, on a machine whose throughput drifts by a third between rounds,
cannot resolve either. ``--pause S`` lets each target idle S seconds before each of its rounds:
traffic that returns after a pause, where a target spends what it saved up while idle
(``-c 16 --pause 10 credit-10s default``); ``--rounds`` and ``--sizes`` narrow the run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import targets as tg
from benchmarks.bodies import body_of, body_path
from benchmarks.load import LEAD_IN, fmt, lead_in, spread, wrk

#: the compared targets, the baseline first
COMPARED = ("bare", "bounded", "sidecar", "gigatoken")


def measure(
    started: dict[str, tg.Target],
    names: list[str],
    body: Path,
    rounds: int,
    seconds: float,
    wrk_bin: str,
    concurrency: int = 1,
    lead: float = LEAD_IN,
    pause: float = 0.0,
) -> dict[str, Any]:
    """``rounds`` rounds of ``names`` at ``concurrency``, back to back, the order reversed every
    other round, each measured round right after ``lead`` seconds of the same load
    (:func:`benchmarks.load.lead_in`); per target the p50, the throughput and the CPU per
    request of each round, and per target after the first (the baseline) the paired
    differences against it (and the baseline's throughput over its own, the slowdown).
    ``pause``: each target idles at least this many seconds before its lead-in (traffic that
    returns after a pause: what a target saved up while idle, it spends then)."""
    per: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    errors = dict.fromkeys(names, 0)
    for n in names:  # warm: connections, caches
        wrk(wrk_bin, started[n].url, body, concurrency, 1)
    idle_since = dict.fromkeys(names, time.monotonic())
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            t = started[n]
            time.sleep(max(0.0, pause - (time.monotonic() - idle_since[n])))
            lead_in(wrk_bin, t.url, body, concurrency, lead)
            cpu0 = t.cpu_seconds()
            load = wrk(wrk_bin, t.url, body, concurrency, seconds)
            cpu = t.cpu_seconds() - cpu0
            per[n].append((load.p50 * 1e3, cpu / max(1, load.requests) * 1e3, load.rps))
            errors[n] += load.errors
            idle_since[n] = time.monotonic()
    base = names[0]
    out: dict[str, Any] = {
        "baseline": base,
        "rounds": rounds,
        "seconds": seconds,
        "lead_in": lead,
        "pause": pause,
        "concurrency": concurrency,
        "targets": {},
    }
    for n in names:
        row: dict[str, Any] = {
            "p50_ms": spread([p for p, _, _ in per[n]]),
            "cpu_ms_per_request": spread([c for _, c, _ in per[n]]),
            "rps": spread([x for _, _, x in per[n]]),
            "errors": errors[n],
        }
        if n != base:
            pairs = list(zip(per[base], per[n], strict=True))
            row["added_p50_ms"] = spread([b[0] - a[0] for a, b in pairs])
            row["added_cpu_ms"] = spread([b[1] - a[1] for a, b in pairs])
            row["slowdown"] = spread([a[2] / b[2] if b[2] else float("inf") for a, b in pairs])
        out["targets"][n] = row
    return out


def pairs_of_every_cell(
    started: dict[str, tg.Target],
    sizes: list[int],
    rounds: int,
    wrk_bin: str,
    work: Path,
    compared: tuple[str, ...] = COMPARED,
    concurrency: int = 1,
    pause: float = 0.0,
) -> list[dict[str, Any]]:
    """:func:`measure` for every size, streamed and not, on the bodies the run wrote."""
    names = [n for n in compared if n in started]
    out: list[dict[str, Any]] = []
    # the baseline and something to compare with it
    if names[:1] != [compared[0]] or len(names) < 2:
        return out
    for size in sizes:
        for stream in (False, True):
            m = measure(
                started,
                names,
                body_path(work, size, stream),
                rounds,
                1.0,
                wrk_bin,
                concurrency,
                pause=pause,
            )
            out.append({"tokens": size, "stream": stream, **m})
            print(
                f"{size:>6} tok stream={stream!s:5} c={concurrency} paired: "
                + "  ".join(
                    f"{n} {m['targets'][n]['added_p50_ms']['median']:+.2f}ms "
                    f"x{m['targets'][n]['slowdown']['median']:.2f} slower"
                    for n in names[1:]
                ),
                flush=True,
            )
    return out


def pairs_table(pairs: list[dict[str, Any]]) -> list[str]:
    """The report's table of the pairs (nothing when the run has none)."""
    if not pairs:
        return []
    first = pairs[0]
    base, c = first["baseline"], first.get("concurrency", 1)
    cols = [n for n in first["targets"] if n != base]
    # the baseline's own column, then each target's columns: (header, cell of the target's row)
    Cell = Callable[[dict[str, Any]], str]
    own: tuple[str, Cell]
    per: list[tuple[str, Cell]]
    if c == 1:
        what = "what the c=1 verdicts judge"
        own = (f"{base} p50 ms", lambda r: fmt(r["p50_ms"]))
        per = [
            ("added p50 ms", lambda r: fmt(r["added_p50_ms"])),
            ("added CPU ms/req", lambda r: fmt(r["added_cpu_ms"])),
        ]
    else:
        what = "the slowdown is the baseline's req/s over the target's"
        own = (f"{base} req/s", lambda r: fmt(r["rps"], 0))
        per = [
            ("req/s", lambda r: fmt(r["rps"], 0)),
            ("slowdown", lambda r: f"x{fmt(r['slowdown'])}"),
            ("added CPU ms/req", lambda r: fmt(r["added_cpu_ms"])),
        ]
    pause = first.get("pause", 0)
    idle = f"each target idle {pause:g} s before its round, then " if pause else "each "
    out = [
        "",
        f"At concurrency {c} in tight pairs against `{base}` ({first['rounds']} "
        f"rounds of {first['seconds']:g} s, {idle}after {first.get('lead_in', 0):g} s of the "
        "same load, back to back in alternating order; median "
        f"(min-max) of the per-round differences; {what}):",
        "",
        f"| tokens | stream | {own[0]} | "
        + " | ".join(f"{n} {h}" for n in cols for h, _ in per)
        + " |",
        "|---:|---|---:|" + "---:|" * (len(per) * len(cols)),
    ]
    for p in pairs:
        t = p["targets"]
        out.append(
            f"| {p['tokens']:,} | {'yes' if p['stream'] else 'no'} | {own[1](t[base])} | "
            + " | ".join(cell(t[n]) for n in cols for _, cell in per)
            + " |"
        )
    return out


def main(argv: list[str]) -> int:
    import tempfile

    names = [n for n in tg.NAMES if n != "litellm"]
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.paired",
        description="Targets measured in tight pairs against the first (the baseline).",
    )
    ap.add_argument("targets", nargs="+", metavar="TARGET", help=f"({', '.join(names)})")
    ap.add_argument("-c", "--concurrency", type=int, default=1, help="wrk connections")
    ap.add_argument("--rounds", type=int, default=15, help="pairs per cell")
    ap.add_argument(
        "--sizes", type=tg.sizes_arg, default=list(tg.SIZES), help="tokens, comma-separated"
    )
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds each target idles before its round (traffic after a pause)",
    )
    args = ap.parse_args(argv)
    bad = [n for n in args.targets if n not in names]
    if len(args.targets) < 2 or bad or args.concurrency < 1 or args.rounds < 1 or args.pause < 0:
        ap.error(
            f"unknown target {bad[0]}"
            if bad
            else "a baseline and at least one target; -c, --rounds at least 1, --pause >= 0"
        )
    work = Path(tempfile.mkdtemp(prefix="ceiling-pairs-"))
    up = tg.upstream(work)
    base = up.url.removesuffix("/v1/chat/completions")
    started = {n: t for n in args.targets if (t := tg.start(n, base, work)) is not None}
    try:
        for size in args.sizes:
            for stream in (False, True):
                body_path(work, size, stream).write_bytes(body_of(size, stream)[0])
        pairs = pairs_of_every_cell(
            started,
            args.sizes,
            args.rounds,
            tg.binary("wrk"),
            work,
            tuple(args.targets),
            args.concurrency,
            args.pause,
        )
        print("\n".join(pairs_table(pairs)))
    finally:
        for t in started.values():
            t.stop()
        up.stop()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))

"""Load from a separate process, both tools from Debian: ``wrk`` (C, HdrHistogram) for throughput
and latency percentiles at a fixed concurrency for a fixed time, read in microseconds through
``post.lua``; ``hey`` (Go) for time to first byte, one CSV row per request (its timings have 0.1 ms
resolution, too coarse for sub-millisecond percentiles, fine for a streamed first byte)."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Load:
    requests: int
    errors: int
    seconds: float
    p50: float
    p99: float
    ttfb_p50: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def spread(values: list[float]) -> dict[str, float]:
    """How every figure is reported: the median over rounds with the min-max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(x: dict[str, float] | None, nd: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x['median']:.{nd}f} ({x['min']:.{nd}f}-{x['max']:.{nd}f})"


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def hey(binary: str, url: str, body: Path, concurrency: int, seconds: float) -> Load:
    out = subprocess.run(
        [
            binary,
            "-z",
            f"{seconds}s",
            "-c",
            str(concurrency),
            "-m",
            "POST",
            "-T",
            "application/json",
            "-D",
            str(body),
            "-t",
            "60",
            "-o",
            "csv",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ok: list[tuple[float, float]] = []
    errors = 0
    for row in csv.DictReader(io.StringIO(out)):
        if row.get("status-code") == "200":
            # response-delay: request written -> first response byte (time to first byte)
            ok.append((float(row["response-time"]), float(row["Response-delay"])))
        else:
            errors += 1
    lat = sorted(r[0] for r in ok)
    return Load(
        requests=len(ok),
        errors=errors,
        seconds=seconds,
        p50=percentile(lat, 0.5),
        p99=percentile(lat, 0.99),
        ttfb_p50=statistics.median(r[1] for r in ok) if ok else float("nan"),
    )


POST_LUA = Path(__file__).with_name("post.lua")


#: seconds of unmeasured load right before each measured round: every target is measured at
#: the share of a core its background work takes under sustained load. The sidecar's sampled
#: counts and answer checker spend a CPU credit that saves up while the target idles (up to
#: ten seconds' worth, ``sidecar/cpu_credit.py``); a round that followed other targets' rounds
#: would otherwise measure that saved-up credit being spent (tens of percent of a core in a
#: 2-second round after a 20-second wait), a start-of-spike figure, not the sustained
#: throughput a fleet is sized for. Under sustained load it drains in well under a second.
LEAD_IN = 1.0


def lead_in(binary: str, url: str, body: Path, concurrency: int, seconds: float) -> None:
    """``seconds`` of the same load, not measured (nothing for 0)."""
    if seconds > 0:
        wrk(binary, url, body, concurrency, seconds)


def wrk(binary: str, url: str, body: Path, concurrency: int, seconds: float) -> Load:
    out = subprocess.run(
        [
            binary,
            "-t",
            "1",
            "-c",
            str(concurrency),
            "-d",
            f"{max(1, round(seconds))}s",
            "--timeout",
            "60s",
            "-s",
            str(POST_LUA),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"BODY": str(body)},
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    return Load(
        requests=r["requests"] - r["non2xx"],
        errors=r["errors"] + r["non2xx"],
        seconds=r["duration_us"] / 1e6,
        p50=r["p50_us"] / 1e6,
        p99=r["p99_us"] / 1e6,
        ttfb_p50=float("nan"),
    )

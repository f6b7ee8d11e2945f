"""Load from a separate process: ``hey`` (Go, Debian package) at a fixed concurrency for a fixed
time, one CSV row per request, so percentiles and time to first byte are computed here from every
request rather than read off a summary."""

from __future__ import annotations

import csv
import io
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

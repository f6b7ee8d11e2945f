"""The benchmark harness runs end to end on a tiny grid, so `make bench` does not rot. It asserts
what the harness must get right (every target answered, the enforcing sidecar really trimmed, the
slow streams all completed, the report names every target), never a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]


ROOT = Path(__file__).resolve().parent.parent


def test_bench_harness_smoke(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--rounds",
            "1",
            "--seconds",
            "0.3",
            "--lead-in",
            "0",  # the tight pairs below lead in; here it would only add a second a round
            "--sizes",
            "1000",
            "--concurrency",
            "1,4",
            "--targets",
            "direct,bare,sidecar,gigatoken,bounded,enforce",
            "--streams",
            "20",
            "--no-trim",
            "--pairs",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert {(c["stream"], c["concurrency"]) for c in res["cells"]} == {
        (False, 1),
        (False, 4),
        (True, 1),
        (True, 4),
    }
    for c in res["cells"]:
        assert set(c["targets"]) == {"direct", "bare", "sidecar", "gigatoken", "bounded", "enforce"}
        for name, t in c["targets"].items():
            assert t["errors"] == 0 and t["rps"]["median"] > 0, (name, t)
            assert t["cpu_ms_per_request"]["median"] > 0, name
    # the enforcing sidecar trimmed requests; the observing one forwarded all untouched
    assert res["over_ceiling"]["enforce"].get("trimmed", 0) > 0
    assert not res["over_ceiling"]["sidecar"].get("trimmed")
    assert not res["over_ceiling"]["bounded"].get("trimmed")
    streams = res["slow_streams"]["targets"]
    assert {n: v["completed"] for n, v in streams.items()} == {"sidecar": 20, "bare": 20}
    assert all(v["peak_mib"] >= v["idle_mib"] > 0 for v in streams.values())
    # the counting column times the whole-request count with each encoder
    k = next(c["counting"] for c in res["cells"] if c["concurrency"] == 1)
    assert k["bpe"] == "riptoken" and k["sidecar_count_gigatoken_ms"] > 0, k
    assert "| 1,000 | yes | 4 | enforce |" in r.stdout
    assert "added p50 <= 1.2x (bare pass-through + counting)" in r.stdout
    # c=1 in tight pairs: every round of each target against the bare pass-through
    pairs = res["c1_paired"]
    assert [(p["tokens"], p["stream"], p["baseline"]) for p in pairs] == [
        (1000, False, "bare"),
        (1000, True, "bare"),
    ]
    for p in pairs:
        assert set(p["targets"]) == {"bare", "bounded", "sidecar", "gigatoken"} and p["rounds"] == 2
        assert all(t["errors"] == 0 and t["p50_ms"]["min"] > 0 for t in p["targets"].values())
        assert (
            "added_p50_ms" in p["targets"]["bounded"] and "added_p50_ms" not in p["targets"]["bare"]
        )
    assert "tight pairs" in r.stdout


def test_tight_pairs_at_a_concurrency_give_the_slowdown(tmp_path: Path) -> None:
    """``python -m benchmarks.paired -c N``: the pairs at concurrency N also give the baseline's
    throughput over each target's, per round, and the table shows it."""
    from benchmarks import targets as tg
    from benchmarks.bodies import body_of, body_path
    from benchmarks.paired import pairs_of_every_cell, pairs_table

    up = tg.upstream(tmp_path)
    base = up.url.removesuffix("/v1/chat/completions")
    started = {n: t for n in ("bare-aiohttp", "enforce") if (t := tg.start(n, base, tmp_path))}
    try:
        for stream in (False, True):
            body_path(tmp_path, 1000, stream).write_bytes(body_of(1000, stream)[0])
        pairs = pairs_of_every_cell(
            started,
            [1000],
            2,
            tg.binary("wrk"),
            tmp_path,
            ("bare-aiohttp", "enforce"),
            4,
            pause=0.3,
        )
        over = tg.over_ceiling(started["enforce"])
    finally:
        for t in started.values():
            t.stop()
        up.stop()
    assert [(p["tokens"], p["stream"], p["concurrency"]) for p in pairs] == [
        (1000, False, 4),
        (1000, True, 4),
    ]
    for p in pairs:
        t = p["targets"]
        assert all(r["errors"] == 0 and r["rps"]["min"] > 0 for r in t.values())
        assert "slowdown" not in t["bare-aiohttp"]
        assert t["enforce"]["slowdown"]["min"] > 0
    assert over.get("trimmed", 0) > 0, "the enforcing sidecar trimmed what it was sent"
    assert all(p["pause"] == 0.3 for p in pairs)
    table = "\n".join(pairs_table(pairs))
    assert "At concurrency 4 in tight pairs against `bare-aiohttp`" in table
    assert "each target idle 0.3 s before its round" in table
    assert "| enforce slowdown |" in table and "| 1,000 | yes |" in table


def test_sweep_cost_benchmark_runs_the_real_sweep_on_the_doubles() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep_cost", "--items", "6", "--window", "8192"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("| openai |") == 4 and r.stdout.count("| anthropic |") == 4
    assert "batch, shared haystacks (batch + cache)" in r.stdout


def test_routing_benchmark_serves_nothing_above_a_measured_ceiling() -> None:
    """The routing benchmark's sidecar policies on a slice of its traffic: every request is
    accounted for, and nothing the sidecar serves is above its answering model's ceiling."""
    from benchmarks.routing import MODELS, sidecar_results, traffic

    sent = list(traffic(12, seed=1))
    bodies = [b for _, b in sent[::40]] + [b for k, b in sent if k == "rag"]
    for policy in ("trim", "fallback", "trim_then_fallback"):
        results = sidecar_results(policy, bodies)
        assert len(results) == len(bodies)
        served = [r for r in results if r.model is not None]
        assert all(r.tokens <= MODELS[r.model].ceiling for r in served if r.model), policy
        kinds = {r.outcome for r in results}
        if policy == "fallback":
            assert "routed" in kinds and "trimmed" not in kinds
        if policy == "trim":
            assert "trimmed" in kinds and "routed" not in kinds


def test_the_default_config_is_judged_on_every_throughput_target() -> None:
    """The verdicts name the product's default config (not only the configurations it was
    built from): against LiteLLM in every cell, against the bare pass-through at 1k and 8k
    (0.8x) and at 64k (0.5x on aiohttp), each on its worst cell."""
    from benchmarks.verdicts import performance

    def cell(tokens: int, stream: bool, default: float) -> dict[str, object]:
        rps = {"litellm": 100.0, "bare": 1000.0, "bare-aiohttp": 1000.0, "default": default}
        rounds = [{n: {"rps": v * k} for n, v in rps.items()} for k in (0.9, 1.0, 1.1)]
        return {
            "tokens": tokens,
            "stream": stream,
            "concurrency": 16,
            "targets": {n: {} for n in rps},
            "rounds": rounds,
        }

    cells = [cell(1000, False, 850.0), cell(8000, True, 700.0), cell(64000, False, 450.0)]
    rows = {r["target"]: r for r in performance({"cells": cells})}
    default = {t: r for t, r in rows.items() if "the default config" in t}
    litellm = next(r for t, r in default.items() if "LiteLLM" in t)
    assert litellm["met"] and "x4.50" in litellm["figure"]  # 64k: 450 / 100
    near = next(r for t, r in default.items() if "0.8x" in t and "aiohttp" in t)
    assert not near["met"] and "8k stream" in near["figure"] and "x0.70" in near["figure"]
    far = next(r for t, r in default.items() if "0.5x" in t)
    assert not far["met"] and "x0.45" in far["figure"]
    cells[2] = cell(64000, False, 600.0)
    rows = {r["target"]: r for r in performance({"cells": cells})}
    assert next(r for t, r in rows.items() if "0.5x" in t)["met"]


@pytest.mark.parametrize("module", ["benchmarks.run", "benchmarks.paired"])
@pytest.mark.parametrize("sizes", ["7", "1000,x", ""])
def test_a_size_the_benchmark_has_no_body_for_is_a_usage_error(module: str, sizes: str) -> None:
    """``--sizes`` takes the benchmark's own body sizes only, in both harnesses (one parser,
    ``targets.sizes_arg``): anything else exits 2 with argparse's line naming them, before a
    target is started."""
    r = subprocess.run(
        [sys.executable, "-m", module, "--sizes", sizes],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-1000:]
    assert (
        r.stderr.strip().splitlines()[-1].endswith("argument --sizes: each of 1000, 8000, 64000")
    ), r.stderr

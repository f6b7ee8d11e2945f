"""The sweep: task sets, grading, the statistics on a scripted model, resume after SIGKILL."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_ceiling.ceilings.document import load_document
from context_ceiling.cli import main as cli_main
from context_ceiling.core.errors import UserError
from context_ceiling.core.utilization import FILL_BUCKETS, fill_bucket
from context_ceiling.sweep.scorer import grade
from context_ceiling.sweep.taskset import TaskSetError, bundled_path, load_taskset
from devtools.generate_contracts import generate
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve

TS = load_taskset("contracts")
ITEMS = {i.id: i for i in TS.items}
WINDOW = 8192


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedModelDouble, str]]:
    d = ScriptedModelDouble(TS, WINDOW, knee=0.65)
    with serve(d.app()) as url:
        yield d, url + "/v1"


def run_cli(*args: str) -> int:
    return cli_main(["sweep", *args])


def common(url: str, out: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--base-url",
        url,
        "--model",
        "scripted",
        "--window",
        str(WINDOW),
        "--tokenizer",
        "o200k_base",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


# -- task sets ----------------------------------------------------------------------------


def test_bundled_taskset_is_current_and_complete(tmp_path: Path) -> None:
    generate(tmp_path / "contracts")
    for name in ("taskset.json", "items.jsonl", "corpus.jsonl", "skeleton.txt"):
        assert (tmp_path / "contracts" / name).read_bytes() == (
            bundled_path("contracts") / name
        ).read_bytes(), name
    assert len(TS.items) >= 200
    assert {i.answer.kind for i in TS.items} == {"exact", "set", "json"}
    assert all(len(i.decoy_docs) >= 3 for i in TS.items)


@pytest.mark.parametrize(
    ("file", "mutate", "needle"),
    [
        (
            "items.jsonl",
            lambda s: s.replace('"question": ', '"questio": ', 1),
            "items.jsonl:1: question: Field required",
        ),
        ("items.jsonl", lambda s: s + "{not json\n", "items.jsonl:961: not valid JSON"),
        (
            "items.jsonl",
            lambda s: s.replace('"gold": ["', '"gold": ["MISSING-', 1),
            "items.jsonl:1: gold: document 'MISSING-",
        ),
        (
            "corpus.jsonl",
            lambda s: s.replace('"text": ', '"txt": ', 1),
            "corpus.jsonl:1: text: Field required",
        ),
        (
            "skeleton.txt",
            lambda s: s.replace("{question}", "?"),
            "needs both {documents} and {question}",
        ),
    ],
)
def test_malformed_taskset_names_file_line_field(
    tmp_path: Path, file: str, mutate: Any, needle: str
) -> None:
    root = tmp_path / "ts"
    generate(root)
    (root / file).write_text(mutate((root / file).read_text()))
    with pytest.raises(TaskSetError) as info:
        load_taskset(root)
    assert needle in str(info.value)


# -- grading ------------------------------------------------------------------------------


def by_kind(kind: str) -> Any:
    return next(i for i in TS.items if i.answer.kind == kind)


def test_grading_buckets() -> None:
    it = by_kind("exact")
    gold, decoy = it.gold[0], it.decoy_docs[0]
    v = it.answer.value
    assert (
        grade(it, json.dumps({"answer": f"{int(v):,} EUR", "evidence": [gold]}), "stop").bucket
        == "correct"
    )
    assert (
        grade(it, json.dumps({"answer": it.decoy_values[0], "evidence": [decoy]}), "stop").bucket
        == "decoyed"
    )
    assert grade(it, json.dumps({"answer": "7", "evidence": [decoy]}), "stop").bucket == "decoyed"
    assert (
        grade(it, json.dumps({"answer": "7", "evidence": [gold]}), "stop").bucket
        == "reasoned_wrongly"
    )
    assert grade(it, json.dumps({"answer": None, "evidence": []}), "stop").bucket == "missed"
    assert grade(it, '{"answer": "12', "length").bucket == "truncated_refused"
    assert grade(it, "I'm sorry, I cannot help with that.", "stop").bucket == "truncated_refused"
    s = by_kind("set")
    vals = s.answer.values
    assert grade(
        s, json.dumps({"answer": list(reversed(vals)), "evidence": s.gold}), "stop"
    ).correct
    assert not grade(
        s, json.dumps({"answer": [*vals[:1], "X-1/9"], "evidence": s.gold}), "stop"
    ).correct
    j = by_kind("json")
    val = j.answer.value
    assert grade(j, json.dumps({"answer": val, "evidence": j.gold}), "stop").correct
    assert not grade(
        j, json.dumps({"answer": {"supplier": val["supplier"]}, "evidence": j.gold}), "stop"
    ).correct  # schema
    assert not grade(
        j, json.dumps({"answer": val | {"notice_days": "ninety"}, "evidence": j.gold}), "stop"
    ).correct


# -- the statistics, on a model with a known knee -------------------------------------------


@pytest.mark.e2e
def test_a_dip_between_levels_that_recovers_is_found(tmp_path: Path) -> None:
    """Accuracy falls between the 0.2 and 0.5 grid levels and recovers before 0.5: the grid
    alone passes 0.5 and 0.8 and would admit the dip; the scan measures fills between them,
    finds it, and the ceiling stays below it."""
    d = ScriptedModelDouble(TS, WINDOW, knee=0.9, dip=(0.3, 0.42, 0.3), repeats_agree=True)
    out = tmp_path / "run"
    with serve(d.app()) as url:
        args = common(url + "/v1", out, "--items", "40", "--repeats", "1", "--refine")
        assert run_cli(*args, "--tolerance", "0.1", "--seed", "2") == 0
    plan = json.loads((out / "plan.json").read_text())
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    assert plan["scanned"], "the scan measured fills between the passing grid levels"
    levels = {s["level"]: s for s in summary["levels"]}
    assert levels[0.5]["diff"] > -0.1 and levels[0.8]["diff"] > -0.1, "the grid alone passes"
    in_dip = [lv for lv in plan["scanned"] if 0.3 <= levels[lv]["utilization"] < 0.42]
    assert in_dip, plan["scanned"]
    assert summary["ceiling_utilization"] < 0.3, summary["ceiling_utilization"]
    # the level that decided it lies no higher than the dip (a scanned one in it, or a point
    # before it that 40 items at one repeat could not tell from it)
    assert levels[summary["deciding_level"]]["utilization"] < 0.42


@pytest.mark.e2e
def test_curve_ceiling_and_refinement_on_a_known_knee(
    scripted: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    _, url = scripted
    out = tmp_path / "run"
    assert (
        run_cli(
            *common(
                url,
                out,
                "--items",
                "60",
                "--repeats",
                "3",
                "--refine",
                "--tolerance",
                "0.1",
                "--resolution",
                "0.04",
                "--seed",
                "3",
            )
        )
        == 0
    )
    plan = json.loads((out / "plan.json").read_text())
    summary = json.loads((out / "summary.json").read_text())["analysis"]
    initial = {0.1, 0.2, 0.5, 0.8}
    added = [lv for lv in plan["levels"] if lv not in initial and lv < 0.9]
    assert added, "refinement measured new levels"
    refined, scanned, probed = plan["refined"], plan["scanned"], plan["probed"]
    assert refined and all(0.5 < lv < 0.8 for lv in refined), f"refined where it drops: {refined}"
    # the cliff probed first: every probe inside the deciding bracket, the tested midpoints
    # among them, the ones past the knee shown dropped and never tested
    assert probed and all(0.5 < lv < 0.8 for lv in probed), probed
    assert set(refined) <= set(probed), (refined, probed)
    roles = {s["level"]: s["role"] for s in summary["levels"]}
    assert all(roles[lv] == "probe" for lv in probed if lv not in refined)
    # never tested, never shown as passing: the report names what they are
    page = (out / "report.html").read_text()
    for lv in set(probed) - set(refined):
        assert re.search(rf"<tr><td>{lv:.3f}</td>(?:(?!</tr>).)*<td>probe</td>", page), lv
    # the dip scan: between the passing grid levels, no two points more than 0.04 apart
    assert scanned and all(0.2 < lv < 0.5 for lv in scanned), scanned
    points = sorted([0.2, *scanned, 0.5])
    assert max(b - a for a, b in itertools.pairwise(points)) <= 0.04 + 1e-9
    assert sorted(added) == sorted({*refined, *scanned, *probed})
    knee = 0.65
    assert summary["ceiling_level"] is not None
    ceiling_util = next(
        s["utilization"] for s in summary["levels"] if s["level"] == summary["ceiling_level"]
    )
    assert 0.45 <= ceiling_util < knee, "the ceiling lands on the right side of the knee, near it"
    assert summary["margin"] == 0.05  # the default
    assert summary["ceiling_utilization"] == pytest.approx(ceiling_util * 0.95, abs=1e-3)
    levels = summary["levels"]
    for s in levels:
        assert s["repeat_min"] <= s["accuracy"] <= s["repeat_max"]
        assert s["ci"][0] <= s["accuracy"] <= s["ci"][1]
        assert abs(s["utilization"] - s["level"]) < 0.01, "filled to the target within 1%"
    assert any(s["repeat_min"] < s["repeat_max"] for s in levels), "repeats produce a spread"
    high = [s for s in levels if s["utilization"] > knee]
    assert all(s["buckets"]["decoyed"] > 0.5 for s in high)
    assert summary["closed_book_flagged"] == []
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 1
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # each level named by the fill bucket the sidecar's answer signals and the dashboard use
    buckets = json.loads((out / "summary.json").read_text())["fill_buckets"]
    assert buckets == {f"{s['level']:g}": fill_bucket(s["utilization"]) for s in levels}
    assert set(buckets.values()) <= set(FILL_BUCKETS)
    assert "fill bucket" in (out / "report.html").read_text()
    # derive -> a ceilings document the sidecar accepts
    assert run_cli("derive", str(out), "--model", "gpt-4o", "--workload", "rag") == 0
    doc = load_document(out / "ceilings.yaml")
    [entry] = doc.entries
    assert entry.ceiling_tokens == summary["ceiling_tokens"] and entry.window == WINDOW
    assert entry.provenance.model_version == "scripted-model-v1"
    assert entry.provenance.task_set_hash == TS.hash and entry.fingerprint is not None
    assert entry.fingerprint.retrieved_chunks > 0


@pytest.mark.e2e
def test_dry_run_sends_nothing_and_budget_stops(
    scripted: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, url = scripted
    assert run_cli(*common(url, tmp_path / "dry", "--items", "5", "--dry-run")) == 0
    assert "dry run: 80 calls" in capsys.readouterr().out and d.calls == 0
    assert run_cli(*common(url, tmp_path / "b", "--items", "5", "--max-calls", "7")) == 0
    lines = (tmp_path / "b" / "calls.jsonl").read_text().splitlines()
    assert len(lines) == 7 and d.calls == 7


@pytest.mark.e2e
def test_retries_on_429_and_5xx(scripted: tuple[ScriptedModelDouble, str], tmp_path: Path) -> None:
    d, url = scripted
    d.fail_first = {"429": 1, "503": 1}
    assert (
        run_cli(
            *common(
                url,
                tmp_path / "r",
                "--items",
                "1",
                "--levels",
                "0.2",
                "--repeats",
                "1",
                "--no-control",
                "--low-fill",
                "0",
            )
        )
        == 0
    )
    [rec] = [json.loads(x) for x in (tmp_path / "r" / "calls.jsonl").read_text().splitlines()]
    assert rec["status"] == "ok" and rec["attempts"] == 3 and rec["finish_reason"] == "stop"


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("run", "--model", "m") == 2
    assert (
        run_cli(
            "run",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--window",
            "1000",
            "--levels",
            "0.2,1.5",
            "--tokenizer",
            "o200k_base",
        )
        == 2
    )
    assert (
        run_cli(
            "run",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--window",
            "1000",
            "--taskset",
            str(tmp_path / "nope"),
            "--tokenizer",
            "o200k_base",
        )
        == 2
    )
    assert run_cli("run", "--resume", "--out", str(tmp_path / "nothing")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "outside (0," in err[1] and "not a task set directory" in err[2]


@pytest.mark.e2e
def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    d = ScriptedModelDouble(TS, WINDOW, knee=0.65, delay=0.05)
    out = tmp_path / "run"
    with serve(d.app()) as url:
        args = [
            sys.executable,
            "-m",
            "context_ceiling.cli",
            "sweep",
            *common(url + "/v1", out, "--items", "8", "--repeats", "2", "--no-refine"),
        ]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = out / "calls.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not log.exists() or len(log.read_text().splitlines()) < 20
        ):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = len(log.read_text().splitlines())
        assert 20 <= before < 8 + 8 * 4 * 2
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "context_ceiling.cli",
                "sweep",
                "run",
                "--resume",
                "--out",
                str(out),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
    keys = [json.loads(x)["key"] for x in log.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 8 + 8 * 5 * 2  # controls + items x levels x repeats
    assert (
        d.calls <= len(keys) + 2
    )  # at most the calls in flight at the kill were made twice upstream
    plan = yaml.safe_load((out / "plan.json").read_text())
    assert plan["run_id"] == "run"


@pytest.mark.e2e
def test_shards_merge_into_the_same_run(
    scripted: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    _, url = scripted
    base = ["--items", "6", "--repeats", "2", "--levels", "0.2,0.6", "--no-refine"]
    assert run_cli(*common(url, tmp_path / "whole", *base)) == 0
    for i in range(3):
        assert run_cli(*common(url, tmp_path / f"s{i}", *base, "--shard", f"{i}/3")) == 0
    assert (
        run_cli("merge", str(tmp_path / "merged"), *(str(tmp_path / f"s{i}") for i in range(3)))
        == 0
    )

    def keys(d: str) -> list[str]:
        return sorted(
            json.loads(x)["key"] for x in (tmp_path / d / "calls.jsonl").read_text().splitlines()
        )

    assert keys("merged") == keys("whole")
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())["analysis"]["levels"]
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())["analysis"]["levels"]
    assert [s["accuracy"] for s in merged] == [s["accuracy"] for s in whole]
    assert (
        run_cli(
            "run",
            "--base-url",
            url,
            "--model",
            "m",
            "--window",
            "100",
            "--shard",
            "3/3",
            "--tokenizer",
            "o200k_base",
        )
        == 2
    )


@pytest.mark.e2e
def test_reduced_regression_holds_then_moves(tmp_path: Path) -> None:
    base = tmp_path / "baseline"
    d = ScriptedModelDouble(TS, WINDOW, knee=0.65)
    with serve(d.app()) as url:
        assert (
            run_cli(
                *common(
                    url + "/v1",
                    base,
                    "--items",
                    "20",
                    "--repeats",
                    "2",
                    "--levels",
                    "0.2,0.5,0.8",
                    "--no-control",
                    "--tolerance",
                    "0.15",
                    "--no-refine",
                )
            )
            == 0
        )
        assert (
            run_cli(
                "run",
                "--reduced",
                "--baseline",
                str(base),
                "--out",
                str(tmp_path / "same"),
                "--no-progress",
            )
            == 0
        )
        verdict = json.loads((tmp_path / "same" / "verdict.json").read_text())
        assert verdict["holds"] and verdict["verdict"].startswith("ceiling holds")
        plan = json.loads((tmp_path / "same" / "plan.json").read_text())
        # as many of the baseline's items as a difference in differences at 0.15 needs: all 20
        assert plan["spec"]["repeats"] == 3 and len(plan["item_ids"]) == 20
        # the reference, the baseline's ceiling level and the first level above it
        baseline = json.loads((base / "summary.json").read_text())["analysis"]
        assert plan["levels"][0] == 0.2 and baseline["ceiling_level"] in plan["levels"]
        assert len(plan["levels"]) <= 3 and any(
            lv > baseline["ceiling_level"] for lv in plan["levels"]
        )
        # five items cannot show that nothing moved: the burden of proof is on "holds"
        assert (
            run_cli(
                "run",
                "--reduced",
                "--baseline",
                str(base),
                "--items",
                "5",
                "--out",
                str(tmp_path / "few"),
                "--no-progress",
            )
            == 3
        )
        verdict = json.loads((tmp_path / "few" / "verdict.json").read_text())
        assert verdict["outcome"] == "inconclusive" and not verdict["holds"]
        assert verdict["verdict"].startswith("inconclusive: re-sweep")
    # the "model" changes: its knee moves down below 0.5
    moved = ScriptedModelDouble(TS, WINDOW, knee=0.35)
    with serve(moved.app()) as url2:
        assert (
            run_cli(
                "run",
                "--reduced",
                "--baseline",
                str(base),
                "--base-url",
                url2 + "/v1",
                "--out",
                str(tmp_path / "moved"),
                "--no-progress",
            )
            == 1
        )
    verdict = json.loads((tmp_path / "moved" / "verdict.json").read_text())
    assert not verdict["holds"] and verdict["verdict"].startswith("ceiling moved")
    at_half = next(e for e in verdict["levels"] if e["level"] == 0.5)
    assert at_half["change"] < -0.3 and at_half["change_ci"][1] < 0


def test_real_corpus_taskset_spdx() -> None:
    ts = load_taskset("spdx")
    assert len(ts.items) >= 200 and {i.answer.kind for i in ts.items} == {"exact", "set", "json"}
    assert all(len(i.decoy_docs) >= 3 for i in ts.items)
    assert "CC0-1.0" in (bundled_path("spdx") / "LICENCE.md").read_text()
    pair = next(i for i in ts.items if i.answer.kind == "set")
    a, b = pair.answer.values  # type: ignore[union-attr]
    assert grade(
        pair, json.dumps({"answer": f"{b} and {a}", "evidence": pair.gold}), "stop"
    ).correct
    assert not grade(pair, json.dumps({"answer": a, "evidence": pair.gold}), "stop").correct
    osi = next(i for i in ts.items if i.answer.kind == "json")
    assert grade(
        osi,
        json.dumps({"answer": osi.answer.value, "evidence": osi.gold}),  # type: ignore[union-attr]
        "stop",
    ).correct
    ident = next(i for i in ts.items if i.answer.kind == "exact")
    assert (
        grade(
            ident,
            json.dumps({"answer": ident.decoy_values[0], "evidence": ident.decoy_docs[:1]}),
            "stop",
        ).bucket
        == "decoyed"
    )


def test_progress_in_a_log_is_a_line_every_tenth_of_the_calls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where stderr is no terminal (CI, ``make demo > log``) the sweep still says how far it is:
    calls done of planned, tokens, errors, time elapsed."""
    from context_ceiling.sweep.solver import LineProgress

    p = LineProgress(40, every_s=3600)
    for k in range(40):
        p.update(None, advance=1, tokens=(k + 1) * 100, errors=0)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("sweep: 4/40 calls, 400 tokens, 0 errors, 0m")
    assert lines[-1].startswith("sweep: 40/40 calls, 4,000 tokens")


def test_the_records_task_set_is_regenerated_identically(tmp_path: Path) -> None:
    """The demo's task set is what its generator writes (edit the generator, not the files)."""
    from devtools.generate_records import generate as generate_records

    generate_records(tmp_path)
    shipped = bundled_path("records")
    for name in ("taskset.json", "items.jsonl", "corpus.jsonl", "skeleton.txt"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
    ts = load_taskset("records")
    assert len(ts.items) == 400 and len(ts.docs) == 1000
    item = ts.items[0]
    # a plain numeric answer is graded exactly; a look-alike record's code is a decoy
    code = item.answer.value  # type: ignore[union-attr]
    assert grade(item, f"The code is {code}.", "stop").correct
    decoy = item.decoy_values[0]
    assert grade(item, decoy, "stop").bucket == "decoyed"


def test_replay_asks_held_out_items_evidence_first_and_reports_both_sides(
    tmp_path: Path,
) -> None:
    from context_ceiling.core.tokenizers import TiktokenCounter
    from context_ceiling.sweep import replay
    from context_ceiling.sweep.prompts import ContextBuilder, Meter
    from context_ceiling.sweep.report import _replay_html, replay_line

    ts = load_taskset("records")
    builder = ContextBuilder(ts, Meter(TiktokenCounter("o200k_base")))
    used = {i.id for i in ts.items[:300]}
    reqs = replay.requests(ts, builder, used, 8, 2000, seed=1)
    assert len(reqs) == 8 and not {r.item.id for r in reqs} & used
    for r in reqs:
        assert r.shown[0] == r.item.gold[0]  # the evidence ranked first, as a retriever would
        assert 1500 < r.tokens <= 2000 and r.chunks == len(r.shown) > 20
        assert f'<document id="{r.item.gold[0]}">' in r.messages[-1]["content"]
        assert r.messages[-1]["content"].endswith("Reply with the code only.")
    # graded by the sweep's scorer: right codes in enforce, look-alikes' codes in observe
    before = [
        replay.outcome(r, ts, r.item.decoy_values[0], "stop", r.tokens, 0, r.tokens) for r in reqs
    ]
    after = [
        replay.outcome(r, ts, str(r.item.answer.value), "stop", 700, r.tokens - 700, 701)  # type: ignore[union-attr]
        for r in reqs
    ]
    assert not any(o.correct for o in before) and all(o.correct for o in after)
    assert {o.bucket for o in before} == {"decoyed"}
    doc = replay.write(tmp_path, 737, before, after)
    assert replay.load(tmp_path) == json.loads(json.dumps(doc))
    assert doc["observe"]["accuracy"] == 0 and doc["enforce"]["accuracy"] == 1
    assert doc["difference"] == 1 and doc["difference_ci"][0] > 0.5
    assert doc["enforce"]["server_prompt_tokens"] == 701
    assert "0% -> 100%" in replay_line(doc)
    assert "What enforcing the ceiling buys" in _replay_html(doc)
    assert replay.load(tmp_path / "nowhere") is None


def test_a_level_the_corpus_cannot_fill_is_refused_not_mislabelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spdx corpus (real licence records: no generator extends it) holds about 91k tokens:
    at a 128k window the 0.8 and max levels would be measured at ~0.7 under their own names.
    The plan refuses them (exit 2, one line saying how far the corpus reaches) and spends
    nothing; levels it reaches plan as before."""
    base = ["sweep", "run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    base += ["--taskset", "spdx", "--window", "131072", "--tokenizer", "o200k_base"]
    code = cli_main(
        [*base, "--levels", "0.2,0.5,0.8,max", "--dry-run", "--out", str(tmp_path / "a")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "0.8" in err and "fills at most" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()
    code = cli_main([*base, "--levels", "0.2,0.3", "--dry-run", "--out", str(tmp_path / "b")])
    assert code == 0, capsys.readouterr().err


@pytest.mark.e2e
def test_the_price_is_stated_before_the_run_and_the_dollar_budget_holds(
    scripted: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run prices the opening design, the planned items and every item the adaptive
    design may add, from the model's list price or ``--price``; ``--budget-usd`` stops the run
    before a call would cross it, and no price means a clear refusal of the cap."""
    from dataclasses import replace

    from context_ceiling.core.prices import Price, known_window, lookup, parse_price

    d, url = scripted
    gpt = lookup("gpt-4o")
    assert gpt is not None and gpt.input > 0 and gpt.output > gpt.input >= gpt.cached_input
    assert lookup("a-private-model-nobody-lists") is None
    # a gateway's provider/model name (LiteLLM's, OpenRouter's, the Gemini API's models/...)
    # is the model at that provider; an unknown one stays unpriced
    assert lookup("openai/gpt-4o") == replace(gpt, source=gpt.source.replace(": ", ": openai/"))
    gemini, flash = lookup("gemini/gemini-2.5-pro"), lookup("models/gemini-2.5-flash")
    assert gemini is not None and gemini.source.endswith(": google/gemini-2.5-pro")
    assert flash == lookup("gemini-2.5-flash")
    assert lookup("nobody/a-private-model") is None
    assert known_window("anthropic/claude-sonnet-4-5") == 200_000
    assert known_window("gemini/gemini-2.5-pro") == 1_048_576
    assert parse_price("0") == Price(0.0, 0.0, 0.0, "--price 0 (self-hosted)")
    assert parse_price("3,15,0.3").cost(2_000_000, 100_000, 1_000_000) == 3 + 0.3 + 1.5

    def dry(*extra: str) -> dict[str, Any]:
        args = common(url, tmp_path / "dry", "--dry-run", "--json", *extra)
        assert run_cli(*args) == 0
        return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]

    cost = dry("--price", "2,8")["cost_usd"]
    assert 0 < cost["min"] < cost["expected"] < cost["max"]
    assert cost["price_per_million"] == {"input": 2.0, "cached_input": 2.0, "output": 8.0}
    fixed = dry("--price", "2,8", "--items", "30", "--no-adaptive")["cost_usd"]
    assert fixed["min"] == fixed["expected"] == fixed["max"] > 0
    assert dry("--price", "0")["cost_usd"]["max"] == 0
    unpriced = dry()
    assert unpriced["cost_usd"] is None  # "scripted" has no list price, and none is guessed
    # no price, and still the forecast: what the adaptive design is expected to spend
    assert unpriced["expected_input_tokens"] == cost["expected_input_tokens"]
    assert unpriced["expected_calls"] > unpriced["calls"] and unpriced["budget_tolerance"] is None
    p10, p90 = unpriced["expected_input_tokens_range"]
    assert p10 <= unpriced["expected_input_tokens"] <= p90 and p10 < p90
    low = dry("--max-input-tokens", str(cost["expected_input_tokens"] // 4))
    assert low["cost_usd"] is None
    assert low["expected_input_tokens"] <= cost["expected_input_tokens"] // 4
    assert low["budget_tolerance"] > unpriced["tolerance"]
    # the forecast honours every budget, and says what tolerance the budget buys
    usd = round(cost["expected"] / 4, 2)
    tight = dry("--price", "2,8", "--budget-usd", str(usd))["cost_usd"]
    assert tight["expected"] <= usd and tight["max"] <= usd
    assert tight["budget_tolerance"] is not None and tight["budget_tolerance"] > 0.05
    cap = cost["expected_input_tokens"] // 4
    capped = dry("--price", "2,8", "--max-input-tokens", str(cap))["cost_usd"]
    assert capped["expected_input_tokens"] <= cap
    # at most what the cap affords, not every item the design may add
    assert capped["min"] <= capped["expected"] <= capped["max"] < cost["max"]
    few = dry("--price", "2,8", "--max-calls", "100")
    assert few["calls"] <= 100 and few["cost_usd"]["expected_calls"] <= 100
    assert cost["budget_tolerance"] is None
    assert d.calls == 0
    # a dollar cap: no call starts that would cross it
    run = common(url, tmp_path / "capped", "--items", "5", "--price", "1000,1000")
    assert run_cli(*run, "--budget-usd", "20", "--max-tokens", "10") == 0
    out = capsys.readouterr().out
    assert "budget reached" in out and "cost: about $" in out
    # the run's first line states the items it opened on: the ones the budget affords
    flat = " ".join(out.split())
    fits = re.search(r"the opening design fits (\d+) of 5 items", flat)
    opened = re.search(r"counter \S+, (\d+) items?, margin of error", flat)
    assert fits and opened and opened.group(1) == fits.group(1) != "0", flat
    calls = [json.loads(x) for x in (tmp_path / "capped" / "calls.jsonl").read_text().splitlines()]
    spent = sum(parse_price("1000,1000").cost(c["prompt_tokens"], 10) for c in calls)
    assert 0 < len(calls) < 80 and spent <= 20
    assert run_cli(*common(url, tmp_path / "x", "--budget-usd", "5")) == 2
    assert "no price for scripted" in capsys.readouterr().err


def test_the_reach_a_corpus_refuses_is_one_it_then_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A level the task set cannot fill is refused with the highest level it can, rounded down:
    that level is then accepted as written."""
    import re

    def dry(levels: str) -> int:
        args = common("http://127.0.0.1:9/v1", tmp_path / "dry", "--dry-run", "--price", "0")
        args[args.index("--window") + 1] = "131072"
        args += ["--taskset", "spdx"]  # a corpus no generator extends
        return run_cli(*args, "--levels", levels, "--items", "30", "--no-adaptive")

    assert dry("0.2,0.95") == 2
    err = capsys.readouterr().err
    found = re.search(r"choose levels up to ([0-9.]+)", err)
    assert found, err
    assert dry(f"0.2,{found.group(1)}") == 0


@pytest.mark.e2e  # it asks the endpoint for llama.cpp's /props first
def test_window_auto_takes_a_listed_models_window_off_llama_cpp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--window auto`` against an endpoint that is not llama.cpp: the model's advertised window
    from the price data set, or one line saying to pass ``--window N``."""

    def dry(model: str) -> int:
        args = common("http://127.0.0.1:9/v1", tmp_path / model, "--dry-run", "--json")
        args[args.index("--model") + 1] = model
        args[args.index("--window") + 1] = "auto"
        return run_cli(*args, "--price", "0", "--levels", "0.2,0.5", "--items", "30")

    assert dry("gpt-4o") == 0
    assert json.loads(capsys.readouterr().out)["window"] == 128000
    # its own entry lists no window; the aggregator's entry for the same model does
    assert dry("gemini-2.5-pro") == 0
    assert json.loads(capsys.readouterr().out)["window"] == 1_048_576
    assert dry("a-private-model-nobody-lists") == 2
    assert "pass --window N" in capsys.readouterr().err


@pytest.mark.e2e  # a real sidecar on loopback
def test_window_auto_takes_the_sidecars_model_entry(tmp_path: Path) -> None:
    """``--window auto`` against a context-ceiling sidecar: the window of its model entry (what
    it computes utilization against), asked of ``GET /budget``; a model it has no entry for,
    or a sidecar that asks for a budget token, falls through to the price data set."""
    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.config import Settings
    from context_ceiling.sweep.plan import window_of

    config: dict[str, Any] = {
        "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
        "models": [
            {"match": "house-model", "window": 48_000},
            {"match": "gpt-4o", "window": 64_000},
        ],
    }
    with serve(create_app(Settings(**config))) as url:
        assert window_of("auto", url + "/v1", "house-model") == 48_000
        assert window_of("auto", url + "/v1", "gpt-4o") == 64_000  # the entry, not the list
        with pytest.raises(UserError, match="pass --window N"):
            window_of("auto", url + "/v1", "a-private-model-nobody-lists")
    with serve(create_app(Settings(**config, budget_token="read-only"))) as url:
        assert window_of("auto", url + "/v1", "gpt-4o") == 128_000  # the data set's


def test_a_bundled_corpus_fills_any_window(tmp_path: Path) -> None:
    """The contracts corpus grows with the window, from its own generator (more confusable
    contract families: plausible neighbours, never filler), deterministically; the items stay
    as they are. A sweep's dry run then accepts 0.95 of a 128k, 200k and 1M window."""
    from context_ceiling.core.tokenizers import TiktokenCounter
    from context_ceiling.sweep.corpora import extend

    records = load_taskset("records")
    more = extend(records, 1_000_000)
    codes = [d.text.rsplit(" ", 1)[1] for d in more.docs.values()]
    assert len(codes) == len(set(codes)) and len(more.docs) > 40 * len(records.docs)
    assert all(
        len(d.text.split(" vault ")[1].split(" is ")[0].split()) == 3
        for d in list(more.docs.values())[len(records.docs) :][:100]
    )
    big = extend(TS, 1_000_000)
    assert big.items == TS.items and set(TS.docs) < set(big.docs)
    assert extend(TS, 1_000_000).hash == big.hash != TS.hash  # the same corpus every time
    assert extend(TS, 1_000) is TS  # a small window needs nothing more
    added = [d for k, d in big.docs.items() if k not in TS.docs]
    assert all(d.id.startswith("C-") and len(d.id.split("-")[1]) >= 5 for d in added)
    enc = TiktokenCounter("o200k_base")
    assert sum(enc.count(d.text) for d in big.docs.values()) >= 1_000_000
    for window in (131_072, 200_000, 1_000_000):
        args = ["run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
        args += ["--window", str(window), "--tokenizer", "o200k_base", "--no-progress"]
        args += ["--levels", "0.2,0.5,0.8,0.95", "--dry-run", "--out", str(tmp_path / str(window))]
        assert run_cli(*args) == 0


def test_a_contract_family_whose_digits_are_spent_takes_a_fresh_root() -> None:
    """A root such as 22222 has one permutation, and a family needs four ids: the generator
    draws a fresh root instead of shuffling forever (the padding draws thousands of families)."""
    import random

    from context_ceiling.sweep.corpora import contracts

    made = contracts(random.Random(1), 3, roots=(22222, 22226))
    ids = [c["id"] for c in made]
    assert len(ids) == 12 and len(set(ids)) == 12

"""Batch mode: a sweep's calls through OpenAI's Batch API and Anthropic's Message Batches,
resumable across restarts with the call log unchanged.

Runs the real ``ceiling sweep`` command line against the scripted model double, which implements
both providers' batch APIs and prompt caches as documented (a stand-in for the hosted providers,
which cannot run here), on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from context_ceiling.sweep.calllog import CallLog
from testkit import REPO
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve
from tests.sweep.test_sweep import TS, WINDOW, common, run_cli

pytestmark = pytest.mark.e2e  # sockets, processes or served servers

SMALL = ("--levels", "0.3,0.6", "--repeats", "1", "--no-refine", "--items", "12", "--low-fill", "0")


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModelDouble, str]]:
    d = ScriptedModelDouble(TS, WINDOW, knee=0.5)
    with serve(d.app()) as url:
        yield d, url


def _texts(out: Path) -> dict[str, str | None]:
    return {k: r.text for k, r in CallLog(out / "calls.jsonl").records().items()}


def _recorded(ledger: Path) -> bool:
    """The ledger holds a whole line saying a batch was sent (the intent before it is not)."""
    if not ledger.exists():
        return False
    text = ledger.read_text()
    return any("id" in json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines())


def _killed_after_a_batch_is_sent(d: ScriptedModelDouble, url: str, out: Path) -> str:
    """A batch sweep into ``out`` whose process is killed once the ledger records a batch as
    sent (the batch held in progress at the double); that batch's id."""
    d.hold_batches = True
    args = common(url + "/v1", out, *SMALL, "--batch", "--batch-poll", "0.05")
    child = subprocess.Popen(
        [sys.executable, "-m", "context_ceiling.cli", "sweep", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ledger = out / "batches.jsonl"
    deadline = time.monotonic() + 120
    # the file can exist before its first line is whole: wait for the record itself
    while not _recorded(ledger) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _recorded(ledger), "the batch was recorded before it was waited on"
    child.send_signal(signal.SIGKILL)
    child.wait()
    [first] = d.batches
    return first


def test_an_openai_batch_run_logs_what_a_synchronous_run_logs(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    d, url = model
    sync, batched = tmp_path / "sync", tmp_path / "batch"
    assert run_cli(*common(url + "/v1", sync, *SMALL)) == 0
    calls_before = d.calls
    assert run_cli(*common(url + "/v1", batched, *SMALL, "--batch", "--batch-poll", "0.01")) == 0
    assert _texts(batched) == _texts(sync), "the same calls, the same answers, the same keys"
    assert d.calls - calls_before == len(_texts(sync)), "every call sent once"
    assert any(b["status"] == "completed" for b in d.batches.values())
    ledger = [json.loads(x) for x in (batched / "batches.jsonl").read_text().splitlines()]
    sent = [x for x in ledger if "id" in x and not x.get("done")]
    assert sent and {x["id"] for x in ledger if x.get("done")} == {x["id"] for x in sent}
    # each batch's intent came first, and its sent line names the same tag
    assert [x["sending"] for x in ledger if "sending" in x] == [x["tag"] for x in sent]
    a = json.loads((batched / "summary.json").read_text())["analysis"]
    b = json.loads((sync / "summary.json").read_text())["analysis"]
    assert a["ceiling_level"] == b["ceiling_level"]


def test_a_restart_waits_on_the_batches_already_sent(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    """The process dies while its batch runs; ``--resume`` waits on that batch (its results go
    to the log once) instead of sending its calls again."""
    d, url = model
    out = tmp_path / "run"
    first = _killed_after_a_batch_is_sent(d, url, out)
    assert not (out / "calls.jsonl").exists() or not _texts(out)
    d.hold_batches = False
    assert (
        run_cli("run", "--resume", "--out", str(out), "--batch-poll", "0.01", "--no-progress") == 0
    )
    logged = _texts(out)
    planned = 12 * (1 + 2)  # the closed-book control and two levels, one repeat
    assert len(logged) == planned
    requests = sum(
        len(d.files[b["input_file_id"]].splitlines())
        for b in d.batches.values()
        if "input_file_id" in b
    )
    assert requests == planned, "no call sent twice"
    assert d.batches[first]["status"] == "completed"


def test_a_batch_sent_but_never_recorded_as_sent_is_found_by_its_tag(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    """The process dies after the provider took the batch and before the ledger's line saying
    so (here: that line removed after the kill): ``--resume`` finds the batch by the tag it was
    sent with (OpenAI's batch ``metadata``) and waits on it, sending nothing again."""
    d, url = model
    out = tmp_path / "run"
    first = _killed_after_a_batch_is_sent(d, url, out)
    ledger = out / "batches.jsonl"
    rows = [json.loads(x) for x in ledger.read_text().splitlines()]
    intents = [r for r in rows if "sending" in r]
    assert len(intents) == 1 and d.batches[first]["metadata"] == {
        "context_ceiling_batch": intents[0]["sending"]
    }
    ledger.write_text("".join(json.dumps(r) + "\n" for r in intents))  # the kill came earlier
    d.hold_batches = False
    assert (
        run_cli("run", "--resume", "--out", str(out), "--batch-poll", "0.01", "--no-progress") == 0
    )
    assert len(_texts(out)) == 12 * (1 + 2)
    assert list(d.batches) == [first], "no batch sent again"
    assert d.batches[first]["status"] == "completed"


def test_an_anthropic_batch_reads_the_shared_haystack_from_the_cache(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path
) -> None:
    d, url = model
    out = tmp_path / "anthropic"
    args = common(url, out, *SMALL, "--api", "anthropic", "--batch", "--batch-poll", "0.01")
    assert run_cli(*args, "--shared-haystack", "--no-control") == 0
    recs = list(CallLog(out / "calls.jsonl").records().values())
    assert recs and all(r.status == "ok" for r in recs)
    assert any(b.get("processing_status") == "ended" for b in d.batches.values())
    assert sum(1 for r in recs if (r.cache_write_tokens or 0) > 0) >= 1
    assert sum(1 for r in recs if (r.cached_tokens or 0) > 0) >= len(recs) // 2
    spend = json.loads((out / "summary.json").read_text())["spend"]
    assert spend["cached_tokens"] > 0 and spend["cache_write_tokens"] > 0


def test_a_batch_run_is_priced_at_the_batch_rates(
    model: tuple[ScriptedModelDouble, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = model
    base = [*common(url + "/v1", tmp_path / "p", *SMALL), "--dry-run", "--json"]
    base[base.index("scripted")] = "gpt-4.1"

    def price(*extra: str) -> dict[str, float]:
        assert run_cli(*base, *extra) == 0
        out = capsys.readouterr().out
        got: dict[str, float] = json.loads(out[out.index("{") :])["cost_usd"]["price_per_million"]
        return got

    sync, batch = price(), price("--batch")
    assert batch["input"] == pytest.approx(sync["input"] / 2)
    assert batch["output"] == pytest.approx(sync["output"] / 2)

"""``calls.jsonl`` read again and again while a run appends to it: every read sees exactly what
the file holds, whether it grew, was cut back by a repair, or was rewritten in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from context_ceiling.core.errors import UserError
from context_ceiling.sweep.batch import Ledger, Pending, Unconfirmed
from context_ceiling.sweep.calllog import CallLog, CallRecord


def rec(key: str, text: str = "42", status: str = "ok") -> CallRecord:
    return CallRecord(
        key=key,
        item=key.split("@")[0],
        level=0.5,
        repeat=0,
        control=False,
        status=status,
        text=text,
    )


def test_a_growing_log_reads_every_record_once_and_the_last_of_each_key(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "calls.jsonl")
    assert log.records() == {}
    log.append(rec("a@0.5", "1"))
    log.append(rec("b@0.5", "2"))
    assert {k: r.text for k, r in log.records().items()} == {"a@0.5": "1", "b@0.5": "2"}
    log.append(rec("a@0.5", "3"))  # a retried call: the last record of its key wins
    log.append(rec("c@0.5", "4", status="error"))
    # a second reader of the same file (the analysis opens its own) sees the same
    again = CallLog(tmp_path / "calls.jsonl").records()
    assert {k: r.text for k, r in again.items()} == {"a@0.5": "3", "b@0.5": "2", "c@0.5": "4"}
    assert log.done() == {"a@0.5", "b@0.5"}
    # what a caller does with the mapping it got never reaches the next read
    again.clear()
    assert len(log.records()) == 3


def test_a_line_still_being_written_waits_and_a_repair_drops_it(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    log = CallLog(path)
    log.append(rec("a@0.5"))
    line = rec("b@0.5").model_dump_json()
    with open(path, "a") as f:
        f.write(line[: len(line) // 2])
    assert set(log.records()) == {"a@0.5"}
    with open(path, "a") as f:
        f.write(line[len(line) // 2 :] + "\n")
    assert set(log.records()) == {"a@0.5", "b@0.5"}
    with open(path, "a") as f:
        f.write('{"key": "c@0.5", "ite')  # killed mid-write
    resumed = CallLog(path)  # the repair cuts the partial line
    resumed.append(rec("d@0.5"))
    assert set(resumed.records()) == {"a@0.5", "b@0.5", "d@0.5"}


@pytest.mark.parametrize("how", ["in-place", "replaced", "shorter"])
def test_a_rewritten_log_is_read_as_it_is_now(tmp_path: Path, how: str) -> None:
    path = tmp_path / "calls.jsonl"
    log = CallLog(path)
    for k in ("a@0.5", "b@0.5"):
        log.append(rec(k, "old"))
    assert {r.text for r in log.records().values()} == {"old"}
    lines = [rec(k, "new").model_dump_json() for k in ("x@0.5", "y@0.5", "z@0.5")]
    body = "\n".join(lines if how != "shorter" else lines[:1]) + "\n"
    if how == "replaced":
        (tmp_path / "next.jsonl").write_text(body)
        (tmp_path / "next.jsonl").replace(path)
    else:
        path.write_text(body)  # same file, truncated and written again
    got = log.records()
    assert {r.text for r in got.values()} == {"new"}
    assert set(got) == ({"x@0.5", "y@0.5", "z@0.5"} if how != "shorter" else {"x@0.5"})


def test_a_bad_line_names_its_line_number_after_earlier_reads(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    log = CallLog(path)
    log.append(rec("a@0.5"))
    log.append(rec("b@0.5"))
    assert len(log.records()) == 2
    with open(path, "a") as f:
        f.write('{"key": "c@0.5"}\n')
    with pytest.raises(UserError, match=r"calls\.jsonl:3: not a call record"):
        log.records()


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_an_answer_holding_a_unicode_line_separator_stays_one_record(
    tmp_path: Path, separator: str
) -> None:
    """JSON writers leave U+2028 and its kin unescaped inside strings; only a newline ends a
    record, so a model's answer holding one neither breaks the log nor a task set's lines."""
    from context_ceiling.sweep.taskset import read_jsonl

    log = CallLog(tmp_path / "calls.jsonl")
    log.append(rec("a@0.5", f"first{separator}second"))
    log.append(rec("b@0.5"))
    assert separator in (tmp_path / "calls.jsonl").read_text()
    assert CallLog(tmp_path / "calls.jsonl").records()["a@0.5"].text == f"first{separator}second"
    lines = tmp_path / "items.jsonl"
    lines.write_text(f'{{"id": "x", "text": "a{separator}b"}}\r\n\n{{"id": "y"}}\n')
    assert read_jsonl(lines) == [(1, {"id": "x", "text": f"a{separator}b"}), (3, {"id": "y"})]


def test_a_ledger_line_torn_by_a_kill_is_not_read(tmp_path: Path) -> None:
    """A process killed inside the ledger's write leaves a line without its newline: the
    batches recorded whole are still pending, the torn one is not read (and does not fail)."""
    ledger = Ledger(tmp_path / "batches.jsonl")
    ledger.sent(Pending("b1", "openai", {"c0": {"item": 1}}, 1.0))
    ledger.sent(Pending("b2", "openai", {"c1": {"item": 2}}, 2.0))
    ledger.done("b1")
    whole = ledger.path.read_text()
    ledger.path.write_text(whole + '{"id": "b3", "api": "ope')
    assert [p.id for p in ledger.pending()] == ["b2"]
    ledger = Ledger(ledger.path)  # the restart: the torn line is dropped before appending
    assert ledger.path.read_text() == whole
    ledger.sent(Pending("b4", "openai", {}, 3.0))
    assert [p.id for p in ledger.pending()] == ["b2", "b4"], "a line after the torn one reads"


def test_a_batch_about_to_be_sent_stays_unconfirmed_until_sent_or_closed(tmp_path: Path) -> None:
    """The ledger's line before a send: unconfirmed until a sent line carries its tag, or it
    is closed (the provider has no such batch, so its calls go again)."""
    ledger = Ledger(tmp_path / "batches.jsonl")
    ledger.sending(Unconfirmed("t1", "openai", {"c0": {"item": 1}}, 1.0))
    ledger.sending(Unconfirmed("t2", "openai", {"c1": {"item": 2}}, 2.0))
    assert [u.tag for u in ledger.unconfirmed()] == ["t1", "t2"] and not ledger.pending()
    ledger.sent(Pending("b1", "openai", {"c0": {"item": 1}}, 1.0, "t1"))
    assert [u.tag for u in ledger.unconfirmed()] == ["t2"]
    assert [(p.id, p.tag) for p in ledger.pending()] == [("b1", "t1")]
    ledger.closed("t2")
    assert ledger.unconfirmed() == []

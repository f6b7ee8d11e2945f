"""Sweeps over evaluation tasks a team already has: an inspect_ai task read as it is (its
dataset, its evidence, its scorer), and question / evidence / answer records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from context_ceiling.cli import main
from context_ceiling.sweep.external import from_records, open_taskset
from context_ceiling.sweep.scorer import grade
from context_ceiling.sweep.taskset import OneOfAnswer, TaskSetError, load_taskset
from testkit import REPO
from testkit.doubles.scripted_model import ScriptedModelDouble
from testkit.serving import serve

TASK = REPO / "testkit" / "data" / "inspect" / "reading.py"
SPEC = f"inspect:{TASK}@reading"


def test_an_inspect_task_becomes_a_task_set() -> None:
    ts = open_taskset(SPEC)
    assert len(ts.items) == 12 and len(ts.docs) == 12
    first = ts.items[0]
    assert first.id == "r1" and first.question.startswith("How often does the Harbour Line")
    # the sample's metadata passage is its gold evidence; the other passages are its padding
    [gold] = first.gold
    assert "every 35 minutes" in ts.docs[gold].text
    # includes(): any target, contained in the answer
    assert first.answer == OneOfAnswer(
        kind="one_of", values=["every 35 minutes", "35 minutes"], contains=True
    )
    assert "{documents}" in ts.skeleton.text and "evidence" in ts.skeleton.user
    # the same task, the same task set (resume and the report's provenance rely on the hash)
    assert open_taskset(SPEC).hash == ts.hash
    assert ts.metric == "accuracy"


def test_the_task_is_graded_as_its_scorer_grades() -> None:
    ts = open_taskset(SPEC)
    item = ts.items[0]
    [gold] = item.gold

    def reply(answer: str) -> str:
        return json.dumps({"answer": answer, "evidence": [gold]})

    assert grade(item, reply("It leaves every 35 minutes."), "stop").correct
    assert grade(item, reply("35 minutes"), "stop").correct
    wrong = grade(item, reply("every 40 minutes"), "stop")
    assert not wrong.correct and wrong.bucket == "reasoned_wrongly"


def test_scorers_the_sweep_cannot_hold_fixed_are_refused() -> None:
    with pytest.raises(TaskSetError, match=r"model_graded_qa.*not one the sweep grades"):
        open_taskset(f"inspect:{TASK}@reading_judged")
    with pytest.raises(TaskSetError, match=r"name the task \(@NAME\).*reading, reading_judged"):
        open_taskset(f"inspect:{TASK}")
    with pytest.raises(TaskSetError, match="has no task 'nope'"):
        open_taskset(f"inspect:{TASK}@nope")


def test_records_with_question_evidence_and_answers(tmp_path: Path) -> None:
    rows = [
        {
            "question": "Who wrote it?",
            "context": "The note was written by Ada.",
            "answers": ["Ada"],
        },
        {
            "query": "When?",
            "passage": "The note was written by Ada.",  # the same passage: one document
            "target": ["1843", "in 1843"],
        },
        {
            "id": "x",
            "input": "Where?",
            "documents": ["In London.", "Near the river."],
            "answer": "London",
        },
    ]
    ts = from_records(rows, name="notes", source="test")
    assert [i.id for i in ts.items] == ["q1", "q2", "x"]
    assert len(ts.docs) == 3 and ts.items[0].gold == ts.items[1].gold
    assert ts.items[0].answer.kind == "exact" and ts.items[1].answer.kind == "one_of"
    assert len(ts.items[2].gold) == 2
    # a record without evidence cannot be swept: said with the record and why
    with pytest.raises(TaskSetError, match=r"record 2: no evidence .*places each item's evidence"):
        from_records([rows[0], {"question": "q", "answer": "a"}], name="n", source="test")
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert open_taskset(f"records:{path}").items == ts.items


def test_convert_writes_a_task_set_directory(tmp_path: Path) -> None:
    out = tmp_path / "reading"
    assert main(["taskset", "convert", SPEC, "--out", str(out)]) == 0
    written, read = load_taskset(out), open_taskset(SPEC)
    assert written.items == read.items and written.docs == read.docs
    assert main(["taskset", "convert", str(TASK), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.e2e
def test_a_sweep_runs_on_an_inspect_task_unchanged(tmp_path: Path) -> None:
    """The sweep's own controls hold: the same items and grader at every level, padding drawn
    from the task's other passages."""
    ts = open_taskset(SPEC)
    model = ScriptedModelDouble(ts, 1024, knee=0.6)
    out = tmp_path / "run"
    with serve(model.app()) as url:
        args = ["sweep", "run", "--base-url", url + "/v1", "--model", "scripted"]
        args += ["--window", "1024", "--tokenizer", "o200k_base", "--out", str(out)]
        args += ["--no-progress", "--taskset", SPEC, "--levels", "0.15,0.45", "--repeats", "1"]
        assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    measured = [c for c in calls if not c["control"]]
    by_level: dict[float, set[str]] = {}
    for c in measured:
        by_level.setdefault(c["level"], set()).add(c["item"])
    assert len(by_level) >= 2 and all(
        items == {i.id for i in ts.items} for items in by_level.values()
    )
    # padding is other items' evidence, never anything else
    assert all(set(c["shown"]) <= set(ts.docs) for c in measured)
    assert any(len(c["shown"]) > 1 for c in measured)
    assert summary["taskset"]["hash"] == ts.hash

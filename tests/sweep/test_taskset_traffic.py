"""Task sets from captured traffic: build (corpus = deduplicated chunks, near-duplicate questions
merged, stratified order, skeleton and fingerprint from the traffic), the labelling round trip
(JSONL and CSV), reference answers, and a sweep on the result that reports agreement, not
accuracy. The model is a test double on loopback (it stands in for a hosted model)."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from context_ceiling.cli import main
from context_ceiling.core.capture import CaptureRecord, CaptureStore, Chunk
from context_ceiling.sweep.taskset import load_taskset
from testkit.serving import serve

SYSTEM = "You are the support assistant. Answer from the knowledge base only."
TOPICS = [
    ("refund window", "The refund window is {n} days from delivery for plan P{n}."),
    ("shipping time", "Standard shipping for region R{n} takes {n} business days."),
    ("warranty", "The warranty on device D{n} lasts {n} months."),
    ("support hours", "Support for tier T{n} is open {n} hours a day."),
]


def _records(n: int) -> list[CaptureRecord]:
    out = []
    now = time.time()
    for i in range(n):
        topic, template = TOPICS[i % len(TOPICS)]
        k = i + 2
        gold = template.format(n=k)
        shared = "Our company policies are listed in this knowledge base."  # in every request
        chunks = [Chunk(rank=0, text=gold, source_id=f"kb-{i}"), Chunk(rank=1, text=shared)]
        if i % 3 == 0:
            chunks.append(Chunk(rank=2, text=("Background on " + topic + ". ") * (20 + i)))
        out.append(
            CaptureRecord(
                ts=now - 1000 + i,
                workload="rag" if i % 2 == 0 else "support",
                model="gpt-4o",
                request_model="gpt-4o-2024-08-06",
                api="openai_chat",
                system=SYSTEM,
                question=f"What is the {topic} for case {k}?",
                chunks=chunks,
                response=json.dumps({"answer": str(k), "evidence": [f"kb-{i}"]}),
                finish_reason="stop",
                input_tokens=300,
                output_tokens=10,
            )
        )
    # a near-duplicate of the first question (merged), one without chunks, one without an answer
    out.append(
        out[0].model_copy(update={"question": "What is the refund window for case 2 ?", "ts": now})
    )
    out.append(out[1].model_copy(update={"chunks": [], "question": "hello there", "ts": now + 1}))
    out.append(
        out[2].model_copy(update={"response": None, "question": "unanswered?", "ts": now + 2})
    )
    return out


@pytest.fixture
def stores(tmp_path: Path) -> Path:
    folder = tmp_path / "captures"
    recs = _records(24)
    for name, part in (("capture-a.sqlite", recs[::2]), ("capture-b.sqlite", recs[1::2])):
        s = CaptureStore.open(folder / name, create=True)
        s.add(part)
        s.close()
    return folder


def _build(capsys: pytest.CaptureFixture[str], stores: Path, out: Path, *extra: str) -> int:
    return _run(capsys, "taskset", "build", "--capture", str(stores), "--out", str(out), *extra)[0]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_build_from_captures(
    stores: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ts"
    code, stdout, err = _run(
        capsys, "taskset", "build", "--capture", str(stores), "--out", str(out), "--min-items", "10"
    )
    assert code == 0, err
    assert "1 near-duplicate questions merged" in stdout
    assert "1 no retrieved chunks" in stdout and "1 no answer" in stdout
    ts = load_taskset(out)
    assert len(ts.items) == 24 and ts.metric == "agreement"
    # the corpus is the deduplicated chunks: the sentence in every request is one document
    shared = [d for d in ts.docs.values() if d.text.startswith("Our company policies")]
    assert len(shared) == 1 and all(shared[0].id in i.gold for i in ts.items)
    assert ts.docs[ts.items[0].gold[0]].title and ts.docs[ts.items[0].gold[0]].title.startswith(  # type: ignore[union-attr]
        "kb-"
    )
    # the gold answer: the answer production gave, pulled out of its JSON reply
    first = next(i for i in ts.items if i.question == "What is the refund window for case 2?")
    assert first.answer.model_dump() == {"kind": "agreement", "value": "2", "source": "captured"}
    assert first.origin and first.origin["duplicates"] == 1 and first.origin["workload"] == "rag"
    # stratified: the first items alternate over workloads and evidence sizes
    head = ts.items[:8]
    assert {i.origin["workload"] for i in head if i.origin} == {"rag", "support"}
    assert len({i.origin["evidence_size"] for i in head if i.origin}) >= 3
    # the skeleton is the captured system prompt; the fingerprint the captured traffic's shape
    assert ts.skeleton.system == SYSTEM
    assert ts.fingerprint is not None and 2.0 < ts.fingerprint["retrieved_chunks"] < 3.0
    assert ts.fingerprint["system_tokens"] > 5 and ts.fingerprint["tool_definition_tokens"] == 0
    # one workload only
    code, stdout, _ = _run(
        capsys,
        "taskset",
        "build",
        "--capture",
        str(stores),
        "--out",
        str(tmp_path / "rag"),
        "--workload",
        "rag",
        "--min-items",
        "5",
    )
    assert code == 0 and all(
        i.origin and i.origin["workload"] == "rag" for i in load_taskset(tmp_path / "rag").items
    )


def test_too_few_items_says_how_many_more(
    stores: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ts"
    code, _, err = _run(capsys, "taskset", "build", "--capture", str(stores), "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1
    m = re.search(r"(\d+) items .* a 5% tolerance needs about (\d+): capture about (\d+) more", err)
    assert m, err
    have, need, more = map(int, m.groups())
    assert have == 24 and more == need - have > 0
    assert not out.exists()


def test_corrupt_store_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\x00garbage" * 64)
    code, _, err = _run(
        capsys, "taskset", "build", "--capture", str(bad), "--out", str(tmp_path / "x")
    )
    assert (
        code == 2 and "not a readable capture store" in err and len(err.strip().splitlines()) == 1
    )


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_labelling_round_trip(
    stores: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    ts_dir = tmp_path / "ts"
    assert _build(capsys, stores, ts_dir, "--min-items", "10") == 0
    labels = tmp_path / f"labels.{fmt}"
    code, stdout, _ = _run(capsys, "taskset", "export", str(ts_dir), "--out", str(labels))
    assert code == 0 and "24 items" in stdout
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(labels.read_text())))
    else:
        rows = [json.loads(x) for x in labels.read_text().splitlines()]
    assert rows[0]["question"] and "[c-" in rows[0]["evidence"] and rows[0]["model_answer"]
    rows[0].update(answer_kind="exact", answer="2 days")
    rows[1].update(answer_kind="set", answer="a|b" if fmt == "csv" else json.dumps(["a", "b"]))
    rows[2].update(answer_kind="json", answer=json.dumps({"days": 3, "plan": "P3"}))

    def write(rows: list[dict[str, Any]]) -> None:
        if fmt == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
            labels.write_text(buf.getvalue())
        else:
            labels.write_text("".join(json.dumps(r) + "\n" for r in rows))

    before = (ts_dir / "items.jsonl").read_text()
    for bad, needle in [
        ({"id": "q-nope"}, "id: 'q-nope' is not an item"),
        ({"answer_kind": "regex"}, "answer_kind: 'regex' is not one of exact, set, json"),
        ({"answer_kind": "json", "answer": "{not json"}, "answer: not a JSON object"),
    ]:
        write([rows[0], rows[1], {**rows[2], **bad}])
        code, _, err = _run(capsys, "taskset", "import", str(ts_dir), str(labels))
        line = 4 if fmt == "csv" else 3
        assert code == 2 and f"{labels}:{line}: {needle}" in err, err
        assert (ts_dir / "items.jsonl").read_text() == before  # nothing half-applied
    write(rows)
    code, stdout, err = _run(capsys, "taskset", "import", str(ts_dir), str(labels))
    assert code == 0 and "3 of 24 items labelled" in stdout, err
    ts = load_taskset(ts_dir)
    kinds = {i.id: i.answer.kind for i in ts.items}
    assert [kinds[r["id"]] for r in rows[:4]] == ["exact", "set", "json", "agreement"]
    assert ts.metric == "accuracy+agreement"
    j = next(i for i in ts.items if i.id == rows[2]["id"])
    assert j.answer.model_dump(by_alias=True)["schema"]["properties"] == {
        "days": {"type": "number"},
        "plan": {"type": "string"},
    }


def _model_double(ts_dir: Path) -> Starlette:
    """Answers each question with its case number when the gold chunk is in the prompt, and
    "unknown" otherwise (so reference answers are right and a sweep can disagree)."""
    ts = load_taskset(ts_dir)
    golds = {i.question: ts.docs[i.gold[0]].text for i in ts.items}

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        user = body["messages"][-1]["content"]
        q = next((q for q in golds if q in user), None)
        answer = re.findall(r"case (\d+)", q)[0] if q and golds[q] in user else "unknown"
        text = json.dumps({"answer": answer, "evidence": []})
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.e2e
def test_reference_answers_and_a_sweep_that_reports_agreement(
    stores: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ts_dir = tmp_path / "ts"
    assert _build(capsys, stores, ts_dir, "--min-items", "10") == 0
    with serve(_model_double(ts_dir)) as url:
        code, stdout, err = _run(
            capsys, "taskset", "reference", str(ts_dir), "--base-url", url + "/v1", "--model", "m"
        )
        assert code == 0 and "24 of 24 unlabelled items" in stdout, err
        ts = load_taskset(ts_dir)
        assert {i.answer.model_dump()["source"] for i in ts.items} == {"reference:m"}
        run = tmp_path / "run"
        code, _, err = _run(
            capsys,
            "sweep",
            "run",
            "--base-url",
            url + "/v1",
            "--model",
            "m",
            "--taskset",
            str(ts_dir),
            "--window",
            "4000",  # the 24 captured requests' documents fill about half of it
            "--tokenizer",
            "o200k_base",
            "--levels",
            "0.2,0.5",
            "--repeats",
            "1",
            "--items",
            "24",
            "--no-progress",
            "--out",
            str(run),
        )
        assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["taskset"]["metric"] == "agreement"
    page = (run / "report.html").read_text()
    assert "<th>agreement</th>" in page and "<th>accuracy</th>" not in page
    assert "unlabelled (24 items, graded as agreement" in page and "24 agree" in page
    assert "accuracy" not in summary["analysis"]["metric"] and all(
        "accuracy" not in line for line in summary["analysis"]["refusals"]
    )
    code, _, err = _run(
        capsys, "sweep", "derive", str(run), "--model", "gpt-4o", "--workload", "rag", "--force"
    )
    doc = yaml.safe_load((run / "ceilings.yaml").read_text())
    [entry] = doc["entries"]
    assert entry["metric"] == "agreement"
    assert entry["fingerprint"] == ts.fingerprint


def test_near_duplicates_need_the_same_numbers_and_identifiers() -> None:
    from context_ceiling.sweep.traffic import _Candidate, _merge_near_duplicates

    def cand(q: str, ts: float) -> _Candidate:
        r = CaptureRecord(ts=ts, workload="w", model="m", request_model="m", api="a", question=q)
        return _Candidate(r, [], frozenset(re.findall(r"[a-z0-9]+", q.lower())), 1)

    qs = [
        "What is the renewal fee in contract C-4417-T under the master agreement?",
        "What is the renewal fee in contract C-4471-T under the master agreement?",  # other id
        "what is the renewal fee in contract C-4417-T under the master agreement",  # same
    ]
    kept, merged = _merge_near_duplicates([cand(q, i) for i, q in enumerate(qs)], 0.8)
    assert merged == 1 and [c.record.question for c in kept] == qs[:2]
    assert kept[0].duplicates == 1

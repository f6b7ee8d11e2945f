"""The labelling round trip: ``ceiling taskset export`` writes each item's question, evidence and
the model's answer for people to label (JSONL or CSV, by the file's extension);
``ceiling taskset import`` validates the labels and turns the labelled items into graded ones.

A label is ``answer_kind`` plus ``answer``:

- ``exact``: ``answer`` is the value (a string);
- ``set``: ``answer`` is a JSON list of strings, or (in CSV) values separated by ``|``;
- ``json``: ``answer`` is a JSON object; its schema (the keys required, each value's JSON type) is
  derived from it.

A row with both empty leaves its item unlabelled (graded as agreement). Every problem is reported
with the file, the line and the field, and nothing is written unless every row is valid.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from context_ceiling.core.errors import UserError
from context_ceiling.sweep.taskset import (
    AgreementAnswer,
    ExactAnswer,
    JsonAnswer,
    load_taskset,
    read_jsonl,
    replace_answers,
)

COLUMNS = (
    "id",
    "workload",
    "question",
    "evidence",
    "model_answer",
    "reference_answer",
    "answer_kind",
    "answer",
)
KINDS = ("exact", "set", "json")


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    if v is None:
        return "null"
    return "string"


def export(path: str, out: str) -> int:
    """Write the rows; returns how many."""
    ts = load_taskset(path)
    rows = []
    for it in ts.items:
        origin = it.origin or {}
        a = it.answer
        label_kind, label = "", ""
        if not isinstance(a, AgreementAnswer):
            label_kind = a.kind
            value: Any = a.value if isinstance(a, ExactAnswer | JsonAnswer) else a.values
            label = value if isinstance(value, str) else json.dumps(value)
        rows.append(
            {
                "id": it.id,
                "workload": origin.get("workload", ""),
                "question": it.question,
                "evidence": "\n\n".join(f"[{d}] {ts.docs[d].text}" for d in it.gold),
                "model_answer": origin.get("captured_answer") or "",
                "reference_answer": a.value if isinstance(a, AgreementAnswer) else "",
                "answer_kind": label_kind,
                "answer": label,
            }
        )
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix == ".csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
        target.write_text(buf.getvalue())
    elif target.suffix in (".jsonl", ".json"):
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        raise UserError(f"{out}: the labels file must end in .jsonl or .csv")
    return len(rows)


def _rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if path.suffix == ".csv":
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        reader = csv.DictReader(io.StringIO(text))
        missing = {"id", "answer_kind", "answer"} - set(reader.fieldnames or [])
        if missing:
            raise UserError(f"{path}:1: the header lacks {', '.join(sorted(missing))}")
        return [(n, row) for n, row in enumerate(reader, 2)]
    out = []
    for n, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: each line must be a JSON object")
        out.append((n, row))
    return out


def _label(where: str, kind: str, raw: Any, csv_file: bool) -> dict[str, Any]:
    if kind == "exact":
        value = raw if isinstance(raw, str) else json.dumps(raw) if raw is not None else ""
        if not value.strip():
            raise UserError(f"{where}: answer: empty for kind exact")
        return {"kind": "exact", "value": value.strip()}
    if kind == "set":
        values: Any = raw
        if isinstance(raw, str):
            s = raw.strip()
            if s.startswith("["):
                try:
                    values = json.loads(s)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{where}: answer: not a JSON list: {exc.msg}") from exc
            else:
                values = [v.strip() for v in s.split("|")] if csv_file else None
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) and v.strip() for v in values)
        ):
            raise UserError(
                f"{where}: answer: kind set needs a non-empty list of strings"
                + (" (or values separated by |)" if csv_file else "")
            )
        return {"kind": "set", "values": [v.strip() for v in values]}
    if kind == "json":
        obj = raw
        if isinstance(raw, str):
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise UserError(f"{where}: answer: not a JSON object: {exc.msg}") from exc
        if not isinstance(obj, dict) or not obj:
            raise UserError(f"{where}: answer: kind json needs a non-empty JSON object")
        schema = {
            "type": "object",
            "required": sorted(obj),
            "properties": {k: {"type": _json_type(v)} for k, v in obj.items()},
        }
        return {"kind": "json", "value": obj, "schema": schema}
    raise UserError(f"{where}: answer_kind: {kind!r} is not one of {', '.join(KINDS)}")


def import_labels(path: str, labels: str) -> tuple[int, int]:
    """Apply the labels; returns (labelled now, items in all). All or nothing."""
    ts = load_taskset(path)
    src = Path(labels)
    by_id = {it.id: it for it in ts.items}
    answers: dict[str, dict[str, Any]] = {}
    for n, row in _rows(src):
        where = f"{src}:{n}"
        item_id = str(row.get("id") or "")
        if item_id not in by_id:
            raise UserError(f"{where}: id: {item_id!r} is not an item of {path}")
        kind = str(row.get("answer_kind") or "").strip()
        raw = row.get("answer")
        if not kind and (raw is None or raw == ""):
            continue  # unlabelled: stays an agreement item
        if item_id in answers:
            raise UserError(f"{where}: id: {item_id!r} is labelled twice")
        answers[item_id] = _label(where, kind, raw, src.suffix == ".csv")
    after = replace_answers(path, answers)
    return sum(1 for i in after.items if i.labelled), len(after.items)

"""Task sets from the evaluation tasks a team already has: an inspect_ai task, or records of
question, evidence and answer (the shape of lm-eval-harness and most reading-comprehension sets).

A sweep needs three things of every item, and an evaluation task has them under other names:
the question, the **evidence** that answers it (text the sweep can place among padding at every
fill level: the one thing many tasks lack), and the accepted answers with the way they are
graded. Both sources become an ordinary :class:`~context_ceiling.sweep.taskset.TaskSet` in
memory: the evidence passages are the corpus (so the padding around an item is other items'
evidence: plausible neighbours, never filler), each item's gold is its own passage, its answer
is the task's targets, and the prompt skeleton is the bundled one that asks for the answer and
the evidence ids. The sweep's controls hold as for any task set: the same items, evidence,
skeleton and grader at every level.

Specs (``ceiling sweep run --taskset SPEC``, ``ceiling taskset import SPEC``):

- ``inspect:FILE.py@TASK`` or ``inspect:package.module@TASK``: the task's dataset (inspect_ai's
  ``Sample``: ``input``, ``target``, ``id``, the evidence in ``metadata``) and its scorer
  (``match()``, ``exact()``: the answer equals a target; ``includes()``: it contains one);
- ``records:FILE.jsonl``: one JSON object per line with the question (``question``, ``query``,
  ``input`` or ``prompt``), the evidence (``evidence``, ``context``, ``passage``, ``document``
  or ``documents``: a string or a list of strings) and the answer (``answer``, ``answers`` or
  ``target``: a string or a list, any of which is right), and optionally ``id``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from context_ceiling.sweep.taskset import (
    Doc,
    Item,
    Meta,
    Skeleton,
    TaskSet,
    TaskSetError,
    load_taskset,
    read_jsonl,
    write_taskset,
)

__all__ = ["EVIDENCE_KEYS", "PREFIXES", "SKELETON", "from_records", "open_taskset", "write_out"]

#: the spec prefixes this module reads
PREFIXES = ("inspect:", "records:")
#: where a record or an inspect sample's metadata keeps its evidence, in order of preference
EVIDENCE_KEYS = ("evidence", "context", "passage", "document", "documents")
_QUESTION_KEYS = ("question", "query", "input", "prompt")
_ANSWER_KEYS = ("answer", "answers", "target")
#: the prompt skeleton of an imported task: the documents, the question, and the answer asked
#: for with the ids of the documents it came from (the grader buckets failures by them)
SKELETON = (
    "You answer questions using only the documents provided. Many documents look alike: "
    "check names, ids and values carefully.\n---\n<documents>\n{documents}\n</documents>\n\n"
    "Question: {question}\n"
    'Reply with JSON only, in this form: {"answer": <the answer>, "evidence": [<ids of the '
    "documents you used>]}"
)
#: inspect_ai scorers the sweep's grader reproduces: equal to a target, or containing one
_SCORERS = {"match": False, "exact": False, "includes": True}


def open_taskset(spec: str | Path) -> TaskSet:
    """The task set a ``--taskset`` value names: a directory, a bundled name, or an
    ``inspect:`` / ``records:`` spec read through this module."""
    text = str(spec)
    if text.startswith("inspect:"):
        return _from_inspect(text.removeprefix("inspect:"))
    if text.startswith("records:"):
        path = Path(text.removeprefix("records:"))
        rows = [r for _, r in read_jsonl(path, TaskSetError)]
        return from_records(rows, name=path.stem, source=f"records:{path}")
    return load_taskset(spec)


def _first(row: Mapping[str, Any], keys: Iterable[str]) -> Any:
    return next((row[k] for k in keys if row.get(k) not in (None, "", [])), None)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str) and v.strip()]
    return []


def from_records(
    rows: Sequence[Mapping[str, Any]],
    *,
    name: str,
    source: str,
    contains: bool = False,
) -> TaskSet:
    """A task set from question / evidence / answer records (see the module's docstring);
    ``contains``: an answer is right when it contains an accepted one. Every problem names
    the record."""
    docs: dict[str, Doc] = {}
    by_text: dict[str, str] = {}
    items: list[Item] = []
    seen: set[str] = set()
    for n, row in enumerate(rows, 1):
        where = f"{source}: record {n}"
        if not isinstance(row, Mapping):
            raise TaskSetError(f"{where}: not a JSON object")
        question = _first(row, _QUESTION_KEYS)
        if not isinstance(question, str) or not question.strip():
            raise TaskSetError(f"{where}: no question (one of {', '.join(_QUESTION_KEYS)})")
        evidence = _texts(_first(row, EVIDENCE_KEYS))
        if not evidence:
            raise TaskSetError(
                f"{where}: no evidence (one of {', '.join(EVIDENCE_KEYS)}): the sweep places "
                "each item's evidence among padding at every fill, so every item needs the text "
                "that answers it"
            )
        answers = _texts(_first(row, _ANSWER_KEYS))
        if not answers:
            raise TaskSetError(f"{where}: no answer (one of {', '.join(_ANSWER_KEYS)})")
        gold = []
        for text in evidence:
            doc_id = by_text.get(text)
            if doc_id is None:  # a passage shared by several questions is one document
                doc_id = by_text[text] = f"e{len(docs) + 1}"
                docs[doc_id] = Doc(id=doc_id, text=text)
            gold.append(doc_id)
        item_id = str(row.get("id") or f"q{n}")
        if item_id in seen:
            raise TaskSetError(f"{where}: id {item_id!r} repeats an earlier record's")
        seen.add(item_id)
        answer: dict[str, Any] = (
            {"kind": "exact", "value": answers[0]}
            if len(answers) == 1 and not contains
            else {"kind": "one_of", "values": answers, "contains": contains}
        )
        try:
            items.append(Item(id=item_id, question=question, gold=gold, answer=answer))
        except ValidationError as exc:
            raise TaskSetError(f"{where}: {exc.errors()[0]['msg']}") from exc
    if not items:
        raise TaskSetError(f"{source}: no records")
    skeleton_text = SKELETON
    system, _, user = skeleton_text.partition("\n---\n")
    meta = Meta(name=name, description=f"imported from {source}")
    digest = hashlib.sha256(
        json.dumps(
            [
                meta.model_dump(),
                [i.model_dump(by_alias=True) for i in items],
                [d.model_dump() for d in docs.values()],
                skeleton_text,
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    corpus = hashlib.sha256(
        json.dumps([d.model_dump() for d in docs.values()], sort_keys=True).encode()
    ).hexdigest()
    return TaskSet(
        meta=meta,
        items=items,
        docs=docs,
        skeleton=Skeleton(system.strip(), user.strip(), skeleton_text),
        hash="sha256:" + digest,
        corpus_hash="sha256:" + corpus,
    )


def _load_task(spec: str) -> Any:
    """The inspect_ai ``Task`` that ``FILE.py@TASK`` or ``module@TASK`` names, created with
    its defaults (``@TASK`` may be left out when the file defines one task)."""
    try:
        from inspect_ai import Task
    except ImportError:
        raise TaskSetError(
            "inspect: task sets need inspect_ai: pip install 'context-ceiling[inspect]'"
        ) from None
    where, _, name = spec.partition("@")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise TaskSetError(f"inspect:{spec}: no file {path}")
        module_name = (
            f"_ceiling_inspect_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
        )
        loaded = importlib.util.spec_from_file_location(module_name, path)
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        sys.modules[module_name] = module
        loaded.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise TaskSetError(f"inspect:{spec}: cannot import {where}: {exc}") from exc
    if not name:
        tasks = [
            n
            for n, v in vars(module).items()
            if callable(v)
            and getattr(v, "__registry_info__", None) is not None
            and getattr(v.__registry_info__, "type", None) == "task"
        ]
        if len(tasks) != 1:
            raise TaskSetError(
                f"inspect:{spec}: name the task (@NAME): the module defines "
                + (", ".join(tasks) if tasks else "no @task function")
            )
        name = tasks[0]
    factory = getattr(module, name, None)
    if factory is None:
        raise TaskSetError(f"inspect:{spec}: {where} has no task {name!r}")
    task = factory() if callable(factory) and not isinstance(factory, Task) else factory
    if not isinstance(task, Task):
        raise TaskSetError(f"inspect:{spec}: {name} did not return an inspect_ai Task")
    return task


def _scorer_contains(spec: str, task: Any) -> bool:
    """Whether the task's scorer accepts an answer containing a target (``includes()``) or one
    equal to it (``match()``, ``exact()``); another scorer is refused: the sweep grades the same
    way at every level, without a judge model."""
    from inspect_ai._util.registry import registry_info

    scorers = task.scorer or []
    names = []
    for s in scorers if isinstance(scorers, list) else [scorers]:
        try:
            names.append(registry_info(s).name.rsplit("/", 1)[-1])
        except Exception:
            names.append(getattr(s, "__name__", type(s).__name__))
    known = [n for n in names if n in _SCORERS]
    if not known:
        raise TaskSetError(
            f"inspect:{spec}: its scorer ({', '.join(names) or 'none'}) is not one the sweep "
            f"grades the same way ({', '.join(_SCORERS)}); score with one of those, or import "
            "the dataset as records:FILE.jsonl"
        )
    return _SCORERS[known[0]]


def _sample_text(value: Any) -> str:
    """A sample's input as the question: the text itself, or the last user message's."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for message in reversed(value):
            if getattr(message, "role", None) == "user":
                return str(getattr(message, "text", "") or "")
    return ""


def _from_inspect(spec: str) -> TaskSet:
    task = _load_task(spec)
    contains = _scorer_contains(spec, task)
    rows: list[dict[str, Any]] = []
    for n, sample in enumerate(task.dataset, 1):
        meta = dict(sample.metadata or {})
        target = sample.target
        rows.append(
            {
                "id": str(sample.id) if sample.id is not None else f"s{n}",
                "question": _sample_text(sample.input),
                "evidence": _first(meta, EVIDENCE_KEYS),
                "answer": list(target) if isinstance(target, list) else target,
            }
        )
    name = getattr(task, "name", None) or spec.rsplit("@", 1)[-1] or "inspect"
    return from_records(rows, name=str(name), source=f"inspect:{spec}", contains=contains)


def write_out(ts: TaskSet, out: str | Path) -> None:
    """Write an imported task set as a directory (``ceiling taskset convert``): the same items,
    corpus and skeleton, to review, commit and sweep by path."""
    write_taskset(
        Path(out),
        ts.meta.model_dump(exclude_defaults=True) | {"name": ts.meta.name},
        [i.model_dump(by_alias=True, exclude_defaults=True) for i in ts.items],
        [d.model_dump(exclude_none=True) for d in ts.docs.values()],
        ts.skeleton.text,
    )

"""Task sets: items, a corpus and one prompt skeleton (the dataset, kept apart from the solver).

A task set is a directory:

- ``taskset.json``: name, format version, description, licence;
- ``items.jsonl``: one item per line: ``id``, ``question``, ``gold`` (evidence document ids),
  ``answer`` (kind ``exact`` with a ``value``, ``set`` with ``values``, ``one_of`` with
  ``values`` any of which is right (``contains``: the answer contains one), or ``json`` with a
  ``value`` object and a JSON ``schema``: labelled answers, graded as accuracy; or kind
  ``agreement`` with the model's own answer as ``value`` and where it came from as ``source``:
  graded as agreement, never called accuracy), optional ``decoy_values``, ``decoy_docs`` and
  ``origin`` (where a captured item came from);
- ``corpus.jsonl``: one document per line: ``id``, ``text``, optional ``title``;
- ``skeleton.txt``: the prompt template, with ``{documents}`` and ``{question}``, and a
  ``---`` line separating the system part from the user part;
- ``fingerprint.json`` (optional; task sets built from captured traffic): the traffic shape the
  ceiling is measured for (system and tool-definition tokens, chunks per request, tokens per
  chunk), recorded in the derived ceiling for the sidecar's staleness check.

Loading validates everything and names the file, line and field of the first problem.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from context_ceiling.core.errors import UserError
from context_ceiling.core.strict import Strict

FORMAT_VERSION: Literal[1] = 1
FINGERPRINT_KEYS = (
    "system_tokens",
    "tool_definition_tokens",
    "retrieved_chunks",
    "retrieved_chunk_tokens",
)
BUNDLED = ("contracts", "spdx", "records", "landmarks")


class ExactAnswer(Strict):
    kind: Literal["exact"]
    value: str


class SetAnswer(Strict):
    kind: Literal["set"]
    values: list[str] = Field(min_length=1)


class JsonAnswer(Strict):
    kind: Literal["json"]
    value: dict[str, Any]
    schema_: dict[str, Any] = Field(alias="schema")


class OneOfAnswer(Strict):
    """Any of several accepted answers (an evaluation task's list of targets): equal to one
    once normalised, or, with ``contains``, containing one (inspect_ai's ``includes()``)."""

    kind: Literal["one_of"]
    values: list[str] = Field(min_length=1)
    contains: bool = False


class AgreementAnswer(Strict):
    """No label: the gold is the model's own answer with only the evidence in context
    (``source``: ``reference:<model>`` when ``ceiling taskset reference`` asked it, ``captured``
    for the answer production gave). Graded as agreement with that answer."""

    kind: Literal["agreement"]
    value: str
    source: str = "captured"


Answer = Annotated[
    ExactAnswer | SetAnswer | JsonAnswer | OneOfAnswer | AgreementAnswer,
    Field(discriminator="kind"),
]
#: what the answers of a task set measure
Metric = Literal["accuracy", "agreement", "accuracy+agreement"]


class Item(Strict):
    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    gold: list[str] = Field(min_length=1, description="evidence document ids")
    answer: Answer
    decoy_values: list[str] = Field(default_factory=list)
    decoy_docs: list[str] = Field(default_factory=list)
    #: a captured item's provenance: workload, captured_at, model, duplicates merged, ...
    origin: dict[str, Any] | None = None

    @property
    def labelled(self) -> bool:
        return not isinstance(self.answer, AgreementAnswer)


class Doc(Strict):
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    title: str | None = None


class Meta(Strict):
    name: str
    format_version: Literal[1] = FORMAT_VERSION
    description: str = ""
    licence: str = ""
    seed: int | None = None


class TaskSetError(UserError, ValueError):
    """A malformed task set; the message names the file, line and field."""


@dataclass(frozen=True)
class Skeleton:
    system: str
    user: str
    text: str

    def render(self, documents: str, question: str) -> tuple[str, str]:
        return self.system, self.user.replace("{documents}", documents).replace(
            "{question}", question
        )

    def shared_length(self, documents: str) -> int:
        """How much of the rendered user part comes before the question (the part every question
        on one haystack shares, so a prompt cache can serve it): 0 when the question comes
        first."""
        at, docs = self.user.find("{question}"), self.user.find("{documents}")
        if docs < 0 or at < docs:
            return 0
        return len(self.user[:at].replace("{documents}", documents))

    @property
    def hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class TaskSet:
    meta: Meta
    items: list[Item]
    docs: dict[str, Doc]
    skeleton: Skeleton
    hash: str
    corpus_hash: str
    fingerprint: dict[str, float] | None = None

    @property
    def metric(self) -> Metric:
        """``accuracy`` when every item is labelled, ``agreement`` when none is."""
        labelled = {i.labelled for i in self.items}
        if labelled == {False}:
            return "agreement"
        return "accuracy+agreement" if len(labelled) == 2 else "accuracy"


def read_jsonl(path: Path, error: type[UserError] = UserError) -> list[tuple[int, Any]]:
    """Each non-empty line's number and JSON value; a line that is not JSON raises ``error``
    naming the file and the line."""
    try:
        # newlines only: str.splitlines() also splits on U+2028 and U+0085, which JSON writers
        # leave unescaped inside strings
        lines = path.read_text().split("\n")
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{n}: not valid JSON: {exc.msg}") from exc
    return out


def _jsonl(path: Path, model: type[Strict]) -> list[Any]:
    out = []
    for n, raw in read_jsonl(path, TaskSetError):
        try:
            out.append(model.model_validate(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(line)"
            raise TaskSetError(f"{path}:{n}: {field}: {err['msg']}") from exc
    return out


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return "sha256:" + h.hexdigest()


def bundled_path(name: str) -> Path:
    return Path(str(resources.files("context_ceiling.sweep") / "tasksets" / name))


def load_taskset(path_or_name: str | Path) -> TaskSet:
    """Load a task set directory, or a bundled one by name (``contracts``)."""
    root = bundled_path(str(path_or_name)) if str(path_or_name) in BUNDLED else Path(path_or_name)
    if not root.is_dir():
        raise TaskSetError(f"{root}: not a task set directory (bundled: {', '.join(BUNDLED)})")
    meta_path = root / "taskset.json"
    try:
        meta = Meta.model_validate_json(meta_path.read_text())
    except OSError as exc:
        raise TaskSetError(f"{meta_path}: cannot read: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        raise TaskSetError(
            f"{meta_path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
        ) from exc
    items: list[Item] = _jsonl(root / "items.jsonl", Item)
    docs_list: list[Doc] = _jsonl(root / "corpus.jsonl", Doc)
    docs: dict[str, Doc] = {}
    for n, d in enumerate(docs_list, 1):
        if d.id in docs:
            raise TaskSetError(f"{root / 'corpus.jsonl'}: document {n}: id: duplicate id {d.id!r}")
        docs[d.id] = d
    seen: set[str] = set()
    for n, it in enumerate(items, 1):
        if it.id in seen:
            raise TaskSetError(f"{root / 'items.jsonl'}:{n}: id: duplicate id {it.id!r}")
        seen.add(it.id)
        for g in it.gold + it.decoy_docs:
            if g not in docs:
                raise TaskSetError(
                    f"{root / 'items.jsonl'}:{n}: gold: document {g!r} is not in the corpus"
                )
    sk_path = root / "skeleton.txt"
    try:
        text = sk_path.read_text()
    except OSError as exc:
        raise TaskSetError(f"{sk_path}: cannot read: {exc.strerror or exc}") from exc
    if "{documents}" not in text or "{question}" not in text:
        raise TaskSetError(f"{sk_path}: the skeleton needs both {{documents}} and {{question}}")
    system, sep, user = text.partition("\n---\n")
    if not sep:
        system, user = "", text
    skeleton = Skeleton(system.strip(), user.strip(), text)
    fingerprint: dict[str, float] | None = None
    fp_path = root / "fingerprint.json"
    if fp_path.exists():
        try:
            raw_fp = json.loads(fp_path.read_text())
            fingerprint = {k: float(raw_fp[k]) for k in FINGERPRINT_KEYS}
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskSetError(
                f"{fp_path}: needs numbers for {', '.join(FINGERPRINT_KEYS)} ({exc})"
            ) from exc
    return TaskSet(
        meta=meta,
        items=items,
        docs=docs,
        skeleton=skeleton,
        hash=_digest(
            meta_path,
            root / "items.jsonl",
            root / "corpus.jsonl",
            sk_path,
            *([fp_path] if fingerprint is not None else []),
        ),
        corpus_hash=_digest(root / "corpus.jsonl"),
        fingerprint=fingerprint,
    )


def write_taskset(
    out: Path,
    meta: dict[str, Any],
    items: list[dict[str, Any]],
    docs: list[dict[str, Any]],
    skeleton: str,
    fingerprint: dict[str, float] | None = None,
) -> None:
    """Write a task set directory in the format :func:`load_taskset` reads (stable, diffable)."""
    out.mkdir(parents=True, exist_ok=True)
    if fingerprint is not None:
        (out / "fingerprint.json").write_text(json.dumps(fingerprint, indent=2) + "\n")
    (out / "taskset.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "items.jsonl").write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in items))
    (out / "corpus.jsonl").write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in docs))
    (out / "skeleton.txt").write_text(skeleton + "\n")


def replace_answers(path: str | Path, answers: dict[str, dict[str, Any]]) -> TaskSet:
    """Rewrite ``items.jsonl`` with these items' answers replaced (atomically: a temp file
    renamed over it), and return the task set as it now loads."""
    root = Path(path)
    items = []
    for it in load_taskset(root).items:
        d = it.model_dump(by_alias=True, exclude_defaults=True)
        if it.id in answers:
            d["answer"] = answers[it.id]
        items.append(d)
    tmp = root / "items.jsonl.tmp"
    tmp.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in items))
    tmp.replace(root / "items.jsonl")
    return load_taskset(root)

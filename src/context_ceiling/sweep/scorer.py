"""Programmatic grading (the scorer): no judge model, every failure bucketed.

The model is asked for ``{"answer": ..., "evidence": [...]}``. Scoring: normalised exact match,
a match with any of several accepted answers (or containing one), set match, or a JSON object checked against the item's JSON Schema and then field by field; an
unlabelled (``agreement``) item agrees when the answer matches the model's own evidence-only
answer: equal once normalised, or a token F1 of at least ``AGREEMENT_F1`` (the SQuAD measure:
free-text answers rarely repeat word for word).
Buckets for failures, in this order:

- ``truncated_refused``: stop reason ``length`` or a content filter, or a refusal;
- ``decoyed``: the answer is a known decoy value, or it cites a document that is not gold
  evidence (a padding neighbour answered instead), or, with no decoy list and no citation, the
  answer is a value or id that stands in a padding document shown to the model and not in the
  gold evidence (free-text answers are caught too);
- ``reasoned_wrongly``: it cites the gold evidence and still answers wrongly;
- ``missed``: anything else: no answer, no evidence, an invented value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema

from context_ceiling.sweep.taskset import (
    AgreementAnswer,
    ExactAnswer,
    Item,
    JsonAnswer,
    OneOfAnswer,
    SetAnswer,
)

#: token F1 from which two free-text answers agree
AGREEMENT_F1 = 0.6
_WORDS = re.compile(r"[a-z0-9]+")

BUCKETS = ("correct", "missed", "decoyed", "reasoned_wrongly", "truncated_refused")
_REFUSAL = re.compile(
    r"\b(i can(?:no|')t|i am unable|i'm unable|i'm sorry|i apologi[sz]e|cannot help)\b", re.I
)
_OBJECT = re.compile(r"\{.*\}", re.S)


@dataclass(frozen=True)
class Grade:
    correct: bool
    bucket: str
    answer: Any = None
    evidence: tuple[str, ...] = ()


def parse_reply(text: str) -> tuple[Any, list[str], bool]:
    """(answer, evidence ids, whether the reply was the asked-for JSON)."""
    cleaned = re.sub(r"^```(?:json)?|```$", "", text.strip(), flags=re.M).strip()
    m = _OBJECT.search(cleaned)
    if m:
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and "answer" in obj:
            ev = obj.get("evidence") or []
            ev = [str(e) for e in ev] if isinstance(ev, list) else [str(ev)]
            return obj.get("answer"), ev, True
    return (cleaned or None), [], False


def _norm(v: Any) -> str:
    s = str(v).strip().lower()
    s = re.sub(r"\b(eur|euros?|days?)\b|[€$,\s]", "", s)
    return s.rstrip(".")


def _num(v: Any) -> str:
    digits = re.findall(r"\d+", str(v).replace(",", ""))
    return digits[0] if len(digits) == 1 else _norm(v)


def _as_set(v: Any) -> set[str]:
    if isinstance(v, list):
        return {_norm(x) for x in v}
    words = re.findall(r"[A-Za-z0-9][\w.+/:-]*[\w+]|[A-Za-z0-9]", str(v))
    return {_norm(x) for x in words if x.lower() not in ("and", "or")}


def _flat(v: Any) -> str:
    return json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else str(v)


def agrees(answer: Any, reference: str) -> bool:
    """Whether ``answer`` says what ``reference`` says: equal once normalised, or token F1 at
    least :data:`AGREEMENT_F1`."""
    a, b = _WORDS.findall(_flat(answer).lower()), _WORDS.findall(reference.lower())
    if not a or not b:
        return a == b and bool(str(answer).strip()) == bool(reference.strip())
    if a == b:
        return True
    common = sum(min(a.count(w), b.count(w)) for w in set(a) & set(b))
    if common == 0:
        return False
    precision, recall = common / len(a), common / len(b)
    return 2 * precision * recall / (precision + recall) >= AGREEMENT_F1


def _equal(answer: Any, value: str) -> bool:
    """Equal once normalised (a number as its digits)."""
    if re.fullmatch(r"[\d,. ]+", value):
        return _num(answer) == _num(value)
    return _norm(answer) == _norm(value)


@lru_cache(maxsize=256)
def _validator(schema: str) -> Any:
    """The validator of one JSON schema (serialized), checked once: every answer of a sweep is
    graded again at each analysis, and checking the schema took most of the grading."""
    as_dict = json.loads(schema)
    cls = jsonschema.validators.validator_for(as_dict)
    cls.check_schema(as_dict)
    return cls(as_dict)


def is_correct(item: Item, answer: Any) -> bool:
    a = item.answer
    if answer is None:
        return False
    if isinstance(a, AgreementAnswer):
        return agrees(answer, a.value)
    if isinstance(a, ExactAnswer):
        return _equal(answer, a.value)
    if isinstance(a, OneOfAnswer):
        if a.contains:
            given = _norm(_flat(answer))
            return any(_norm(v) and _norm(v) in given for v in a.values)
        return any(_equal(answer, v) for v in a.values)
    if isinstance(a, SetAnswer):
        return _as_set(answer) == {_norm(x) for x in a.values}
    if isinstance(a, JsonAnswer):
        if isinstance(answer, str):
            try:
                answer = json.loads(answer)
            except json.JSONDecodeError:
                return False
        if not isinstance(answer, dict):
            return False
        if not _validator(json.dumps(a.schema_, sort_keys=True)).is_valid(answer):
            return False
        return all(_norm(answer.get(k)) == _norm(v) for k, v in a.value.items())
    return False


def _is_decoy(item: Item, answer: Any) -> bool:
    decoys = {_norm(d) for d in item.decoy_values}
    if not decoys or answer is None:
        return False
    if isinstance(item.answer, SetAnswer):
        return bool(_as_set(answer) & decoys)
    if isinstance(answer, dict):
        return any(_norm(v) in decoys for v in answer.values())
    return _norm(answer) in decoys or _num(answer) in decoys


def _values(answer: Any) -> list[str]:
    """The scalar values of an answer (a dict's values, a list's items), as strings."""
    if isinstance(answer, dict):
        return [v for x in answer.values() for v in _values(x)]
    if isinstance(answer, list):
        return [v for x in answer for v in _values(x)]
    return [] if answer is None else [str(answer).strip()]


@lru_cache(maxsize=65536)
def _pattern(value: str) -> re.Pattern[str] | None:
    """A value worth looking for in a document: two characters or more and not a common word."""
    v = value.strip().strip(".").lower()
    if len(v) < 2 or v in ("none", "null", "unknown", "yes", "no", "n/a", "true", "false"):
        return None
    return re.compile(r"(?<![\w])" + re.escape(v).replace(r"\ ", r"\s+") + r"(?![\w])")


_lower = lru_cache(maxsize=4096)(str.lower)
_TOKENS = re.compile(r"\d[\d,.]*\d|[A-Za-z]*\d[\w./:-]*\w|[A-Z][\w-]*-\w+")


def _in_text(value: str, text: str) -> bool:
    p = _pattern(value)
    if p is None:
        return False
    if p.search(_lower(text)):
        return True
    digits = re.sub(r"[,\s]", "", value)
    return (
        digits.isdigit()
        and len(digits) >= 3
        and bool(re.search(r"(?<![\d,])" + r",?".join(digits) + r"(?![\d])", text))
    )


def _from_padding(
    item: Item, answer: Any, shown: list[str] | None, docs: Mapping[str, str] | None
) -> bool:
    """The answer names a value or document id of a shown padding document, not of the gold."""
    if not shown or not docs:
        return False
    values = _values(answer)
    # free text: the numbers and ids it names are the candidates
    values += [t for v in values if " " in v for t in _TOKENS.findall(v)]
    if not values:
        return False
    gold = [docs.get(g, "") for g in item.gold]
    padding = [(d, docs[d]) for d in shown if d not in item.gold and d in docs]
    for v in values:
        if any(
            _in_text(v, g) or v.lower() == gid.lower()
            for g, gid in zip(gold, item.gold, strict=True)
        ):
            continue
        if any(v.lower() == d.lower() or _in_text(v, t) for d, t in padding):
            return True
    return False


def grade(
    item: Item,
    text: str | None,
    finish_reason: str | None,
    shown: list[str] | None = None,
    docs: Mapping[str, str] | None = None,
) -> Grade:
    """Grade one reply. ``shown``: the document ids that were in the prompt; ``docs``: their
    texts by id (to recognise an answer taken from a padding neighbour)."""
    answer, evidence, _ = parse_reply(text or "")
    ev = tuple(evidence)
    if is_correct(item, answer):
        return Grade(True, "correct", answer, ev)
    if finish_reason in ("length", "max_tokens", "content_filter", "refusal") or (
        text and _REFUSAL.search(text) and not evidence
    ):
        return Grade(False, "truncated_refused", answer, ev)
    gold = set(item.gold)
    cited_padding = [e for e in evidence if e not in gold and (shown is None or e in shown)]
    if _is_decoy(item, answer) or cited_padding or _from_padding(item, answer, shown, docs):
        return Grade(False, "decoyed", answer, ev)
    if gold & set(evidence) and answer not in (None, "", [], {}):
        return Grade(False, "reasoned_wrongly", answer, ev)
    return Grade(False, "missed", answer, ev)

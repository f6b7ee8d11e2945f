"""The bundled ``landmarks`` task set: no word of a question is in its evidence (the distractor
pattern NoLiMa removed), every question has one answer, and the corpus grows with notes of its
own kind to fill any window."""

from __future__ import annotations

import re
from pathlib import Path

from context_ceiling.sweep.corpora import extend, reach
from context_ceiling.sweep.landmarks import PLACES, generate, names_in, overlaps
from context_ceiling.sweep.scorer import grade
from context_ceiling.sweep.taskset import BUNDLED, bundled_path, load_taskset

STOP = {"which", "has", "been", "to", "the", "a", "could", "well", "around", "and", "of"}


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in STOP}


def test_it_is_bundled_and_regenerated_identically(tmp_path: Path) -> None:
    assert "landmarks" in BUNDLED
    generate(tmp_path)
    shipped = bundled_path("landmarks")
    for name in ("taskset.json", "items.jsonl", "corpus.jsonl", "skeleton.txt"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_no_question_shares_a_word_with_its_evidence() -> None:
    ts = load_taskset("landmarks")
    assert len(ts.items) >= 120
    for item in ts.items:
        (gold,) = item.gold
        evidence = ts.docs[gold].text
        # measured two ways: the generator's own rule, and plain word sets (no stemming)
        assert not overlaps(item.question, evidence), item.id
        assert not _words(item.question) & _words(evidence), item.id


def test_every_question_has_one_answer_in_the_corpus() -> None:
    ts = load_taskset("landmarks")
    landmarks = [p[0] for p in PLACES]
    holders: dict[str, list[str]] = {lm: [] for lm in landmarks}
    for doc in ts.docs.values():
        for lm in landmarks:
            if lm in doc.text:
                holders[lm].append(doc.id)
    assert all(len(ids) == 1 for ids in holders.values())
    cities = [p[1] for p in PLACES]
    assert len(set(cities)) == len(cities)
    for item in ts.items:
        answer = item.answer.value  # type: ignore[union-attr]
        (gold,) = item.gold
        assert answer in names_in(ts.docs[gold].text)
        # a decoy is another landmark's resident: answering it is graded as decoyed
        assert grade(item, item.decoy_values[0], "stop").bucket == "decoyed"
        assert grade(item, f"{answer}.", "stop").correct


def test_the_corpus_fills_any_window_with_notes_of_its_own_kind() -> None:
    ts = load_taskset("landmarks")
    big = extend(ts, reach([0.95], 1_000_000))
    added = [d for i, d in big.docs.items() if i not in ts.docs]
    assert sum(len(d.text) for d in big.docs.values()) >= 0.95 * 1_000_000 * 4
    assert extend(ts, reach([0.95], 1_000_000)).hash == big.hash != ts.hash
    # padding names no landmark and gives no person of the committed notes a second home
    committed = {n for d in ts.docs.values() for n in names_in(d.text)}
    for d in added[:: max(1, len(added) // 500)]:
        assert not any(p[0] in d.text for p in PLACES)
        assert not names_in(d.text) & committed

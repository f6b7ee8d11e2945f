"""Build the prompt for one sample: the same skeleton, the gold evidence, and padding from the
same corpus, filled to a target utilization with the sidecar's own token counter.

Padding is plausible neighbours first: corpus documents ranked by lexical similarity (idf-weighted
word overlap) to the question, never random text. Which documents go in is decided by rank; their
order, and where the gold evidence sits, come from a seeded schedule that is recorded. In the
shared-haystack mode many items' evidence shares one haystack per level and repeat, with each
question last, so an engine's prefix cache serves every question after the first.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from context_ceiling.core.engine_tokenize import SyncEngine
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.tokenizers import TextCounter
from context_ceiling.formats import openai_chat
from context_ceiling.sweep.taskset import Doc, Item, TaskSet

_WORD = re.compile(r"[a-z0-9]+")
NO_DOCUMENTS = "(no documents)"


def render_doc(doc: Doc) -> str:
    return f'<document id="{doc.id}">{doc.text}</document>'


def _seeded(*parts: object) -> random.Random:
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


@dataclass
class RenderedPrompt:
    """One rendered prompt and what went into it."""

    system: str
    user: str
    doc_ids: list[str]
    gold_positions: dict[str, float]
    tokens: int
    target: int
    #: the length of the user part every question on this haystack shares (0: a haystack of
    #: its own): where a prompt cache breakpoint goes
    shared: int = 0

    @property
    def messages(self) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = (
            [{"role": "system", "content": self.system}] if self.system else []
        )
        return [*msgs, {"role": "user", "content": self.user}]


@dataclass
class Meter:
    """Counts like the sidecar: the model's tokenizer and chat framing (shared definitions), or
    the serving engine itself when it can tokenize (exact)."""

    counter: TextCounter
    chat_format: ChatFormat = field(default_factory=ChatFormat)
    engine: SyncEngine | None = None

    @property
    def name(self) -> str:
        return self.engine.name if self.engine else self.counter.name

    def text(self, text: str) -> int:
        return self.engine.count(text) if self.engine else self.counter.count(text)

    def prompt(self, system: str, user: str) -> int:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        if self.engine is not None:
            return self.engine.count_chat(msgs)
        return openai_chat.count({"messages": msgs}, self.counter, self.chat_format).total


class ContextBuilder:
    def __init__(self, ts: TaskSet, meter: Meter, seed: int = 0) -> None:
        self.ts, self.meter, self.seed = ts, meter, seed
        self.doc_ids = sorted(ts.docs)
        self._words = {
            d: set(_WORD.findall((ts.docs[d].title or "") + " " + ts.docs[d].text.lower()))
            for d in self.doc_ids
        }
        df: Counter[str] = Counter()
        for ws in self._words.values():
            df.update(ws)
        n = len(self.doc_ids)
        self._idf = {w: math.log((n + 1) / (c + 0.5)) for w, c in df.items()}
        self._doc_tokens: dict[str, int] = {}
        self._sep = self.meter.text("\n")
        self._base: dict[str, int] = {}
        self._haystacks: dict[Any, tuple[list[str], dict[str, Doc], dict[str, float]]] = {}
        self._rankings: dict[tuple[str, ...], list[str]] = {}
        #: orders kept: every item's, where they fit in about 2M document references (16 MB),
        #: since the calls go level by level and each item is asked at every level
        self._rankings_kept = max(64, 2_000_000 // max(1, len(self.doc_ids)))

    def doc_tokens(self, doc_id: str) -> int:
        t = self._doc_tokens.get(doc_id)
        if t is None:
            t = self._doc_tokens[doc_id] = (
                self.meter.text(render_doc(self.ts.docs[doc_id])) + self._sep
            )
        return t

    def _cut_to(self, doc_id: str, tokens: int) -> Doc | None:
        """The document's first words, as many as fit in ``tokens`` (binary search on words)."""
        doc = self.ts.docs[doc_id]
        words = doc.text.split(" ")
        lo, hi, best = 1, len(words) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand = Doc(id=doc.id, text=" ".join(words[:mid]), title=doc.title)
            if self.meter.text(render_doc(cand)) + self._sep <= tokens:
                best, lo = cand, mid + 1
            else:
                hi = mid - 1
        return best

    def ranked(self, questions: Sequence[str], exclude: set[str]) -> list[str]:
        """Corpus documents by similarity to the questions, most similar first (ties seeded).
        The order depends on the questions alone, so it is scored once per set of questions
        (a group's haystack is built at every level and repeat from the same order)."""
        key = tuple(questions)
        order = self._rankings.get(key)
        if order is None:
            qwords = set()
            for q in questions:
                qwords |= set(_WORD.findall(q.lower()))
            rng = _seeded(self.seed, "rank", *questions)
            jitter = {d: rng.random() for d in self.doc_ids}
            scored = [
                (-sum(self._idf.get(w, 0.0) for w in qwords & self._words[d]), jitter[d], d)
                for d in self.doc_ids
            ]
            scored.sort()
            order = self._rankings[key] = [d for _, _, d in scored]
            if len(self._rankings) > self._rankings_kept:
                self._rankings.pop(next(iter(self._rankings)))
        return [d for d in order if d not in exclude]

    def base_tokens(self, question: str) -> int:
        t = self._base.get(question)
        if t is None:
            system, user = self.ts.skeleton.render("", question)
            t = self._base[question] = self.meter.prompt(system, user)
        return t

    def build(
        self,
        items: Sequence[Item],
        target: int,
        repeat: int,
        question_item: Item | None = None,
        closed_book: bool = False,
    ) -> RenderedPrompt:
        """The prompt asking ``question_item`` (default: the only item) with the evidence of all
        ``items`` (one item: a per-item haystack; several: a shared haystack, identical for each
        of their questions so a prefix cache can serve it), filled to ``target`` tokens."""
        asked = question_item or items[0]
        system, _ = self.ts.skeleton.render("", asked.question)
        if closed_book:
            _, user = self.ts.skeleton.render(NO_DOCUMENTS, asked.question)
            return RenderedPrompt(system, user, [], {}, self.meter.prompt(system, user), target)
        order, docs, positions = self._haystack(tuple(items), target, repeat)
        documents = self._render(order, docs)
        _, user = self.ts.skeleton.render(documents, asked.question)
        shared = self.ts.skeleton.shared_length(documents) if len(items) > 1 else 0
        return RenderedPrompt(
            system, user, order, positions, self.meter.prompt(system, user), target, shared
        )

    def _render(self, order: list[str], docs: dict[str, Doc]) -> str:
        return "\n".join(render_doc(docs.get(d) or self.ts.docs[d]) for d in order)

    def _haystack(
        self, items: tuple[Item, ...], target: int, repeat: int
    ) -> tuple[list[str], dict[str, Doc], dict[str, float]]:
        key = (tuple(it.id for it in items), target, repeat)
        hit = self._haystacks.get(key)
        if hit is not None:
            return hit
        gold = [g for it in items for g in it.gold]
        longest = max(items, key=lambda it: self.base_tokens(it.question))
        budget = target - self.base_tokens(longest.question) - sum(self.doc_tokens(g) for g in gold)
        chosen: list[str] = []
        skipped: list[str] = []
        used = 0
        for d in self.ranked([it.question for it in items], set(gold)):
            t = self.doc_tokens(d)
            if used + t <= budget:
                chosen.append(d)
                used += t
            else:
                skipped.append(d)
                if budget - used < 20 or len(skipped) > 400:
                    break
        # close the gap with the largest neighbours that still fit
        for d in sorted(skipped, key=self.doc_tokens, reverse=True):
            t = self.doc_tokens(d)
            if used + t <= budget:
                chosen.append(d)
                used += t
        spare = [d for d in skipped if d not in set(chosen)]
        rng = _seeded(self.seed, "order", repeat, *(it.id for it in items))
        rng.shuffle(chosen)
        order = list(chosen)
        for it in items:
            # seeded, stratified over repeats: front, middle and back all get measured
            u = _seeded(self.seed, "pos", it.id).random()
            at = round((((repeat + u) / 3.0) % 1.0) * len(order))
            for g in it.gold:
                order.insert(at, g)
        # measure the real prompt (the longest question) and top up with the next neighbour,
        # cut at a word boundary, until the level is within 0.5% of its target
        docs: dict[str, Doc] = {}
        for _ in range(3):
            _, user = self.ts.skeleton.render(self._render(order, docs), longest.question)
            short = target - self.meter.prompt(self.ts.skeleton.system, user)
            if short <= max(4, target // 200) or not spare:
                break
            d = spare.pop(0)
            cut = self._cut_to(d, short - 1)
            if cut is None:
                continue
            docs[d] = cut
            order.insert(rng.randrange(len(order) + 1), d)
        n = max(1, len(order) - 1)
        positions = {
            it.id: round(sum(order.index(g) for g in it.gold) / len(it.gold) / n, 4) for it in items
        }
        self._haystacks[key] = (order, docs, positions)
        if len(self._haystacks) > 64:
            self._haystacks.pop(next(iter(self._haystacks)))
        return order, docs, positions


def group_items(
    builder: ContextBuilder, items: Sequence[Item], smallest_target: int, shared: bool
) -> list[list[Item]]:
    """Haystack groups: one item each, or, shared, as many as the smallest level can hold (their
    evidence fills at most 80% of it; at that level the other items' evidence is the padding, and
    it is as confusable as any neighbour)."""
    if not shared:
        return [[it] for it in items]
    base = max((builder.base_tokens(it.question) for it in items), default=0)
    room = max(0, int((smallest_target - base) * 0.8))
    groups: list[list[Item]] = [[]]
    used = 0
    for it in items:
        t = sum(builder.doc_tokens(g) for g in it.gold)
        if groups[-1] and used + t > room:
            groups.append([])
            used = 0
        groups[-1].append(it)
        used += t
    return groups

"""Task sets from your own traffic (``ceiling taskset build``), and their reference answers
(``ceiling taskset reference``).

From the capture stores the sidecars wrote:

- the **corpus** is the retrieved chunks, deduplicated (the real corpus: the sweep pads with real
  neighbours);
- the **items** are the captured questions with the chunks they were answered from as gold
  evidence; near-duplicate questions are merged (word-set Jaccard at or above
  ``near_duplicate``, with the same numbers and identifiers), and the items are ordered round-robin over strata (workload x evidence
  size quartile), so any prefix the sweep draws is balanced;
- the **skeleton** is the most common captured system prompt, with the documents and the
  question as the application sent them and the sweep's answer format;
- the **fingerprint** is the captured traffic's shape, recorded in the derived ceiling so the
  sidecar's staleness check compares live traffic with what was really measured.

Answers: each item starts unlabelled, its gold the answer production gave (``agreement``,
``source: captured``); ``ceiling taskset reference`` replaces it with the swept model's own answer
with only the evidence in context (``source: reference:<model>``), and labels imported with
``ceiling taskset import`` turn items into graded ones (exact / set / JSON).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from context_ceiling.core.capture import CaptureRecord, CaptureStore, store_paths
from context_ceiling.core.errors import UserError
from context_ceiling.core.tokenizers import load_encoding
from context_ceiling.sweep.prompts import RenderedPrompt, render_doc
from context_ceiling.sweep.scorer import parse_reply
from context_ceiling.sweep.solver import Endpoint, call_model
from context_ceiling.sweep.statistics import items_for
from context_ceiling.sweep.taskset import (
    AgreementAnswer,
    TaskSet,
    load_taskset,
    replace_answers,
    write_taskset,
)

ANSWER_FORMAT = (
    'Reply with JSON only, in this form: {"answer": <the answer>, '
    '"evidence": [<ids of the documents you used>]}'
)
_WORD = re.compile(r"[a-z0-9]+")
SIZE_STRATA = ("s", "m", "l", "xl")


@dataclass
class BuildOptions:
    captures: list[str]
    out: str
    name: str | None = None
    workloads: list[str] = field(default_factory=list)
    tolerance: float = 0.05
    repeats: int = 3
    #: the items the build must yield (default: what the tolerance needs)
    min_items: int | None = None
    max_items: int | None = None
    near_duplicate: float = 0.8
    seed: int = 0


@dataclass
class BuildReport:
    records: int
    skipped: dict[str, int]
    merged: int
    items: int
    docs: int
    needed: int
    workloads: dict[str, int]
    strata: dict[str, int]

    def lines(self) -> list[str]:
        skipped = ", ".join(f"{n} {why}" for why, n in self.skipped.items() if n) or "none"
        return [
            f"{self.records} captured requests read; skipped: {skipped}; "
            f"{self.merged} near-duplicate questions merged",
            f"{self.items} items over {self.docs} corpus documents (the deduplicated retrieved "
            f"chunks); by workload: {dict(sorted(self.workloads.items()))}; by evidence size: "
            f"{self.strata}",
        ]


def _norm_text(s: str) -> str:
    return " ".join(s.split())


def _doc_id(text: str) -> str:
    return "c-" + hashlib.sha256(_norm_text(text).encode()).hexdigest()[:12]


def _answer_of(response: str) -> str:
    """The answer in a captured response: the ``answer`` of a JSON reply, else the text."""
    answer, _, structured = parse_reply(response)
    if structured:
        return answer if isinstance(answer, str) else json.dumps(answer, sort_keys=True)
    return response.strip()


@dataclass
class _Candidate:
    record: CaptureRecord
    evidence: list[str]
    words: frozenset[str]
    size: int
    duplicates: int = 0

    @property
    def ids(self) -> frozenset[str]:
        """The numbers and identifiers in the question: near-duplicates must share them all."""
        return frozenset(w for w in self.words if any(ch.isdigit() for ch in w))


def _merge_near_duplicates(
    cands: list[_Candidate], threshold: float
) -> tuple[list[_Candidate], int]:
    """Union near-duplicate questions (word-set Jaccard >= threshold), keeping the first seen.
    Candidates are compared only when they share one of their two rarest words (blocking)."""
    freq: Counter[str] = Counter(w for c in cands for w in c.words)
    index: dict[str, list[int]] = defaultdict(list)
    parent = list(range(len(cands)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, c in enumerate(cands):
        keys = sorted(c.words, key=lambda w: (freq[w], w))[:2]
        seen: set[int] = set()
        for k in keys:
            for j in index[k]:
                if j in seen:
                    continue
                seen.add(j)
                other = cands[j].words
                union = len(c.words | other)
                if (
                    union
                    and len(c.words & other) / union >= threshold
                    and c.ids == cands[j].ids  # C-4417 and C-4471 are different questions
                ):
                    parent[find(i)] = find(j)
            index[k].append(i)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(cands)):
        groups[find(i)].append(i)
    kept = []
    for members in groups.values():
        first = cands[min(members)]
        first.duplicates = len(members) - 1
        kept.append(first)
    kept.sort(key=lambda c: c.record.ts)
    return kept, len(cands) - len(kept)


def _strata(cands: list[_Candidate]) -> dict[int, str]:
    """Evidence-size quartile of each candidate."""
    sizes = sorted(c.size for c in cands)

    def q(f: float) -> int:
        return sizes[min(len(sizes) - 1, int(f * len(sizes)))]

    cuts = (q(0.25), q(0.5), q(0.75))
    out = {}
    for i, c in enumerate(cands):
        out[i] = SIZE_STRATA[sum(c.size > cut for cut in cuts)]
    return out


def _candidates(
    records: list[CaptureRecord], workloads: list[str] | None
) -> tuple[dict[str, int], dict[str, dict[str, Any]], list[_Candidate]]:
    """The captured requests that can be items (a question, retrieved chunks and an answer),
    why the others were skipped, and the corpus their chunks make (each chunk once, by
    content)."""
    skipped = {"other workloads": 0, "no question": 0, "no retrieved chunks": 0, "no answer": 0}
    docs: dict[str, dict[str, Any]] = {}
    cands: list[_Candidate] = []
    for r in records:
        if workloads and r.workload not in workloads:
            skipped["other workloads"] += 1
            continue
        if not r.question.strip():
            skipped["no question"] += 1
            continue
        if not r.chunks:
            skipped["no retrieved chunks"] += 1
            continue
        if not (r.response or "").strip():
            skipped["no answer"] += 1
            continue
        evidence: list[str] = []
        for c in sorted(r.chunks, key=lambda c: c.rank):
            did = _doc_id(c.text)
            if did not in docs:
                docs[did] = {"id": did, "text": c.text.strip()}
                if c.source_id:
                    docs[did]["title"] = c.source_id
            if did not in evidence:
                evidence.append(did)
        words = frozenset(_WORD.findall(r.question.lower()))
        cands.append(_Candidate(r, evidence, words, sum(len(c.text) for c in r.chunks)))
    return skipped, docs, cands


def _stratified(kept: list[_Candidate], size_of: dict[int, str], seed: int) -> list[_Candidate]:
    """Round-robin over (workload, evidence size) strata, shuffled within each (seeded): any
    prefix of the order is a balanced sample."""
    strata: dict[tuple[str, str], list[_Candidate]] = defaultdict(list)
    for i, cand in enumerate(kept):
        strata[(cand.record.workload, size_of[i])].append(cand)
    rng = random.Random(seed)
    for members in strata.values():
        rng.shuffle(members)
    ordered: list[_Candidate] = []
    queues = [strata[k] for k in sorted(strata)]
    while any(queues):
        for q in queues:
            if q:
                ordered.append(q.pop())
    return ordered


def _fingerprint(chosen: list[CaptureRecord]) -> dict[str, float]:
    """What the prompts of the traffic look like on average, in o200k tokens: the system
    prompt, the tool definitions, the retrieved chunks (how many, how long)."""
    enc = load_encoding("o200k_base")
    n = max(1, len(chosen))
    chunk_counts = [len(r.chunks) for r in chosen]
    chunk_tokens = [len(enc.encode_ordinary(ch.text)) for r in chosen for ch in r.chunks]
    return {
        "system_tokens": round(sum(len(enc.encode_ordinary(r.system)) for r in chosen) / n, 1),
        "tool_definition_tokens": round(
            sum(len(enc.encode_ordinary(r.tools)) for r in chosen) / n, 1
        ),
        "retrieved_chunks": round(sum(chunk_counts) / n, 2),
        "retrieved_chunk_tokens": round(sum(chunk_tokens) / max(1, len(chunk_tokens)), 1),
    }


def build(opts: BuildOptions) -> BuildReport:
    """Build the task set into ``opts.out``; raises :class:`UserError` (nothing written) when the
    captures yield fewer items than needed, saying how many more."""
    records: list[CaptureRecord] = []
    for path in store_paths(opts.captures):
        store = CaptureStore.open(path)
        try:
            records += store.records()
        finally:
            store.close()
    records.sort(key=lambda r: r.ts)
    skipped, docs, cands = _candidates(records, opts.workloads)
    kept, merged = _merge_near_duplicates(cands, opts.near_duplicate) if cands else ([], 0)
    needed = (
        opts.min_items if opts.min_items is not None else items_for(opts.tolerance, opts.repeats)
    )
    if len(kept) < needed:
        raise UserError(
            f"{len(kept)} items from {len(records)} captured requests (skipped: "
            + (", ".join(f"{n} {why}" for why, n in skipped.items() if n) or "none")
            + f"; {merged} near-duplicates merged); "
            + (
                f"a {opts.tolerance:.0%} tolerance needs about {needed}"
                if opts.min_items is None
                else f"--min-items asks for {needed}"
            )
            + f": capture about {needed - len(kept)} more (a higher capture.sample_rate or a "
            "longer window), or sweep with a wider --tolerance"
        )
    size_of = _strata(kept)
    ordered = _stratified(kept, size_of, opts.seed)
    if opts.max_items is not None:
        ordered = ordered[: opts.max_items]
    stratum_of = {id(k): size_of[i] for i, k in enumerate(kept)}
    items: list[dict[str, Any]] = []
    for cand in ordered:
        r = cand.record
        items.append(
            {
                "id": "q-"
                + hashlib.sha256(_norm_text(r.question).lower().encode()).hexdigest()[:12],
                "question": r.question,
                "gold": cand.evidence,
                "answer": AgreementAnswer(
                    kind="agreement", value=_answer_of(r.response or ""), source="captured"
                ).model_dump(),
                "origin": {
                    "workload": r.workload,
                    "model": r.model,
                    "captured_at": datetime.fromtimestamp(r.ts, UTC).isoformat(timespec="seconds"),
                    "duplicates": cand.duplicates,
                    "evidence_size": stratum_of[id(cand)],
                    "captured_answer": r.response,
                },
            }
        )
    corpus = [docs[d] for d in sorted(docs)]  # every chunk: the unused ones pad as neighbours
    chosen = [c.record for c in ordered]
    systems = Counter(r.system for r in chosen)
    system = systems.most_common(1)[0][0] if systems else ""
    skeleton = f"{system}\n---\n{{documents}}\n\n{{question}}\n\n{ANSWER_FORMAT}"
    fingerprint = _fingerprint(chosen)
    workloads = Counter(it["origin"]["workload"] for it in items)
    name = opts.name or Path(opts.out).name
    write_taskset(
        Path(opts.out),
        {
            "name": name,
            "format_version": 1,
            "seed": opts.seed,
            "description": f"Built from {len(records)} captured requests "
            f"({', '.join(sorted(workloads))}) on {datetime.now(UTC).date().isoformat()}: "
            f"{len(items)} questions with the chunks they were answered from; "
            f"{systems.most_common(1)[0][1] if systems else 0} of them share the skeleton's "
            "system prompt.",
            "licence": "your own traffic, redacted at capture",
        },
        items,
        corpus,
        skeleton,
        fingerprint,
    )
    return BuildReport(
        records=len(records),
        skipped=skipped,
        merged=merged,
        items=len(items),
        docs=len(corpus),
        needed=needed,
        workloads=dict(workloads),
        strata=dict(Counter(it["origin"]["evidence_size"] for it in items)),
    )


# -- reference answers: the model's own answer with only the evidence ----------------------------


def evidence_prompt(ts: TaskSet, item_id: str) -> RenderedPrompt:
    """The skeleton with only the item's gold evidence as documents."""
    item = next(i for i in ts.items if i.id == item_id)
    docs = "\n".join(render_doc(ts.docs[d]) for d in item.gold)
    system, user = ts.skeleton.render(docs, item.question)
    return RenderedPrompt(system, user, list(item.gold), {}, 0, 0)


async def _reference(
    ts: TaskSet, ep: Endpoint, ids: Sequence[str], concurrency: int
) -> dict[str, str]:
    sem = asyncio.Semaphore(concurrency)
    out: dict[str, str] = {}

    async def one(client: httpx.AsyncClient, item_id: str) -> None:
        async with sem:
            result = await call_model(client, ep, evidence_prompt(ts, item_id))
        text = result.get("text") or ""
        answer, _, _ = parse_reply(text)
        if answer is not None and str(answer).strip():
            out[item_id] = answer if isinstance(answer, str) else json.dumps(answer, sort_keys=True)

    async with httpx.AsyncClient(timeout=ep.timeout_s, trust_env=False) as client:
        await asyncio.gather(*(one(client, i) for i in ids))
    return out


def reference(path: str, ep: Endpoint, concurrency: int = 4) -> tuple[int, int]:
    """Ask ``ep``'s model each unlabelled item's question with only its evidence; its answer
    becomes the item's agreement gold. Returns (answered, asked); labelled items are left alone."""
    ts = load_taskset(path)
    ids = [i.id for i in ts.items if isinstance(i.answer, AgreementAnswer)]
    got = asyncio.run(_reference(ts, ep, ids, concurrency))
    replace_answers(
        path,
        {
            k: {"kind": "agreement", "value": v, "source": f"reference:{ep.model}"}
            for k, v in got.items()
        },
    )
    return len(got), len(ids)

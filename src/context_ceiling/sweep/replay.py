"""What enforcing a ceiling buys, measured on the model: held-out items asked as retrieval
requests far above the ceiling, graded untrimmed and trimmed.

A sweep says where accuracy falls; this says what holding requests under the ceiling gives back.
Items the sweep did not use are asked the way a retriever would ask them: the evidence ranked
first, then as many plausible neighbours from the same corpus as it takes to reach the target
size (well above the ceiling). The same requests go through a sidecar twice: with the ceiling
observed (forwarded whole) and enforced (the retrieved stage drops the lowest-ranked chunks down
to the ceiling). Each answer is graded by the sweep's own scorer; the two sides are compared with
the sweep's intervals (items as the unit) and written as ``replay.json`` beside the run, which the
run's report shows.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from context_ceiling.sweep.prompts import ContextBuilder, render_doc
from context_ceiling.sweep.scorer import BUCKETS, grade
from context_ceiling.sweep.statistics import accuracy_interval, difference_interval
from context_ceiling.sweep.taskset import Item, TaskSet

__all__ = [
    "ReplayAnswer",
    "ReplayRequest",
    "Side",
    "compare",
    "load",
    "outcome",
    "requests",
    "summarise",
    "write",
]

FILE = "replay.json"


@dataclass(frozen=True)
class ReplayRequest:
    """One held-out item asked with ``chunks`` retrieved documents, evidence first."""

    item: Item
    messages: list[dict[str, Any]]
    chunks: int
    tokens: int
    shown: list[str]


@dataclass(frozen=True)
class ReplayAnswer:
    """One answer: graded, with the sidecar's input count, what it trimmed and what the server
    itself reported as prompt tokens."""

    item: str
    correct: bool
    bucket: str
    input_tokens: int
    trimmed_tokens: int
    server_prompt_tokens: int | None
    #: the answer's wall time, seconds (what the untrimmed context also costs)
    seconds: float | None = None


@dataclass
class Side:
    """One mode's outcomes, summarised."""

    mode: str
    n: int
    accuracy: float
    ci: tuple[float, float]
    input_tokens: float
    trimmed_tokens: float
    server_prompt_tokens: float | None
    buckets: dict[str, float] = field(default_factory=dict)
    seconds: float | None = None


def requests(
    ts: TaskSet,
    builder: ContextBuilder,
    exclude: set[str],
    n: int,
    target_tokens: int,
    seed: int = 0,
) -> list[ReplayRequest]:
    """``n`` items not in ``exclude`` (seeded), each as a retrieval request of about
    ``target_tokens``: the skeleton, the evidence first, then neighbours by similarity."""
    pool = sorted((i for i in ts.items if i.id not in exclude), key=lambda i: i.id)
    out = []
    for item in random.Random(seed).sample(pool, min(n, len(pool))):
        order = list(item.gold)
        base = builder.base_tokens(item.question) + sum(builder.doc_tokens(g) for g in order)
        used = base
        for d in builder.ranked([item.question], set(item.gold)):
            t = builder.doc_tokens(d)
            if used + t > target_tokens:
                break
            order.append(d)
            used += t
        documents = "\n".join(render_doc(ts.docs[d]) for d in order)
        system, user = ts.skeleton.render(documents, item.question)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        out.append(ReplayRequest(item, messages, len(order), used, order))
    return out


def outcome(
    req: ReplayRequest,
    ts: TaskSet,
    text: str | None,
    finish_reason: str | None,
    input_tokens: int,
    trimmed_tokens: int,
    server_prompt_tokens: int | None,
    seconds: float | None = None,
) -> ReplayAnswer:
    """Grade one answer with the sweep's scorer."""
    docs = {d: ts.docs[d].text for d in req.shown}
    g = grade(req.item, text, finish_reason, req.shown, docs)
    return ReplayAnswer(
        req.item.id,
        g.correct,
        g.bucket,
        input_tokens,
        trimmed_tokens,
        server_prompt_tokens,
        seconds,
    )


def summarise(mode: str, outcomes: Sequence[ReplayAnswer]) -> Side:
    """Accuracy with the sweep's interval, mean tokens, failure buckets."""
    correct = [float(o.correct) for o in outcomes]
    served = [o.server_prompt_tokens for o in outcomes if o.server_prompt_tokens is not None]
    timed = [o.seconds for o in outcomes if o.seconds is not None]
    counts = Counter(o.bucket for o in outcomes)
    return Side(
        mode=mode,
        n=len(outcomes),
        accuracy=round(mean(correct), 4) if correct else 0.0,
        ci=accuracy_interval(correct) if correct else (0.0, 1.0),
        input_tokens=round(mean(o.input_tokens for o in outcomes), 1) if outcomes else 0.0,
        trimmed_tokens=round(mean(o.trimmed_tokens for o in outcomes), 1) if outcomes else 0.0,
        server_prompt_tokens=round(mean(served), 1) if served else None,
        buckets={b: round(counts.get(b, 0) / len(outcomes), 4) for b in BUCKETS}
        if outcomes
        else {},
        seconds=round(mean(timed), 2) if timed else None,
    )


def compare(
    before: Sequence[ReplayAnswer], after: Sequence[ReplayAnswer]
) -> tuple[float, tuple[float, float]]:
    """The paired difference in accuracy (after - before, by item) and its interval."""
    b = {o.item: float(o.correct) for o in before}
    diffs = [float(o.correct) - b[o.item] for o in after if o.item in b]
    if not diffs:
        return 0.0, (-1.0, 1.0)
    return round(mean(diffs), 4), difference_interval(diffs)


def write(
    run_dir: Path,
    ceiling_tokens: int,
    before: Sequence[ReplayAnswer],
    after: Sequence[ReplayAnswer],
) -> dict[str, Any]:
    """``replay.json`` in the run directory (the report shows it); returns what was written."""
    diff, ci = compare(before, after)
    doc = {
        "ceiling_tokens": ceiling_tokens,
        "observe": asdict(summarise("observe", before)),
        "enforce": asdict(summarise("enforce", after)),
        "difference": diff,
        "difference_ci": list(ci),
        "outcomes": {
            "observe": [asdict(o) for o in before],
            "enforce": [asdict(o) for o in after],
        },
    }
    (run_dir / FILE).write_text(json.dumps(doc, indent=2))
    return doc


def load(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``replay.json``, or None when none was measured."""
    path = run_dir / FILE
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data

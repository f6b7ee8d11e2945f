"""A request builder's budget: how many of its ranked chunks, how much history and how much of a
tool result fit under the ceiling, counted with the counter the sidecar uses, before the prompt
is built.

The method says to enforce the ceiling where requests are built (cap retrieved chunks, history,
tool results carried forward); the sidecar's trimming is the safety net. An application asks for
its budget once (``Budget.from_sidecar``: the sidecar's read-only ``GET /budget``, or
``Budget.for_model`` from a ceilings document it holds) and then fits its parts to it::

    budget = Budget.from_sidecar("http://ceiling:8787", model="gpt-4o", workload="rag")
    fixed = budget.count(SYSTEM_PROMPT + question)
    chunks = ranked[: budget.chunks_that_fit(ranked, used=fixed)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from context_ceiling.ceilings.document import CeilingsDocument
from context_ceiling.core.models import CalibratedSpec, ModelSpec, TiktokenSpec, build_counter
from context_ceiling.core.tokenizers import CalibratedCounter, TextCounter, TiktokenCounter
from context_ceiling.core.trim import MARKER, input_budget
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import count


@dataclass
class Budget:
    """An input budget in tokens and the counter that measures against it.

    ``tokens`` is what a request's input may hold: the ceiling, never more than the window less
    the output reservation (the sidecar's own rule). Every method counts with ``counter``."""

    tokens: int
    counter: TextCounter = field(default_factory=lambda: TiktokenCounter("o200k_base"))
    window: int | None = None
    ceiling_tokens: int | None = None
    reservation: int = 0
    #: where the number comes from (the ceiling's version, sweep run, ...), for logs
    provenance: dict[str, Any] = field(default_factory=dict)

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def for_model(
        cls,
        spec: ModelSpec,
        reservation: int,
        ceilings: CeilingsDocument | None = None,
        workload: str = "default",
    ) -> Budget:
        """The budget the sidecar would enforce for ``spec`` (its label and window), the
        workload's ceiling in ``ceilings`` (or none) and an output ``reservation``."""
        entry = ceilings.lookup(spec.metric_label, workload) if ceilings is not None else None
        ceiling = entry.ceiling_tokens if entry is not None else None
        reserve = reservation + spec.reasoning_reservation
        return cls(
            tokens=input_budget(spec.window, reserve, ceiling),
            counter=build_counter(spec.tokenizer),
            window=spec.window,
            ceiling_tokens=ceiling,
            reservation=reserve,
            provenance={
                "ceilings_version": ceilings.version if ceilings is not None else None,
                "sweep_run_id": entry.provenance.sweep_run_id if entry is not None else None,
            },
        )

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> Budget:
        """A budget from the sidecar's ``GET /budget`` answer (its ``tokenizer`` says how to
        count: a shipped encoding, with a factor for calibrated models)."""
        tok = answer.get("tokenizer") or {}
        encoding = tok.get("encoding") or "o200k_base"
        counter: TextCounter = TiktokenCounter(encoding)
        if tok.get("factor"):
            counter = CalibratedCounter(counter, float(tok["factor"]))
        return cls(
            tokens=int(answer["input_budget"]),
            counter=counter,
            window=answer.get("window"),
            ceiling_tokens=answer.get("ceiling_tokens"),
            reservation=int(answer.get("reservation") or 0),
            provenance=dict(answer.get("provenance") or {}),
        )

    @classmethod
    def from_sidecar(
        cls,
        base_url: str,
        model: str,
        workload: str = "default",
        reservation: int | None = None,
        token: str | None = None,
        timeout: float = 5.0,
    ) -> Budget:
        """Ask a running sidecar (its read-only ``GET /budget``; ``token``: its read token, if
        one is configured)."""
        import httpx

        params: dict[str, Any] = {"model": model, "workload": workload}
        if reservation is not None:
            params["reservation"] = reservation
        headers = {"authorization": f"Bearer {token}"} if token else {}
        r = httpx.get(
            base_url.rstrip("/") + "/budget", params=params, headers=headers, timeout=timeout
        )
        r.raise_for_status()
        return cls.from_answer(r.json())

    # -- fitting ---------------------------------------------------------------------------

    def count(self, text: str) -> int:
        return self.counter.count(text)

    def count_request(
        self, body: Mapping[str, Any], shape: Shape = "openai", *, api: Shape | None = None
    ) -> int:
        """A whole request body of ``shape``, counted as the sidecar counts it (``api=``: the
        deprecated former name of ``shape``)."""
        if api is not None:
            return count(body, api=api, counter=self.counter).total
        return count(body, shape=shape, counter=self.counter).total

    def remaining(self, used: int) -> int:
        return max(0, self.tokens - used)

    def chunks_that_fit(self, chunks: Sequence[str], used: int = 0, per_chunk: int = 0) -> int:
        """How many of ``chunks`` (ranked, best first) fit after ``used`` tokens, each costing
        its text plus ``per_chunk`` tokens of wrapping (a ``<document>`` tag, a separator).
        Whole chunks only: take ``chunks[:n]``."""
        left = self.remaining(used)
        n = 0
        for chunk in chunks:
            cost = self.count(chunk) + per_chunk
            if cost > left:
                break
            left -= cost
            n += 1
        return n

    def history_that_fits(
        self, messages: Sequence[Mapping[str, Any]], used: int = 0, per_message: int = 4
    ) -> int:
        """Where to start a chat history so that its most recent messages fit after ``used``
        tokens (``per_message``: each message's framing): keep ``messages[start:]``. A start
        never lands on a tool result, which must follow its call."""
        left = self.remaining(used)
        start = len(messages)
        for i in range(len(messages) - 1, -1, -1):
            cost = _message_tokens(self, messages[i]) + per_message
            if cost > left:
                break
            left -= cost
            start = i
        while start < len(messages) and messages[start].get("role") in ("tool", "function"):
            start += 1
        return start

    def fit_text(self, text: str, used: int = 0) -> str:
        """``text`` (a tool result, a document) as it fits after ``used`` tokens: whole when it
        does, else its head and tail around the marker the sidecar uses."""
        left = self.remaining(used)
        tokens = self.count(text)
        if tokens <= left:
            return text
        marker = self.count(MARKER.format(n=tokens))
        keep = max(0, left - marker)
        if keep == 0:
            return MARKER.format(n=tokens).strip()
        chars = max(1, int(len(text) * keep / tokens / 2))
        for _ in range(8):
            head, tail = text[:chars], text[-chars:]
            out = head + MARKER.format(n=tokens - self.count(head) - self.count(tail)) + tail
            if self.count(out) <= left or chars <= 1:
                return out
            chars = max(1, int(chars * 0.9))
        return out


def _message_tokens(budget: Budget, m: Mapping[str, Any]) -> int:
    content = m.get("content")
    if isinstance(content, str):
        n = budget.count(content)
    elif isinstance(content, list):
        n = sum(budget.count(str(b.get("text") or "")) for b in content if isinstance(b, Mapping))
    else:
        n = 0
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        n += budget.count(str(fn.get("name") or "")) + budget.count(str(fn.get("arguments") or ""))
    return n


def answer_for(
    spec: ModelSpec, label: str, workload: str, reservation: int, ceilings: CeilingsDocument
) -> dict[str, Any]:
    """What ``GET /budget`` answers for a model, workload and output reservation."""
    b = Budget.for_model(spec, reservation, ceilings, workload)
    entry = ceilings.lookup(label, workload)
    tok = spec.tokenizer
    tokenizer: dict[str, Any] = {"kind": tok.kind}
    if isinstance(tok, TiktokenSpec | CalibratedSpec):
        tokenizer["encoding"] = tok.encoding
    if isinstance(tok, CalibratedSpec):
        tokenizer["factor"] = tok.factor
    return {
        "model": label,
        "workload": entry.workload if entry is not None else workload,
        "window": spec.window,
        "reservation": b.reservation,
        "ceiling_tokens": b.ceiling_tokens,
        "input_budget": b.tokens,
        "tokenizer": tokenizer,
        "provenance": {
            "ceilings_version": ceilings.version,
            "sweep_run_id": entry.provenance.sweep_run_id if entry else None,
            "task_set_hash": entry.provenance.task_set_hash if entry else None,
            "created_at": entry.created_at.isoformat() if entry and entry.created_at else None,
            "mode": entry.mode if entry else None,
        },
    }

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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from context_ceiling.ceilings.document import CeilingsDocument
from context_ceiling.core.errors import CeilingError
from context_ceiling.core.models import CalibratedSpec, ModelSpec, TiktokenSpec, build_counter
from context_ceiling.core.tokenizers import CalibratedCounter, TextCounter, TiktokenCounter
from context_ceiling.core.trim import MARKER, input_budget
from context_ceiling.core.vocabulary import OverCeiling, Shape
from context_ceiling.formats import count


class BudgetError(CeilingError):
    """``Budget.from_sidecar`` could not get a budget: the sidecar's own message (its error body)
    or the transport's, with the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TokenizerInfo(BaseModel):
    """How to count against the budget: a shipped encoding, with a factor for calibrated
    models."""

    kind: str = Field(description="tiktoken, calibrated, huggingface or upstream")
    encoding: str | None = Field(default=None, description="the tiktoken encoding counted with")
    factor: float | None = Field(default=None, description="calibrated: the count's multiplier")


class BudgetProvenance(BaseModel):
    """Where the ceiling comes from."""

    ceilings_version: int = Field(description="the ceilings document in force")
    sweep_run_id: str | None = None
    task_set_hash: str | None = None
    created_at: str | None = None
    mode: str | None = Field(default=None, description="the entry's own enforcement mode")


class FallbackBudget(BaseModel):
    """A model a request over the ceiling may go to, with its own input budget."""

    model: str = Field(description="the model as clients name it")
    label: str = Field(description="its label in metrics and ceilings documents")
    window: int
    ceiling_tokens: int | None = Field(description="its measured ceiling for the workload")
    input_budget: int = Field(description="what a request to it may hold (its ceiling, or window)")
    measured: bool = Field(description="False: no ceiling measured, judged by the window")


class BudgetAnswer(BaseModel):
    """``GET /budget``: the input budget a request builder fits its prompt to."""

    model: str = Field(description="the model's label")
    workload: str
    window: int
    reservation: int = Field(description="output tokens reserved on top of the input")
    ceiling_tokens: int | None = Field(description="the measured ceiling; null: none")
    input_budget: int = Field(description="min(ceiling, window - reservation)")
    tokenizer: TokenizerInfo
    provenance: BudgetProvenance
    over_ceiling: OverCeiling = Field(
        default="trim",
        description="what a request over the budget gets in enforce mode: trim, reject, "
        "fallback or trim_then_fallback",
    )
    fallback: list[FallbackBudget] = Field(
        default_factory=list,
        description="the models, in order, a request over the budget may be sent to, each with "
        "its own budget (fallback and trim_then_fallback)",
    )


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
        cache: str | Path | None = None,
    ) -> Budget:
        """Ask a running sidecar (its read-only ``GET /budget``; ``token``: its read token, if
        one is configured). Raises :class:`BudgetError` with the sidecar's own message when it
        refuses (a 4xx: an unknown model, a wrong token) or cannot be reached. ``cache``: a file
        each answer is written to; when the sidecar cannot answer (unreachable, a 5xx, an
        unreadable answer) the budget is read from it instead, with ``provenance["cached"]``
        saying why (a refusal is never answered from the cache)."""
        import httpx

        params: dict[str, Any] = {"model": model, "workload": workload}
        if reservation is not None:
            params["reservation"] = reservation
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            r = httpx.get(
                base_url.rstrip("/") + "/budget", params=params, headers=headers, timeout=timeout
            )
            if r.status_code != 200:
                raise BudgetError(
                    f"the sidecar answered {r.status_code}: {_message_of(r.content)}",
                    r.status_code,
                )
            answer = r.json()
            budget = cls.from_answer(answer)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            error = BudgetError(f"no budget from {base_url}: {exc}")
            if cache is None or not Path(cache).is_file():
                raise error from exc
            return cls._cached(Path(cache), error)
        except BudgetError as error:
            if cache is None or not Path(cache).is_file() or (error.status or 500) < 500:
                raise
            return cls._cached(Path(cache), error)
        if cache is not None:
            Path(cache).write_text(json.dumps(answer))
        return budget

    @classmethod
    def _cached(cls, cache: Path, error: BudgetError) -> Budget:
        """The last answer the sidecar gave, when it cannot answer now (marked so)."""
        try:
            budget = cls.from_answer(json.loads(cache.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BudgetError(
                f"{error}; and the cached answer {cache} is unreadable: {exc}"
            ) from exc
        budget.provenance["cached"] = str(error)
        return budget

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
    spec: ModelSpec,
    label: str,
    workload: str,
    reservation: int,
    ceilings: CeilingsDocument,
    over_ceiling: OverCeiling = "trim",
    fallback: Sequence[tuple[str, ModelSpec]] = (),
) -> dict[str, Any]:
    """What ``GET /budget`` answers for a model, workload and output reservation
    (:class:`BudgetAnswer`); ``fallback``: the models a request over it may go to, in order."""
    b = Budget.for_model(spec, reservation, ceilings, workload)
    entry = ceilings.lookup(label, workload)
    tok = spec.tokenizer
    tokenizer: dict[str, Any] = {"kind": tok.kind}
    if isinstance(tok, TiktokenSpec | CalibratedSpec):
        tokenizer["encoding"] = tok.encoding
    if isinstance(tok, CalibratedSpec):
        tokenizer["factor"] = tok.factor
    others = []
    for name, other in fallback:
        ob = Budget.for_model(other, reservation, ceilings, workload)
        others.append(
            FallbackBudget(
                model=name,
                label=other.metric_label,
                window=other.window,
                ceiling_tokens=ob.ceiling_tokens,
                input_budget=ob.tokens,
                measured=ob.ceiling_tokens is not None,
            )
        )
    return BudgetAnswer(
        model=label,
        workload=entry.workload if entry is not None else workload,
        window=spec.window,
        reservation=b.reservation,
        ceiling_tokens=b.ceiling_tokens,
        input_budget=b.tokens,
        tokenizer=TokenizerInfo(**tokenizer),
        provenance=BudgetProvenance(
            ceilings_version=ceilings.version,
            sweep_run_id=entry.provenance.sweep_run_id if entry else None,
            task_set_hash=entry.provenance.task_set_hash if entry else None,
            created_at=entry.created_at.isoformat() if entry and entry.created_at else None,
            mode=entry.mode if entry else None,
        ),
        over_ceiling=over_ceiling,
        fallback=others,
    ).model_dump(mode="json")


def _message_of(body: bytes) -> str:
    """The sidecar's error message (``{"error": {"message": ...}}``), else the body's start."""
    try:
        err = json.loads(body).get("error") or {}
        return str(err.get("message") or body[:200].decode(errors="replace"))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")

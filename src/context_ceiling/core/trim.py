"""Fit a chat request into its token budget the way an engineer would by hand.

Stages, in a configurable order, each run only while the request is still over budget:

- ``tool_results``: shorten tool results carried forward, oldest first, each only as far as the
  budget still needs and never below N tokens, keeping its head and tail around a visible marker
  that says how many tokens were removed;
- ``retrieved``: drop retrieved chunks (Anthropic ``document``/``search_result`` blocks, text
  matching the chunk pattern) in user and tool messages, whole chunks only, the lowest-ranked
  (last) first, until it fits;
- ``history``: drop the oldest whole turns, keeping system messages, the first user turn
  (configurable) and the latest turn.

A turn is what the providers' rules make one unit: a user message that starts it, then every
assistant message with its tool calls and the messages that answer them (OpenAI ``tool``
messages; Anthropic user messages that hold ``tool_result`` blocks, whatever else they hold, such
as the text reminders coding agents attach), thinking and redacted-thinking blocks included, never
modified. Dropping whole turns keeps Anthropic's alternation and a user message first; no tool
call or tool result is ever orphaned; assistant messages are never edited.

Anthropic ``cache_control`` prefixes are cut only when nothing else fits, and the cache loss is
counted. The request is counted once (the sidecar passes its count in); trimming works on the
per-part counts and re-tokenizes only the small texts it rewrites, then the output is counted
again with the same counter: ``report.after`` is that recount (markers and placeholders
included), and ``fits`` is true only when it is within budget (a short further round runs when
the estimate was optimistic). Nothing is left empty: a text emptied by trimming is dropped, or,
when it was a message's only content, replaced by a one-line placeholder.

Application code can call :func:`fit` in its own request builder; the sidecar is the safety net.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from context_ceiling.core.counting import (
    DEFAULT_CHUNK_PATTERN,
    Part,
    RequestCount,
    count_anthropic,
    count_gemini,
    count_openai,
    count_responses,
    prior_of,
    responses_items,
)
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.strict import Strict
from context_ceiling.core.tokenizers import TextCounter, TiktokenCounter
from context_ceiling.core.utilization import Component
from context_ceiling.core.wire import STAGES, Shape, Stage

MARKER = "\n[... {n} tokens removed by context-ceiling ...]\n"
MAX_ROUNDS = 4  # trim, recount; a second round is rare (an optimistic estimate), a fourth unseen
PLACEHOLDER = "[retrieved documents removed by context-ceiling to fit the context budget]"


class Policy(Strict):
    """How to trim (one per workload)."""

    stages: list[Stage] = Field(default_factory=lambda: list(STAGES))
    tool_result_max_tokens: int = Field(default=1024, ge=16)
    max_retrieved_chunks: int | None = Field(default=None, ge=0)
    keep_first_user: bool = True
    protect_cache_prefix: bool = True


@dataclass
class FitReport:
    """What fitting did (or, in observe mode, would do)."""

    budget: int
    before: int
    after: int
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    cache_loss_tokens: int = 0
    actions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.after <= self.budget

    @property
    def trimmed(self) -> int:
        return sum(self.removed.values())


def input_budget(window: int, reservation: int, ceiling_tokens: int | None = None) -> int:
    """Input tokens allowed: the ceiling, and never more than the window minus the reservation."""
    budget = window - reservation
    if ceiling_tokens is not None:
        budget = min(budget, ceiling_tokens)
    return max(0, budget)


def requested_output(body: Mapping[str, Any], api: Shape) -> int | None:
    if api == "gemini":
        cfg = body.get("generationConfig")
        v = cfg.get("maxOutputTokens") if isinstance(cfg, dict) else None
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    keys = {
        "openai": ("max_completion_tokens", "max_tokens"),
        "anthropic": ("max_tokens",),
        "responses": ("max_output_tokens",),
    }[api]
    for k in keys:
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _cut(text: str, spans: set[tuple[int, int]]) -> str:
    out, pos = [], 0
    for start, end in sorted(spans):
        if start < pos:
            continue
        out.append(text[pos:start])
        pos = end + 1 if text[end : end + 1] == "\n" else end
    out.append(text[pos:])
    return "".join(out)


class _Trimmer:
    def __init__(
        self,
        body: Mapping[str, Any],
        api: Shape,
        count: RequestCount,
        counter: TextCounter,
        policy: Policy,
        budget: int,
    ) -> None:
        self.body, self.api, self.counter, self.policy = body, api, counter, policy
        # Responses API: the input items play the part of messages (a string input is one)
        self.messages: list[Any] = (
            responses_items(body) if api == "responses" else list(body.get("messages") or [])
        )
        self.parts = count.by_message()
        #: tokens the stages took from each message so far (a message history drops is worth
        #: what is left of it)
        self.taken: dict[int, int] = {}
        self.report = FitReport(budget=budget, before=count.total, after=count.total)
        self.drop_messages: set[int] = set()
        self.drop_blocks: dict[int, set[int]] = defaultdict(set)
        # sets: a RAG prompt drops a hundred chunks from one text (a list's membership test made
        # dropping them quadratic: the trimmer on the 64k benchmark body 304 -> 163 us)
        self.spans: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
        self.replace: dict[tuple[int, int], Any] = {}
        self.first_cut: tuple[int, int] | None = None
        self.boundary = self._cache_boundary()
        self.count = count
        self._marker_tokens: int | None = None

    @property
    def marker_tokens(self) -> int:
        """The marker's tokens (a long removed count), counted only when a tool result is cut."""
        if self._marker_tokens is None:
            self._marker_tokens = self.counter.count(MARKER.format(n=100000))
        return self._marker_tokens

    # -- bookkeeping -------------------------------------------------------------------------

    def fits(self) -> bool:
        return self.report.after <= self.report.budget

    def _take(self, kind: Stage, i: int, j: int, tokens: int) -> None:
        self.report.after -= tokens
        self.report.removed[kind] += tokens
        self.taken[i] = self.taken.get(i, 0) + tokens
        if self.first_cut is None or (i, j) < self.first_cut:
            self.first_cut = (i, j)

    def _cache_boundary(self) -> tuple[int, int] | None:
        if self.api != "anthropic":
            return None
        last: tuple[int, int] | None = None
        for i, m in enumerate(self.messages):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                for j, b in enumerate(content):
                    if isinstance(b, dict) and b.get("cache_control"):
                        last = (i, j)
        return last

    def _protected(self, i: int, j: int, allow_prefix: bool) -> bool:
        return not allow_prefix and self.boundary is not None and (i, j) <= self.boundary

    # -- stages ------------------------------------------------------------------------------

    def _target(self, tokens: int) -> int:
        """What one tool result keeps, marker included: only as much is removed as the budget
        still needs, and never below the policy's floor."""
        needed = self.report.after - self.report.budget
        return max(self.policy.tool_result_max_tokens, tokens - needed)

    def tool_results(self, allow_prefix: bool) -> None:
        for i, m in enumerate(self.messages):
            if self.fits():
                return
            if i in self.drop_messages or not isinstance(m, dict):
                continue
            output = self.api == "responses" and m.get("type") == "function_call_output"
            if output or (self.api == "openai" and m.get("role") in ("tool", "function")):
                if (i, -1) in self.replace or self._protected(i, -1, allow_prefix):
                    continue
                text = m.get("output") if output else _texts(m.get("content"))
                if not isinstance(text, str):
                    continue  # structured output (images, files): left whole
                tokens = sum(p.tokens for p in self.parts.get(i, ()) if not p.frame)
                new = self._truncate(text, tokens, self._target(tokens))
                if new is not None:
                    text, new_tokens = new
                    self.replace[(i, -1)] = text
                    self._take("tool_results", i, -1, tokens - new_tokens)
            elif self.api == "anthropic" and isinstance(m.get("content"), list):
                for j, b in enumerate(m["content"]):
                    if self.fits():
                        return
                    if not (isinstance(b, dict) and b.get("type") == "tool_result"):
                        continue
                    inner = b.get("content")
                    if isinstance(inner, list) and any(
                        isinstance(x, dict) and x.get("type") != "text" for x in inner
                    ):
                        continue  # results with images are left whole
                    if (i, j) in self.replace or self._protected(i, j, allow_prefix):
                        continue
                    tokens = sum(p.tokens for p in self.parts.get(i, ()) if p.block == j) - 3
                    new = self._truncate(_texts(inner), tokens, self._target(tokens))
                    if new is not None:
                        text, new_tokens = new
                        self.replace[(i, j)] = {**b, "content": text}
                        self._take("tool_results", i, j, tokens - new_tokens)

    def _truncate(self, text: str, tokens: int, target: int) -> tuple[str, int] | None:
        """Head and tail of ``text`` around the marker, ``target`` tokens or fewer in all (a few
        tries: where a cut falls changes the count by a token or two)."""
        if tokens <= target or not text:
            return None
        inner = target - self.marker_tokens
        best: tuple[str, int] | None = None
        for _ in range(4):
            keep = max(1, int(len(text) * (max(1, inner) / 2) / tokens))
            head, tail = text[:keep], text[-keep:]
            kept = self.counter.count(head) + self.counter.count(tail)
            new = head + MARKER.format(n=max(0, tokens - kept)) + tail
            new_tokens = self.counter.count(new)
            if new_tokens < tokens:
                best = (new, new_tokens)
            if new_tokens <= target or inner <= 1:
                break
            inner -= new_tokens - target + 1
        return best

    def retrieved(self, allow_prefix: bool) -> None:
        found: dict[int, list[Part]] = {}
        retrieved = Component.RETRIEVED  # an enum member lookup costs ~0.2 us on Python 3.11
        for p in self.count.parts:  # one pass, not one per message: most messages have none
            if p.component is retrieved and p.message >= 0:
                found.setdefault(p.message, []).append(p)
        by_message = {
            i: found[i]
            for i in sorted(found)
            if i not in self.drop_messages and self._role(i) != "assistant"
        }
        limit = self.policy.max_retrieved_chunks
        if limit is not None:
            for i, chunks in by_message.items():
                for p in chunks[limit:]:
                    if not self._protected(i, p.block, allow_prefix):
                        self._drop_chunk(p)
        for i, chunks in by_message.items():
            for p in reversed(chunks[: limit if limit is not None else len(chunks)]):
                if self.fits():
                    return
                if not self._protected(i, p.block, allow_prefix):
                    self._drop_chunk(p)

    def _drop_chunk(self, p: Part) -> None:
        key = (p.message, p.block)
        if p.span is None:
            if p.block in self.drop_blocks[p.message]:
                return
            self.drop_blocks[p.message].add(p.block)
            tokens = p.tokens
        else:
            if p.span in self.spans[key]:
                return
            self.spans[key].add(p.span)
            tokens = p.tokens - 1  # one token of slack: joining the text around a cut can cost one
        self._take("retrieved", p.message, p.block, tokens)

    def history(self, allow_prefix: bool) -> None:
        starts = [i for i, m in enumerate(self.messages) if self._starts_turn(m)]
        if len(starts) < 2:
            return
        turns = [
            (s, starts[k + 1] if k + 1 < len(starts) else len(self.messages))
            for k, s in enumerate(starts)
        ]
        protected = {len(turns) - 1} | ({0} if self.policy.keep_first_user else set())
        for k, (start, end) in enumerate(turns):
            if self.fits():
                return
            if k in protected or self._protected(start, -1, allow_prefix):
                continue
            for i in range(start, end):
                m = self.messages[i]
                if isinstance(m, dict) and m.get("role") in ("system", "developer"):
                    continue
                if i not in self.drop_messages:
                    self.drop_messages.add(i)
                    left = sum(p.tokens for p in self.parts.get(i, ())) - self.taken.get(i, 0)
                    self._take("history", i, -1, left)

    def _role(self, i: int) -> Any:
        m = self.messages[i] if 0 <= i < len(self.messages) else None
        return m.get("role") if isinstance(m, dict) else None

    def _starts_turn(self, m: Any) -> bool:
        """A user message starts a turn unless it answers tool calls: an Anthropic user message
        with any ``tool_result`` block belongs to the assistant turn before it, whatever text
        it also carries."""
        if not isinstance(m, dict) or m.get("role") != "user":
            return False
        if self.api == "openai":
            return True
        if self.api == "responses":  # function calls, their outputs and reasoning have no role
            return m.get("type") in (None, "message")
        content = m.get("content")
        if isinstance(content, list):
            return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        return True

    # -- run and materialize -----------------------------------------------------------------

    def run(self) -> None:
        if self.fits():
            return
        passes = (
            [False, True]
            if (self.policy.protect_cache_prefix and self.boundary is not None)
            else [True]
        )
        for allow_prefix in passes:
            for stage in self.policy.stages:
                getattr(self, stage)(allow_prefix)
                if self.fits():
                    break
            if self.fits():
                break
        if (
            self.boundary is not None
            and self.first_cut is not None
            and self.first_cut <= self.boundary
        ):
            lo, hi = self.first_cut, self.boundary
            self.report.cache_loss_tokens = sum(
                p.tokens
                for p in self.count.parts
                if p.message >= 0 and lo <= (p.message, p.block) <= hi
            )
        self.report.actions = self._summary()

    def _summary(self) -> list[str]:
        out = []
        n_tools = sum(1 for _ in self.replace)
        if n_tools:
            out.append(
                f"capped {n_tools} tool result(s) at {self.policy.tool_result_max_tokens} tokens"
            )
        n_chunks = sum(len(v) for v in self.spans.values()) + sum(
            len(v) for v in self.drop_blocks.values()
        )
        if n_chunks:
            out.append(f"dropped {n_chunks} retrieved chunk(s)")
        if self.drop_messages:
            out.append(f"dropped {len(self.drop_messages)} message(s) of older turns")
        return out

    def changed(self) -> bool:
        return bool(
            self.replace or self.drop_messages or self.spans or any(self.drop_blocks.values())
        )

    def materialize(self) -> dict[str, Any]:
        touched = {i for i, _ in self.replace} | set(self.drop_blocks) | {i for i, _ in self.spans}
        if not touched and not self.drop_messages:
            return dict(self.body)
        messages: list[Any] = []
        for i, m in enumerate(self.messages):
            if i in self.drop_messages:
                continue
            if i not in touched:
                messages.append(m)
                continue
            m2 = dict(m)
            content = m.get("content")
            if (i, -1) in self.replace:
                m2["output" if "output" in m else "content"] = self.replace[(i, -1)]
            elif isinstance(content, str):
                m2["content"] = _cut(content, self.spans[(i, -1)])
                if not m2["content"].strip():
                    m2["content"] = PLACEHOLDER
            elif isinstance(content, list):
                blocks: list[Any] = []
                for j, b in enumerate(content):
                    if j in self.drop_blocks.get(i, ()):
                        continue
                    if (i, j) in self.replace:
                        b = self.replace[(i, j)]
                    elif (i, j) in self.spans:
                        b = {**b, "text": _cut(str(b.get("text", "")), self.spans[(i, j)])}
                        if not b["text"].strip():
                            continue
                    blocks.append(b)
                m2["content"] = blocks or [{"type": "text", "text": PLACEHOLDER}]
            messages.append(m2)
        out = dict(self.body)
        if self.api == "responses":
            single = isinstance(self.body.get("input"), str) and len(messages) == 1
            out["input"] = messages[0]["content"] if single else messages
        else:
            out["messages"] = messages
        return out


COUNTERS = {
    "openai": count_openai,
    "anthropic": count_anthropic,
    "responses": count_responses,
    "gemini": count_gemini,
}


def fit(
    body: Mapping[str, Any],
    *,
    api: Shape,
    budget: int,
    counter: TextCounter | None = None,
    count: RequestCount | None = None,
    policy: Policy | None = None,
    chat_format: ChatFormat | None = None,
    chunk_pattern: str | re.Pattern[str] | None = DEFAULT_CHUNK_PATTERN,
) -> tuple[dict[str, Any], FitReport]:
    """Fit an OpenAI chat, Anthropic messages or OpenAI Responses body into ``budget`` input
    tokens.

    Returns the fitted body (the input is never mutated; untouched messages are shared, not
    copied) and a report whose ``after`` is a recount of that body. ``report.fits`` is False
    when even the full policy cannot make it fit; the body returned then is the best effort. Pass
    ``count`` to reuse an existing count (of ``body``, with ``counter``).
    """
    counter = counter or TiktokenCounter("o200k_base")
    pattern = re.compile(chunk_pattern) if isinstance(chunk_pattern, str) else chunk_pattern
    fn = COUNTERS[api]
    if count is None:
        count = fn(body, counter, chat_format, pattern)
    before = count.total
    report: FitReport | None = None  # the first round's, the later rounds added to it
    current: Mapping[str, Any] = body
    for _ in range(MAX_ROUNDS if api != "gemini" else 0):  # Gemini: judged, never trimmed
        if count.total <= budget:
            break
        trimmer = _Trimmer(current, api, count, counter, policy or Policy(), budget)
        trimmer.run()
        out = trimmer.materialize()
        if not trimmer.changed():
            break
        if report is None:
            report = trimmer.report
        else:
            for k, v in trimmer.report.removed.items():
                report.removed[k] += v
            report.cache_loss_tokens += trimmer.report.cache_loss_tokens
            report.actions += [a for a in trimmer.report.actions if a not in report.actions]
        # the honest figure: the output counted again with the same counter, markers and
        # placeholders included (the per-part estimate can be off by a few tokens a cut); the
        # messages it shares with the body counted before are taken over, not walked again
        prior = prior_of(trimmer.messages, count)
        current, count = out, fn(out, counter, chat_format, pattern, prior)
    if report is None:
        report = FitReport(budget=budget, before=before, after=before)
    report.before, report.after = before, count.total
    net, est = report.before - report.after, sum(report.removed.values())
    if est and net != est:  # the estimates per stage, made to add up to the recounted total
        top = max(report.removed, key=lambda k: report.removed[k])
        report.removed[top] = max(0, report.removed[top] + net - est)
    return dict(current), report

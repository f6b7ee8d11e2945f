"""Secrets found by maintained rule sets: gitleaks' default rules (``data/gitleaks.toml``, MIT)
and detect-secrets' regex detectors (``data/detect-secrets.toml``, Apache-2.0, in gitleaks'
schema), vendored and pinned (see ``data/README.md``), applied to captured text before it is
written. Two sets because each scanner knows formats the other does not (detect-secrets:
Artifactory, Cloudant, IBM Cloud and COS, SoftLayer, keyword-bound AWS secrets); a secret is
redacted when either set reports it.

Why a vendored rule set and not a hand-kept list: the families of keys grow every month (cloud
providers, model hubs, payment APIs, fine-grained tokens), and a short list lags them; gitleaks'
~220 rules are maintained by people whose job that is, with keyword prefilters, per-rule
entropy floors and allowlists that keep false positives down. The rules are Go RE2 syntax; the
few constructs Python's ``re`` spells differently (a flag group in mid-pattern, ``\\z``) are
translated when loaded, and a rule that still does not compile is skipped and counted
(:attr:`SecretRules.skipped`; a test requires it to stay near zero).

What is applied per rule, as gitleaks does: the keyword prefilter (a rule runs only when one of
its keywords is in the text, case-insensitively), the regular expression, the secret group (the
rule's ``secretGroup``, else the first non-empty group, else the match), the Shannon entropy
floor, and the allowlists on the secret, the match or the line (regexes and stopwords), global
and per rule. Path allowlists do not apply (captured text has no path).
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

#: (start, end) of a secret in a text
Span = tuple[int, int]


def go_to_python(pattern: str) -> str:
    """A Go RE2 pattern in Python's syntax: ``\\z`` is ``\\Z``; a flag group such as ``(?i)``
    after the start applies to the rest of its group, which Python spells ``(?i:...)``."""
    pattern = pattern.replace(r"\z", r"\Z")
    out = pattern
    while True:
        m = re.search(r"(?<!^)\(\?([imsU]+)\)", out)
        if m is None or m.start() == 0:
            break
        start, end = m.start(), m.end()
        depth, i = 0, end
        while i < len(out):
            c = out[i]
            if c == "\\":
                i += 2
                continue
            if c == "[":  # a class: skip to its end
                j = i + 1
                if j < len(out) and out[j] == "^":
                    j += 1
                if j < len(out) and out[j] == "]":
                    j += 1
                while j < len(out) and out[j] != "]":
                    j += 2 if out[j] == "\\" else 1
                i = j + 1
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            i += 1
        out = out[:start] + f"(?{m.group(1)}:" + out[end:i] + ")" + out[i:]
    return out


def entropy(s: str) -> float:
    """Shannon entropy in bits per character (gitleaks' measure)."""
    if not s:
        return 0.0
    n = len(s)
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(c / n * math.log2(c / n) for c in counts.values())


@dataclass
class _Allow:
    target: str  # secret | match | line
    regexes: list[re.Pattern[str]]
    stopwords: tuple[str, ...]
    condition: str  # OR | AND

    def allows(self, secret: str, match: str, line: str) -> bool:
        subject = {"match": match, "line": line}.get(self.target, secret)
        checks = []
        if self.regexes:
            checks.append(any(r.search(subject) for r in self.regexes))
        if self.stopwords:
            low = secret.lower()
            checks.append(any(w in low for w in self.stopwords))
        if not checks:
            return False
        return all(checks) if self.condition == "AND" else any(checks)


@dataclass
class _Rule:
    id: str
    regex: re.Pattern[str]
    keywords: tuple[str, ...]
    entropy: float | None
    secret_group: int
    allows: list[_Allow] = field(default_factory=list)


def _compile(pattern: str) -> re.Pattern[str] | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # RE2's nested sets read oddly to re
        try:
            return re.compile(go_to_python(pattern))
        except re.error:
            return None


def _allow(spec: dict[str, Any]) -> _Allow | None:
    if spec.get("paths") and spec.get("condition") == "AND":
        return None  # a path condition: captured text has no path, so it never holds
    regexes = [r for r in (_compile(p) for p in spec.get("regexes") or []) if r is not None]
    stopwords = tuple(w.lower() for w in spec.get("stopwords") or [])
    if not regexes and not stopwords:
        return None
    return _Allow(
        str(spec.get("regexTarget") or "secret"),
        regexes,
        stopwords,
        str(spec.get("condition") or "OR"),
    )


class SecretRules:
    """Rule sets in gitleaks' schema, compiled once; :meth:`find` returns the secrets' spans.

    ``sources`` are TOML texts (the vendored sets when none is given). A set's global
    allowlist applies to its own rules only: gitleaks' allowlist is tuned to its rules."""

    def __init__(self, *sources: str) -> None:
        self.rules: list[_Rule] = []
        self.skipped: list[str] = []
        for source in sources or tuple(_vendored(name) for name in VENDORED_SETS):
            self._load(tomllib.loads(source))

    def _load(self, data: dict[str, Any]) -> None:
        glob = data.get("allowlist") or {}
        own = [a for a in (_allow(glob),) if a is not None]
        for spec in data.get("rules") or []:
            pattern = spec.get("regex")
            if not pattern:
                continue  # a path-only rule
            rx = _compile(pattern)
            if rx is None:
                self.skipped.append(str(spec.get("id")))
                continue
            allows = [a for a in (_allow(x) for x in spec.get("allowlists") or []) if a] + own
            self.rules.append(
                _Rule(
                    str(spec.get("id")),
                    rx,
                    tuple(k.lower() for k in spec.get("keywords") or []),
                    spec.get("entropy"),
                    int(spec.get("secretGroup") or 0),
                    allows,
                )
            )

    def find(self, text: str) -> list[tuple[str, Span]]:
        """(rule id, span of the secret) for every secret in ``text``."""
        low = text.lower()
        found: list[tuple[str, Span]] = []
        for rule in self.rules:
            if rule.keywords and not any(k in low for k in rule.keywords):
                continue
            for m in rule.regex.finditer(text):
                span = self._secret_span(rule, m)
                if span is None:
                    continue
                secret = text[span[0] : span[1]]
                if rule.entropy and entropy(secret) < rule.entropy:
                    continue
                line_start = text.rfind("\n", 0, m.start()) + 1
                line_end = text.find("\n", m.end())
                line = text[line_start : line_end if line_end >= 0 else len(text)]
                if any(a.allows(secret, m.group(0), line) for a in rule.allows):
                    continue
                found.append((rule.id, span))
        return found

    @staticmethod
    def _secret_span(rule: _Rule, m: re.Match[str]) -> Span | None:
        if rule.secret_group and rule.secret_group <= (m.re.groups or 0):
            if m.group(rule.secret_group):
                return m.span(rule.secret_group)
            return None
        for g in range(1, (m.re.groups or 0) + 1):
            if m.group(g):
                return m.span(g)
        return m.span() if m.group(0) else None


#: the vendored rule sets, by file name under ``context_ceiling/sidecar/data``
VENDORED_SETS = ("gitleaks.toml", "detect-secrets.toml")


@cache
def _vendored(name: str) -> str:
    return (files("context_ceiling.sidecar") / "data" / name).read_text()


@cache
def default_rules() -> SecretRules:
    """The vendored rule set, compiled once per process."""
    return SecretRules()


def merge(spans: list[Span]) -> list[Span]:
    """Overlapping spans joined, in order."""
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out

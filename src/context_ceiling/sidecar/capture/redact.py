"""Redaction before anything captured is written: a maintained secret rule set (gitleaks'
default rules, vendored: :mod:`context_ceiling.sidecar.capture.secret_rules`) and built-in patterns for
what it leaves to context (always on), then the configured patterns and JSON fields; each
replaced value is counted by the kind of rule that found it."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from context_ceiling.sidecar.capture.secret_rules import SecretRules, default_rules, entropy, merge

REDACTED = "[REDACTED]"
#: secrets that must never be stored, whatever the configuration says
BUILTIN_PATTERNS = (
    r"sk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic keys
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google API keys
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"[Bb][Ee][Aa][Rr][Ee][Rr]\s+[A-Za-z0-9._~+/=\-]{12,}",
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack tokens
    r"ya29\.[0-9A-Za-z_\-]{20,}",  # Google OAuth access tokens
    # credentials in URLs, the user name possibly empty (redis://:password@host)
    r"(?<=://)[^/\s:@\"']{0,256}:[^/\s@\"']{1,256}(?=@)",
    # Discord bot tokens (base64 user id . timestamp . HMAC), whatever code they sit in
    r"(?<![A-Za-z0-9_.-])[MNO][A-Za-z0-9]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}",
    r"(?<![0-9])[0-9]{8,10}:AA[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])",  # Telegram bot tokens
    # a PuTTY private key file, whole (its private lines and MAC)
    r"PuTTY-User-Key-File-\d+:[\s\S]{0,16384}?Private-MAC:\s*[0-9A-Fa-f]+",
    # user:password given to curl (-u, --user), not a reference to the environment ($USER:$PW)
    r"(?:(?<=\s-u )|(?<=--user )|(?<=--user=))[\"']?(?!\$)[^\s:\"']{1,64}:(?!\$)[^\s\"']{1,128}",
    # HTTP Basic credentials in a header (curl -H, a pasted request, a config)
    r"(?i:authorization)[\"']?\s*[:=]\s*[\"']?(?i:basic)\s+[A-Za-z0-9+/]{8,}={0,2}",
)
#: an AWS secret access key right after its key id (the console's CSV, a pasted pair): the key
#: id is found by the rules, the secret (40 characters, no prefix of its own) by its place
AWS_PAIR = re.compile(
    r"((?:\[REDACTED\]|\bA[KS]IA[0-9A-Z]{16})[,;\t :=\"']{1,4})([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"
)
#: a password written out in prose or config ("the password is: ...", ``passwd=...``): the
#: value is replaced when it looks like one (a digit or a symbol, and varied characters)
PROSE_PASSWORD = re.compile(
    # the name may end a longer one (DB_PASSWORD, MYSQL_ROOT_PASSWORD) and be a quoted JSON or
    # YAML key ("password": ...)
    r"(?i)(?<![a-z])((?:password|passwd|passphrase|pwd|secret)s?[\"']?"
    r"(?:\s*(?:is|was|:=|=|:))+\s*[\"']?)"
    r"([^\s\"']{6,})"
    # a secret under its configuration name (an AWS secret access key has no prefix of its own)
    r"|((?:aws_?)?secret_?access_?key|client_?secret|api_?secret|private_?key)"
    r"(\s*(?:=|:)\s*[\"']?)([A-Za-z0-9/+=_.~-]{16,})"
)


#: a value that is code, not a password: a call (``get_password(user)``), a dotted name
#: without digits (``settings.db_password``), a subscript (``os.environ["PW"]``)
_CODE_VALUE = re.compile(
    r"[A-Za-z_][\w.]*\(.*|[A-Za-z_]+(?:\.[A-Za-z_]+)+[,;)]*|[A-Za-z_][\w.]*\[.*"
)


def _looks_secret(value: str) -> bool:
    return (
        any(c.isdigit() or not c.isalnum() for c in value)
        and entropy(value) >= 2.5
        and not value.startswith(("http", "/", "$", "{", "<", "%"))
        and _CODE_VALUE.fullmatch(value) is None
    )


class Redactor:
    def __init__(
        self,
        patterns: list[str],
        fields: list[str],
        count: Callable[[str, int], None],
        rules: SecretRules | None = None,
    ) -> None:
        self.rules = rules if rules is not None else default_rules()
        self.builtin = re.compile("|".join(f"(?:{p})" for p in BUILTIN_PATTERNS))
        self.custom = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        self.fields = frozenset(fields)
        self._count = count

    def text(self, s: str) -> tuple[str, int]:
        spans = merge([span for _, span in self.rules.find(s)])
        for start, end in reversed(spans):
            s = s[:start] + REDACTED + s[end:]
        s, a = self.builtin.subn(REDACTED, s)
        s, pairs = AWS_PAIR.subn(lambda m: m.group(1) + REDACTED, s)
        a += pairs
        prose = 0

        def password(m: re.Match[str]) -> str:
            nonlocal prose
            if m.group(1):  # a password in prose: only a value that looks like one
                head, value = m.group(1), m.group(2)
                if not _looks_secret(value):
                    return m.group(0)
            else:  # a key under its configuration name: a varied value is the key
                head, value = m.group(3) + m.group(4), m.group(5)
                if entropy(value) < 3.0:
                    return m.group(0)
            prose += 1
            return head + REDACTED

        s = PROSE_PASSWORD.sub(password, s)
        a += prose
        b = 0
        if self.custom is not None:
            s, b = self.custom.subn(REDACTED, s)
        if spans:
            self._count("ruleset", len(spans))
        if a:
            self._count("builtin", a)
        if b:
            self._count("pattern", b)
        return s, len(spans) + a + b

    def body(self, obj: Any) -> tuple[Any, int]:
        """``obj`` with the values of the configured fields replaced, at any depth."""
        out, n = self._body(obj)
        if n:
            self._count("field", n)
        return out, n

    def _body(self, obj: Any) -> tuple[Any, int]:
        n = 0
        if isinstance(obj, Mapping):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                if k in self.fields:
                    out[k] = REDACTED
                    n += 1
                else:
                    out[k], m = self._body(v)
                    n += m
            return out, n
        if isinstance(obj, list):
            items = []
            for v in obj:
                r, m = self._body(v)
                items.append(r)
                n += m
            return items, n
        return obj, 0


@functools.lru_cache(maxsize=4096)
def looks_like_credential(value: str) -> bool:
    """Whether a short identifier (a model name) matches a credential rule: a key pasted into
    the ``model`` field would otherwise reach the log, the spans and the metrics' labels. Model
    names repeat, so the answer is remembered (in process memory, never written)."""
    if _BUILTIN.search(value) is not None:
        return True
    return bool(default_rules().find(value))


_BUILTIN = re.compile("|".join(f"(?:{p})" for p in BUILTIN_PATTERNS))

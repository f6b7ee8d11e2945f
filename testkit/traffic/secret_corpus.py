"""Real-looking secrets of every family a prompt may carry, generated (seeded) in each family's
published format, each embedded in a sentence as a user would paste it. Used by the redaction
tests and ``benchmarks/secret_redaction.py``. None of these is a live credential."""

from __future__ import annotations

import base64
import random
import string
from collections.abc import Callable
from typing import Any

LOWER, UPPER, DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
ALNUM = LOWER + UPPER + DIGITS
B64 = ALNUM + "+/"


def _r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _pem(rng: random.Random) -> str:
    body = base64.b64encode(rng.randbytes(600)).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{lines}\n-----END RSA PRIVATE KEY-----"


#: family -> (secret maker, sentence with ``{}`` where it goes)
FAMILIES: dict[str, tuple[Callable[[random.Random], str], str]] = {
    "openai": (lambda r: "sk-proj-" + _r(r, ALNUM + "_-", 48), "my key is {} please debug"),
    "anthropic": (
        lambda r: "sk-ant-api03-" + _r(r, ALNUM + "_-", 93) + "AA",
        "ANTHROPIC_API_KEY={}",
    ),
    "google-api": (lambda r: "AIza" + _r(r, ALNUM + "_-", 35), "maps key: {}"),
    "google-oauth": (
        lambda r: "ya29." + _r(r, ALNUM + "_-", 60),
        "Authorization token {} expired?",
    ),
    "aws-key-id": (lambda r: "AKIA" + _r(r, UPPER + DIGITS, 16), "aws_access_key_id = {}"),
    "aws-secret": (lambda r: _r(r, B64, 40), "aws_secret_access_key = {}"),
    "github-classic": (lambda r: "ghp_" + _r(r, ALNUM, 36), "git clone with token {}"),
    "github-fine-grained": (
        lambda r: "github_pat_" + _r(r, ALNUM, 22) + "_" + _r(r, ALNUM, 59),
        "GH_TOKEN={} in CI",
    ),
    "huggingface": (lambda r: "hf_" + _r(r, LOWER + UPPER, 34), "use token {} for the hub"),
    "stripe": (lambda r: "sk_live_" + _r(r, ALNUM, 24), "stripe secret {} in prod"),
    "azure-ad": (
        lambda r: _r(r, ALNUM, 3) + r.choice("78") + "Q~" + _r(r, ALNUM + "_.~-", 31),
        "azure client_secret={}",
    ),
    "slack": (
        lambda r: "xoxb-" + _r(r, DIGITS, 12) + "-" + _r(r, DIGITS, 12) + "-" + _r(r, ALNUM, 24),
        "slack bot {}",
    ),
    "jwt": (
        lambda r: (
            "eyJhbGciOiJIUzI1NiJ9."
            + base64.urlsafe_b64encode(f'{{"sub":"{_r(r, DIGITS, 8)}"}}'.encode())
            .decode()
            .rstrip("=")
            + "."
            + _r(r, ALNUM + "_-", 43)
        ),
        "session cookie {}",
    ),
    "pem-private-key": (_pem, "here is the deploy key:\n{}\nuse it"),
    "password-in-text": (
        lambda r: (
            _r(r, UPPER, 2)
            + _r(r, LOWER, 4)
            + _r(r, DIGITS, 3)
            + r.choice("!#%&*")
            + _r(r, LOWER, 3)
        ),
        "the database password is: {}",
    ),
    "url-credentials": (
        lambda r: f"{_r(r, LOWER, 6)}:{_r(r, ALNUM, 14)}",
        "connect to postgres://{}@db.internal:5432/app",
    ),
}


def corpus(n: int = 50, seed: int = 0) -> list[tuple[str, str, str]]:
    """(family, secret, text) for ``n`` secrets of every family."""
    rng = random.Random(seed)
    out = []
    for family, (make, sentence) in FAMILIES.items():
        for _ in range(n):
            secret = make(rng)
            out.append((family, secret, sentence.format(secret)))
    return out


def leaked(secret: str, family: str, stored: str) -> bool:
    """Whether the stored text still holds the secret (for URL credentials: its password)."""
    needle = secret.split(":", 1)[1] if family == "url-credentials" else secret
    if family == "pem-private-key":
        needle = secret.splitlines()[1]
    return needle in stored


def rule_examples(per_rule: int = 10) -> list[tuple[str, str]]:
    """(rule id, example) for every rule of the vendored gitleaks set: strings its regular
    expression generates (hypothesis, derandomized: the same every run), kept when the rule
    itself reports them (the secret passes the rule's entropy floor and allowlists)."""
    from context_ceiling.sidecar.capture.secret_rules import default_rules

    rules = default_rules()
    out: list[tuple[str, str]] = []
    for rule in rules.rules:
        out += [(rule.id, text) for text in _examples(rules, rule, per_rule)]
    return out


def _examples(rules: Any, rule: Any, per_rule: int) -> list[str]:
    import warnings

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    got: list[str] = []

    @settings(
        max_examples=per_rule * 5,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(st.from_regex(rule.regex, fullmatch=True))
    def collect(text: str) -> None:
        if len(got) < per_rule and any(rid == rule.id for rid, _ in rules.find(text)):
            got.append(text)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return got

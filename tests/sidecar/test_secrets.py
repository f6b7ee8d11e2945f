"""Secrets in prompt text never reach the capture store: gitleaks' maintained rule set (vendored,
pinned) and the built-in patterns on top, over real-looking keys of every family, through the
real sidecar's capture path; and the rule set loads whole in Python's regular expressions."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from context_ceiling.sidecar.capture.redact import Redactor
from context_ceiling.sidecar.capture.secret_rules import (
    SecretRules,
    default_rules,
    go_to_python,
    merge,
)
from testkit import REPO
from testkit.traffic.secret_corpus import FAMILIES, benign, corpus, leaked
from tests.conftest import Running


def test_the_vendored_rule_set_loads_whole() -> None:
    rules = default_rules()
    assert len(rules.rules) >= 200 and rules.skipped == []
    ids = {r.id for r in rules.rules}
    for wanted in (
        "ds-cloudant-key",  # detect-secrets' set, beside gitleaks'
        "ds-softlayer-key",
        "github-fine-grained-pat",
        "huggingface-access-token",
        "stripe-access-token",
        "azure-ad-client-secret",
        "private-key",
        "generic-api-key",
    ):
        assert wanted in ids


def test_go_patterns_become_python_ones() -> None:
    assert go_to_python(r"a(?i)[b-c]+") == r"a(?i:[b-c]+)"
    assert go_to_python(r"(x(?i)ab)c") == r"(x(?i:ab))c"
    assert go_to_python(r"p[)(](?i)q") == r"p[)(](?i:q)"
    assert go_to_python(r"\bk(?:[^\w-]|\z)") == r"\bk(?:[^\w-]|\Z)"
    assert go_to_python(r"(?i)abc") == r"(?i)abc"  # a leading flag stays global


def test_rule_parts_apply_as_gitleaks_applies_them() -> None:
    src = """
[allowlist]
stopwords = ["example"]
[[rules]]
id = "t"
regex = '''key=([a-z0-9]{12})'''
keywords = ["key="]
entropy = 3.0
"""
    r = SecretRules(src)
    assert r.find("key=a8f3k2m9q7x1") == [("t", (4, 16))]
    assert r.find("key=aaaaaaaaaaaa") == []  # below the entropy floor
    assert r.find("key=example12345") == []  # a stopword
    assert r.find("no keyword here a8f3k2m9q7x1") == []
    assert merge([(5, 9), (1, 3), (2, 6)]) == [(1, 9)]


def test_every_family_of_the_corpus_is_redacted() -> None:
    counted: collections.Counter[str] = collections.Counter()
    r = Redactor([], [], lambda kind, n: counted.update({kind: n}))
    missed = collections.Counter()  # type: ignore[var-annotated]
    for family, secret, text in corpus(50, seed=7):
        out, n = r.text(text)
        if leaked(secret, family, out) or n == 0:
            missed[family] += 1
    assert not missed, missed
    assert counted["ruleset"] > 0 and counted["builtin"] > 0


def test_benign_look_alikes_are_left_alone() -> None:
    """Code that calls a password function, references to the environment, prose about keys,
    hashes, ids and URLs without credentials: at most 1% altered (the target; none today)."""
    r = Redactor([], [], lambda kind, n: None)
    texts = benign(400, seed=3)
    altered = [t for t in texts if r.text(t)[1]]
    assert len(altered) <= len(texts) // 100, altered[:5]


def test_no_false_positives_on_the_bundled_task_sets() -> None:
    root = REPO / "src" / "context_ceiling" / "sweep" / "tasksets"
    r = Redactor([], [], lambda kind, n: None)
    lines = [
        line
        for f in sorted(root.rglob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    assert len(lines) > 500
    flagged = [line[:80] for line in lines if r.text(line)[1]]
    assert not flagged, flagged[:5]


def _records_text(store_glob: Path, want: int, timeout: float = 20.0) -> str:
    from context_ceiling.core.capture import CaptureStore

    deadline = time.monotonic() + timeout
    while True:
        [path] = list(store_glob.parent.glob("capture-*.sqlite"))
        store = CaptureStore.open(path)
        try:
            recs = list(store.records())
        finally:
            store.close()
        if len(recs) >= want or time.monotonic() > deadline:
            return path.read_bytes().decode("utf-8", "replace") + "".join(
                rec.model_dump_json() for rec in recs
            )
        time.sleep(0.1)


def test_no_secret_of_the_corpus_is_written_to_the_store(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    store = tmp_path / "capture-{hostname}.sqlite"
    sc = make_sidecar(capture={"enabled": True, "store": str(store), "sample_rate": 1.0})
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="sk-x", max_retries=0)
    samples = corpus(3, seed=11)
    for _, _, text in samples:
        client.chat.completions.create(
            model="gpt-4o",
            messages=[
                {"role": "system", "content": "You help with ops questions."},
                {"role": "user", "content": "<document>runbook</document>\n" + text},
            ],
        )
    written = _records_text(store, len(samples))
    assert len(samples) == 3 * len(FAMILIES)
    leaks = [family for family, secret, _ in samples if leaked(secret, family, written)]
    assert leaks == []
    assert "[REDACTED]" in written


def test_every_rules_own_examples_are_redacted() -> None:
    """A string each gitleaks rule's expression generates, and the rule reports, never survives
    the redaction (the Go patterns' translation and the secret spans held to it)."""
    from testkit.traffic.secret_corpus import rule_examples

    examples = rule_examples(per_rule=1)
    covered = {rid for rid, _ in examples}
    assert len(covered) >= 200  # a handful of rules' expressions generate only non-secrets
    r = Redactor([], [], lambda kind, n: None)
    assert [rid for rid, text in examples if r.text(text)[1] == 0] == []


def test_a_second_scanners_own_detectors_find_nothing_left() -> None:
    """The oracle is the installed detect-secrets package, not our copy of its rules: strings
    each of its regex detectors generates and reports are redacted, whichever set finds them."""
    pytest.importorskip("detect_secrets")
    from testkit.traffic.secret_corpus import scanner_examples

    examples = scanner_examples(per_pattern=2)
    kinds = {kind for kind, _, _ in examples}
    assert len(kinds) >= 20
    r = Redactor([], [], lambda kind, n: None)
    assert [(kind, text) for kind, text, secret in examples if secret in r.text(text)[0]] == []

"""Secret redaction of captured text, measured: every family of real-looking keys
(``testkit/traffic/secret_corpus.py``) through the redaction the capture store applies, the
examples of a second scanner's own detectors (the installed detect-secrets package as the
oracle), and the false positives on the bundled task sets' text (documents, questions and
answers that hold no secret).

``python -m benchmarks.secret_redaction [--n 200] [--seeds 5]``
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from context_ceiling.sidecar.capture.redact import Redactor
from context_ceiling.sidecar.capture.secret_rules import default_rules
from testkit.traffic.secret_corpus import (
    BENIGN,
    FAMILIES,
    benign,
    corpus,
    leaked,
    rule_examples,
    scanner_examples,
)

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="secrets of each family per seed")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    started = time.perf_counter()
    rules = default_rules()
    load = time.perf_counter() - started
    r = Redactor([], [], lambda kind, n: None)
    written: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    for seed in range(args.seeds):
        for family, secret, text in corpus(args.n, seed):
            total[family] += 1
            out, _ = r.text(text)
            written[family] += leaked(secret, family, out)
    examples = rule_examples(per_rule=10)
    rule_leaks = sum(1 for _, text in examples if r.text(text)[1] == 0)
    root = ROOT / "src" / "context_ceiling" / "sweep" / "tasksets"
    lines = [
        line for f in sorted(root.rglob("*.jsonl")) for line in f.read_text().splitlines() if line
    ]
    chars = sum(len(line) for line in lines)
    t = time.perf_counter()
    flagged = sum(1 for line in lines if r.text(line)[1])
    per_mb = (time.perf_counter() - t) / (chars / 1e6)
    print(
        f"rule sets: {len(rules.rules)} rules (gitleaks and detect-secrets) compiled in "
        f"{load:.2f} s, {len(rules.skipped)} skipped"
    )
    print()
    print("| family | secrets | written to the store |")
    print("|---|---:|---:|")
    for family in FAMILIES:
        print(f"| {family} | {total[family]} | {written[family]} |")
    print(f"| **all** | {sum(total.values())} | {sum(written.values())} |")
    print()
    covered = len({rid for rid, _ in examples})
    print(
        f"Every rule's own examples: {len(examples)} strings its expression generates and it "
        f"reports, from {covered} of {len(rules.rules)} rules: {rule_leaks} written to the store."
    )
    scanned = scanner_examples(per_pattern=8)
    missed = collections.Counter(
        kind for kind, text, secret in scanned if secret in r.text(text)[0]
    )
    print()
    print(
        f"detect-secrets' own detectors as the oracle: {len(scanned)} strings that "
        f"{len({k for k, _, _ in scanned})} of its regex detectors generate and report: "
        f"{sum(missed.values())} written to the store"
        + (f" ({dict(missed)})" if missed else "")
        + ("" if scanned else " (detect-secrets is not installed: skipped)")
        + "."
    )
    looks = benign(len(BENIGN) * 40)
    altered = sum(1 for t in looks if r.text(t)[1])
    print()
    print(
        f"Benign look-alikes ({len(BENIGN)} kinds: code calling password functions, references "
        f"to the environment, prose, hashes, ids, URLs without credentials): {altered} of "
        f"{len(looks)} altered."
    )
    print()
    print(
        f"False positives on the bundled task sets: {flagged} of {len(lines)} lines "
        f"({chars / 1e6:.1f} M characters) changed; {per_mb:.2f} s of CPU per million characters."
    )


if __name__ == "__main__":
    main()

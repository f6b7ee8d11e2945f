"""The commit-subject rule CONTRIBUTING.md states, as a ``commit-msg`` hook: a subject of at
most 72 characters, in the imperative ("Add", not "Added" or "Adds"), without a closing period,
and a blank line before the body.

``pre-commit`` runs it on every commit (``.pre-commit-config.yaml``); by hand:
``python -m devtools.commit_subject .git/COMMIT_EDITMSG``. Exits 1 with one line per problem.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72
#: first words that are not imperative though they end like a past tense or a gerund
_IMPERATIVE = frozenset({"embed", "feed", "need", "seed", "shed", "speed", "bring", "string"})


def problems(message: str) -> list[str]:
    """What is wrong with a commit message (empty: nothing)."""
    lines = [ln for ln in message.splitlines() if not ln.startswith("#")]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ["the message is empty"]
    subject = lines[0].rstrip()
    out = []
    if len(subject) > MAX_SUBJECT:
        out.append(f"the subject is {len(subject)} characters; at most {MAX_SUBJECT}")
    if subject.endswith("."):
        out.append("the subject ends with a period")
    first = subject.split()[0] if subject.split() else ""
    word = first.lower().rstrip(":,")
    if word not in _IMPERATIVE and (
        word.endswith(("ed", "ing")) or (word.endswith("s") and not word.endswith("ss"))
    ):
        out.append(f"the subject starts with {first!r}: use the imperative (Add, Fix, Make ...)")
    if len(lines) > 1 and lines[1].strip():
        out.append("a blank line must separate the subject from the body")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m devtools.commit_subject MESSAGE_FILE", file=sys.stderr)
        return 2
    found = problems(Path(args[0]).read_text(encoding="utf-8"))
    for p in found:
        print(f"commit message: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())

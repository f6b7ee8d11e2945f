"""The bundled ``spdx`` task set, built from a real offline corpus: the SPDX License List.

Source: the npm package ``spdx-license-list`` (its data is CC0-1.0). Each document is one
licence record (name, SPDX identifier, OSI approval, reference URL and the opening words of the
licence text). Licences come in natural near-duplicate families (BSD-2-Clause / BSD-3-Clause /
BSD-3-Clause-Clear / ..., GPL-2.0-only / GPL-2.0-or-later / ...): the siblings are the decoys.
Models have likely seen SPDX data in training, so the closed-book control matters here: it flags
the items a model answers from memory.

Regenerate (needs the npm package, fetched once at development time, never at run time):
``npm pack spdx-license-list@6.12.0 && tar xzf spdx-license-list-6.12.0.tgz && python -m devtools.generate_spdx package``
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Any

from context_ceiling.sweep.taskset import bundled_path, write_taskset

SEED = 20261130
SOURCE_VERSION = "6.12.0"

SKELETON = """You answer questions about software licences using only the licence records provided. Many records look alike: check names and identifiers carefully.
---
<documents>
{documents}
</documents>

Question: {question}
Reply with JSON only, in this form: {"answer": <the answer>, "evidence": [<ids of the documents you used>]}"""

LICENCE = """# Licence of the `spdx` task set

The records in `corpus.jsonl` are derived from the SPDX License List as packaged in the npm
package `spdx-license-list` {version}, whose data is dedicated to the public domain under
CC0-1.0 (https://creativecommons.org/publicdomain/zero/1.0/). The "Text begins" part of each
record quotes the first words of the licence text that the record identifies; those texts remain
under their own terms. The items, questions and this arrangement are CC0-1.0 (context-ceiling).
"""


def _family(spdx_id: str) -> str:
    return re.split(r"[-.\d]", spdx_id, maxsplit=1)[0] or spdx_id


def _excerpt(text: str, words: int = 45) -> str:
    clean = re.sub(r"[#*`>\[\]]", " ", text)
    return " ".join(clean.split()[:words])


def _unique_questions(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A question must name one item: deprecated identifiers share their licence's name, so the
    same question would have two right answers; the first one stays."""
    seen: set[str] = set()
    out = []
    for it in items:
        if it["question"] not in seen:
            seen.add(it["question"])
            out.append(it)
    return out


def generate(package: Path, out: Path, seed: int = SEED) -> None:
    data: dict[str, Any] = json.loads((package / "spdx-full.json").read_text())
    rng = random.Random(seed)
    docs = []
    for spdx_id, rec in sorted(data.items()):
        text = (
            f"Licence record. Name: {rec['name']}. SPDX identifier: {spdx_id}. "
            f"OSI approved: {'yes' if rec.get('osiApproved') else 'no'}. Reference: {rec.get('url', '')}. "
            f"Text begins: {_excerpt(rec.get('licenseText', ''))}"
        )
        docs.append({"id": f"spdx:{spdx_id}", "title": rec["name"], "text": text})
    families: dict[str, list[str]] = {}
    for spdx_id in sorted(data):
        families.setdefault(_family(spdx_id), []).append(spdx_id)
    candidates = [i for ids in families.values() if len(ids) >= 4 for i in ids]
    rng.shuffle(candidates)

    def siblings(i: str) -> list[str]:
        fam = [s for s in families[_family(i)] if s != i]
        return sorted(fam, key=lambda s: (abs(len(s) - len(i)), s))[:4]

    items = []
    for i in candidates:
        sib = siblings(i)
        items.append(
            {
                "id": f"spdx-id-{i}",
                "question": f'What is the SPDX identifier of the licence named "{data[i]["name"]}"?',
                "gold": [f"spdx:{i}"],
                "answer": {"kind": "exact", "value": i},
                "decoy_values": sib,
                "decoy_docs": [f"spdx:{s}" for s in sib],
            }
        )
    seen_pairs: set[tuple[str, ...]] = set()
    for i in candidates:
        other = siblings(i)[0]
        pair = sorted([i, other])
        if tuple(pair) in seen_pairs:
            continue
        seen_pairs.add(tuple(pair))
        sib = [s for s in siblings(i)[1:] + siblings(other) if s not in pair][:4]
        items.append(
            {
                "id": f"spdx-pair-{pair[0]}-{pair[1]}",
                "question": (
                    'List the SPDX identifiers of the licences named "'
                    + data[pair[0]]["name"]
                    + '" and "'
                    + data[pair[1]]["name"]
                    + '".'
                ),
                "gold": [f"spdx:{p}" for p in pair],
                "answer": {"kind": "set", "values": pair},
                "decoy_values": sib,
                "decoy_docs": [f"spdx:{s}" for s in sib],
            }
        )
    for i in candidates:
        sib = siblings(i)
        items.append(
            {
                "id": f"spdx-osi-{i}",
                "question": (
                    f"For the licence with SPDX identifier {i}, give its name and whether it is OSI "
                    "approved, as a JSON object with the keys name (a string) and osi_approved (a boolean)."
                ),
                "gold": [f"spdx:{i}"],
                "answer": {
                    "kind": "json",
                    "value": {
                        "name": data[i]["name"],
                        "osi_approved": bool(data[i].get("osiApproved")),
                    },
                    "schema": {
                        "type": "object",
                        "required": ["name", "osi_approved"],
                        "properties": {
                            "name": {"type": "string"},
                            "osi_approved": {"type": "boolean"},
                        },
                    },
                },
                "decoy_values": [data[s]["name"] for s in sib],
                "decoy_docs": [f"spdx:{s}" for s in sib],
            }
        )
    items = _unique_questions(items)
    meta = {
        "name": "spdx",
        "format_version": 1,
        "seed": seed,
        "description": (
            f"Licence records from the SPDX License List (npm spdx-license-list {SOURCE_VERSION}): "
            f"{len(docs)} documents in near-duplicate families; {len(items)} items: identifier by name "
            "(exact), identifiers of two sibling licences (set), name and OSI approval (JSON)."
        ),
        "licence": "CC0-1.0 data; quoted licence texts keep their own terms; see LICENCE.md",
    }
    write_taskset(out, meta, items, docs, SKELETON)
    (out / "LICENCE.md").write_text(LICENCE.format(version=SOURCE_VERSION))


if __name__ == "__main__":
    # the editable install's package directory: the committed files
    generate(Path(sys.argv[1]), bundled_path("spdx"))

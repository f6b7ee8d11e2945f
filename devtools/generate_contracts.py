"""The bundled ``contracts`` task set: a generated, confusable corpus of service contracts.

Deterministic from a seed. Contracts come in families whose supplier names differ by a word
("Northwind Logistics" / "Northwind Logistic Services" / ...), share clients, and have nearby
ids (C-4417 / C-4471), so every item has hard decoys: documents that look right and carry a
different value. Three answer kinds: an exact value (a fee), a set of ids (clauses on a topic),
and a JSON object checked against a schema. Synthetic on purpose: no model has memorised it, which
the closed-book control confirms.

Regenerate: ``python -m devtools.generate_contracts`` (a test fails when the committed files are stale).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from context_ceiling.sweep.taskset import write_taskset

SEED = 20261129
FAMILIES = 120
ITEMS = 960

BASES = [
    "Northwind",
    "Blue Harbor",
    "Alder",
    "Crescent",
    "Summit",
    "Ironwood",
    "Silverline",
    "Redfern",
    "Oakridge",
    "Brightwater",
    "Kestrel",
    "Granite",
    "Meridian",
    "Larkspur",
    "Cobalt",
    "Foxglove",
    "Highmoor",
    "Juniper",
    "Lindqvist",
    "Marlowe",
    "Nettlefield",
    "Orchard",
    "Pemberton",
    "Quarry",
]
SECTORS = [
    "Logistics",
    "Data Services",
    "Facilities",
    "Consulting",
    "Software",
    "Security",
    "Catering",
    "Cloud",
]
VARIANTS = ["{b} {s}", "{b} {s} Group", "{b} {s} Partners", "{b}-{s} International"]
CLIENTS = [
    "Alder Health",
    "Brookline Bank",
    "Cedar Schools",
    "Dunmore Foods",
    "Elmstead Energy",
    "Fairhaven Port",
    "Glenrock Insurance",
    "Harrow Hospitals",
    "Islay Distillers",
    "Jarrow Rail",
    "Kilbride Water",
    "Lowther Museums",
]
LAWS = ["Ireland", "the Netherlands", "Germany", "Denmark", "Portugal", "Austria"]
TOPICS = [
    "termination",
    "data protection",
    "liability",
    "audit rights",
    "renewal",
    "confidentiality",
    "subcontracting",
    "payment terms",
    "service levels",
    "insurance",
]

SKELETON = """You answer questions about service contracts using only the documents provided. Many documents look alike: check names, ids and values carefully.
---
<documents>
{documents}
</documents>

Question: {question}
Reply with JSON only, in this form: {"answer": <the answer>, "evidence": [<ids of the documents you used>]}"""


def _contracts(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    used: set[str] = set()
    for f in range(FAMILIES):
        base = BASES[f % len(BASES)]
        sector = SECTORS[(f // len(BASES) + f) % len(SECTORS)]
        client = rng.choice(CLIENTS)
        root = rng.randrange(1000, 9000)
        digits = list(str(root))
        for v, pattern in enumerate(VARIANTS):
            # nearby, confusable ids: the family's digits, permuted
            cid = "C-" + "".join(digits)
            while cid in used:
                rng.shuffle(digits)
                cid = "C-" + "".join(digits)
            used.add(cid)
            rng.shuffle(digits)
            clauses = []
            topics = rng.sample(TOPICS, 6)
            for n, topic in enumerate(topics, 1):
                clauses.append({"id": f"{cid}/{n}", "topic": topic})
            extra = rng.choice([t for t in TOPICS if t not in topics[:1]])
            # a second clause on the family's chosen topic in some variants: different answer sets
            if v % 2 == 0:
                clauses.append({"id": f"{cid}/{len(clauses) + 1}", "topic": topics[0]})
            else:
                clauses.append({"id": f"{cid}/{len(clauses) + 1}", "topic": extra})
            out.append(
                {
                    "family": f,
                    "variant": v,
                    "id": cid,
                    "supplier": pattern.format(b=base, s=sector),
                    "client": client,
                    "fee": rng.randrange(8, 240) * 50,
                    "notice_days": rng.choice([30, 45, 60, 90, 120, 180]),
                    "law": rng.choice(LAWS),
                    "start": rng.randrange(2019, 2027),
                    "clauses": clauses,
                    "focus": topics[0],
                }
            )
    return out


def _docs(c: dict[str, Any]) -> list[dict[str, str]]:
    terms = (
        f"Service contract {c['id']} between {c['supplier']} (supplier) and {c['client']} (client), "
        f"in force since {c['start']}. The annual renewal fee is {c['fee']:,} EUR. Either party may "
        f"give notice of {c['notice_days']} days. The contract is governed by the law of {c['law']}."
    )
    lines = [f"Clause {cl['id']} covers {cl['topic']}." for cl in c["clauses"]]
    clauses = (
        f"Clause register of contract {c['id']} ({c['supplier']} for {c['client']}): "
        + " ".join(lines)
    )
    return [
        {"id": f"{c['id']}-T", "title": f"Terms of {c['id']}", "text": terms},
        {"id": f"{c['id']}-C", "title": f"Clauses of {c['id']}", "text": clauses},
    ]


def _item(c: dict[str, Any], siblings: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    if kind == "exact":
        return {
            "id": f"fee-{c['id']}",
            "question": f"What is the annual renewal fee, in EUR, of the service contract between {c['supplier']} and {c['client']}?",
            "gold": [f"{c['id']}-T"],
            "answer": {"kind": "exact", "value": str(c["fee"])},
            "decoy_values": sorted({str(s["fee"]) for s in siblings} - {str(c["fee"])}),
            "decoy_docs": [f"{s['id']}-T" for s in siblings],
        }
    if kind == "set":
        topic = c["focus"]
        ids = [cl["id"] for cl in c["clauses"] if cl["topic"] == topic]
        decoys = sorted({cl["id"] for s in siblings for cl in s["clauses"] if cl["topic"] == topic})
        return {
            "id": f"clauses-{c['id']}",
            "question": f"Which clause ids of contract {c['id']} cover {topic}? Answer with the list of clause ids.",
            "gold": [f"{c['id']}-C"],
            "answer": {"kind": "set", "values": ids},
            "decoy_values": decoys,
            "decoy_docs": [f"{s['id']}-C" for s in siblings],
        }
    return {
        "id": f"parties-{c['id']}",
        "question": (
            f"For contract {c['id']}, give the supplier and the notice period as a JSON object "
            "with the keys supplier (a string) and notice_days (a number)."
        ),
        "gold": [f"{c['id']}-T"],
        "answer": {
            "kind": "json",
            "value": {"supplier": c["supplier"], "notice_days": c["notice_days"]},
            "schema": {
                "type": "object",
                "required": ["supplier", "notice_days"],
                "properties": {"supplier": {"type": "string"}, "notice_days": {"type": "number"}},
            },
        },
        "decoy_values": sorted(
            {s["supplier"] for s in siblings} | {str(s["notice_days"]) for s in siblings}
        ),
        "decoy_docs": [f"{s['id']}-T" for s in siblings],
    }


def generate(out: Path, seed: int = SEED) -> None:
    rng = random.Random(seed)
    contracts = _contracts(rng)
    docs = [d for c in contracts for d in _docs(c)]
    rng.shuffle(docs)
    by_family: dict[int, list[dict[str, Any]]] = {}
    for c in contracts:
        by_family.setdefault(c["family"], []).append(c)
    # two of the three questions of each contract (960 of 1,440): enough items to resolve a
    # 0.05 tolerance (the sweep plans about 230 and adds up to all of them where it must)
    kinds = ["exact", "set", "json"]
    pairs = rng.sample([(c, k) for c in contracts for k in kinds], ITEMS)
    items, questions = [], set()
    for c, kind in pairs:
        item = _item(c, [s for s in by_family[c["family"]] if s is not c], kind)
        if item["question"] not in questions:  # a question must name one item
            questions.add(item["question"])
            items.append(item)
    meta = {
        "name": "contracts",
        "format_version": 1,
        "seed": seed,
        "description": (
            "Generated service contracts in confusable families (near-identical supplier names, "
            "shared clients, permuted ids). 960 items: renewal fee (exact), clause ids on a topic "
            "(set), supplier and notice period (JSON object)."
        ),
        "licence": "CC0-1.0 (generated by context-ceiling)",
    }
    write_taskset(out, meta, items, docs, SKELETON)


if __name__ == "__main__":
    generate(
        Path(__file__).parent.parent
        / "src"
        / "context_ceiling"
        / "sweep"
        / "tasksets"
        / "contracts"
    )

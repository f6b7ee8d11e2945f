"""Generators of the bundled task sets' corpora, in the package: the sweep extends a bundled
corpus with more documents of the same kind when a window is larger than the committed corpus
fills (``extend``), so a bundled task set fills any window, 4k to 1M tokens, with plausible
neighbours (more confusable contract families), never filler.

The committed ``contracts`` task set is generated from these functions
(``python -m devtools.generate_contracts``), so its documents and the padding that extends it
are one kind of text.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from context_ceiling.sweep import landmarks
from context_ceiling.sweep.taskset import Doc, TaskSet

__all__ = [
    "CHARS_PER_TOKEN",
    "EXTENDABLE",
    "FAMILIES",
    "RECORDS_SEED",
    "SEED",
    "contracts",
    "documents",
    "extend",
    "more_vaults",
    "reach",
    "vault_document",
    "vault_records",
]

SEED = 20261129
FAMILIES = 120
#: shuffles of a family's digits before it takes a fresh root: a root with repeated digits has
#: few permutations, and the padding draws thousands of families
SHUFFLES = 100

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


def contracts(
    rng: random.Random,
    families: int = FAMILIES,
    first: int = 0,
    roots: tuple[int, int] = (1000, 9000),
    used: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Contracts of ``families`` families (from family ``first``), each in four confusable
    variants, ids drawn from ``roots`` (four digits for the bundled set, more for padding)."""
    out = []
    used = set() if used is None else used
    for f in range(first, first + families):
        base = BASES[f % len(BASES)]
        sector = SECTORS[(f // len(BASES) + f) % len(SECTORS)]
        client = rng.choice(CLIENTS)
        root = rng.randrange(*roots)
        digits = list(str(root))
        for v, pattern in enumerate(VARIANTS):
            # nearby, confusable ids: the family's digits, permuted
            cid = "C-" + "".join(digits)
            tries = 0
            while cid in used:
                tries += 1
                if tries > SHUFFLES:  # its permutations are spent (a root such as 22222)
                    digits, tries = list(str(rng.randrange(*roots))), 0
                else:
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


def documents(c: dict[str, Any]) -> list[dict[str, str]]:
    """A contract's two documents: its terms and its clause register."""
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


RECORDS_SEED = 20261203
VAULT_FIRST = [
    "Amber", "Silent", "Copper", "Northern", "Hidden", "Crimson", "Silver", "Golden", "Quiet",
    "Stone", "Iron", "Misty", "Hollow", "Bright", "Frozen", "Velvet", "Cobalt", "Scarlet",
    "Emerald", "Ashen", "Distant", "Broken", "Rapid", "Sunken", "Pale", "Wild", "Ancient", "Lunar",
    "Tidal", "Royal", "Eastern", "Western",
]  # fmt: skip
VAULT_SECOND = [
    "Falcon", "Harbor", "River", "Meadow", "Summit", "Lantern", "Willow", "Anchor", "Beacon",
    "Canyon", "Cedar", "Comet", "Crown", "Delta", "Ember", "Forge", "Garden", "Glacier", "Grove",
    "Haven", "Heron", "Island", "Lake", "Maple", "Orchard", "Raven", "Ridge", "Tower", "Valley",
    "Vine", "Wolf", "Quarry",
]  # fmt: skip

#: a third word for the vaults the extension adds (the committed ones have two): each new name
#: still shares words with dozens of others, committed ones among them
VAULT_THIRD = [
    "Annex", "Depot", "Hall", "Keep", "Yard", "Works", "Store", "Lodge", "Gate", "Court",
    "Mill", "Wharf", "Dock", "Cellar", "Vault", "Bastion",
]  # fmt: skip
#: and a fourth, once the three-word names are spent
VAULT_SIDES = ["North", "South", "East", "West", "Upper", "Lower", "Inner", "Outer"]


def vault_records(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """The committed ``records`` set's vaults: ``count`` two-word names, five-digit codes."""
    names = sorted({f"{a} {b}" for a in VAULT_FIRST for b in VAULT_SECOND})
    rng.shuffle(names)
    codes = rng.sample(range(10_000, 100_000), count)
    return [
        {"n": i + 1, "name": names[i], "code": str(codes[i])} for i in range(min(count, len(names)))
    ]


def vault_document(r: dict[str, Any]) -> dict[str, str]:
    """A vault's record as a corpus document."""
    return {
        "id": f"R-{r['n']:04d}",
        "text": f"Record {r['n']}: the code for vault {r['name']} is {r['code']}.",
    }


def more_vaults(rng: random.Random, first: int, used_codes: set[str]) -> Iterator[dict[str, str]]:
    """Records numbered from ``first``: three-word vaults (a committed two-word name and a third
    word), then four-word ones, codes never used before (``used_codes`` grows), until the
    five-digit codes run out."""
    pairs = [f"{a} {b}" for a in VAULT_FIRST for b in VAULT_SECOND]
    free = [c for c in range(10_000, 100_000) if str(c) not in used_codes]
    rng.shuffle(free)
    n = first
    for side in ["", *VAULT_SIDES]:
        for third in VAULT_THIRD:
            rng.shuffle(pairs)
            for pair in pairs:
                if not free:  # every five-digit code is taken (past a million tokens)
                    return
                code = str(free.pop())
                used_codes.add(code)
                name = f"{side} {pair} {third}" if side else f"{pair} {third}"
                yield vault_document({"n": n, "name": name, "code": code})
                n += 1


#: more characters per token than the generated text has under the shipped encodings (3.8
#: under o200k_base and cl100k_base): an extension sized by it holds more tokens than asked,
#: room for the documents' own wrapping and for a tokenizer that splits finer
CHARS_PER_TOKEN = 5.0


def reach(levels: list[float], window: int) -> int:
    """The tokens the highest level fills: what a task set's corpus must hold."""
    return math.ceil(max(levels, default=0.0) * window)


def extend(ts: TaskSet, reach_tokens: int) -> TaskSet:
    """``ts`` with its corpus extended, deterministically, until it holds about
    ``reach_tokens`` tokens (sized by :data:`CHARS_PER_TOKEN`): more contract families for the
    bundled ``contracts`` set (ids of five or more digits, never a committed one), more notes
    about people by places no question names for ``landmarks``, more vault records for
    ``records`` (three-word names, codes never used); the items and the skeleton unchanged. A
    task set without a generator, or one that already fills ``reach_tokens``, comes back as it
    is. The hash names the extension, so a run's provenance says which corpus it measured."""
    have = sum(len(d.text) for d in ts.docs.values())
    want = int(reach_tokens * CHARS_PER_TOKEN)
    padding = _PADDING.get(ts.meta.name)
    if padding is None or ts.meta.seed != padding[0] or have >= want:
        return ts
    seed, batches = padding
    docs = dict(ts.docs)
    for batch in batches(random.Random(seed + 1), ts):
        if have >= want:
            break
        for d in batch:
            docs[d["id"]] = Doc(**d)
            have += len(d["text"])
    added = len(docs) - len(ts.docs)
    return replace(
        ts,
        docs=docs,
        hash=f"{ts.hash}+padding:{added}",
        corpus_hash=f"{ts.corpus_hash}+padding:{added}",
    )


def _contract_batches(rng: random.Random, ts: TaskSet) -> Iterator[list[dict[str, str]]]:
    """Forty more contract families at a time, ids never used by ``ts``."""
    used = {d.id.rsplit("-", 1)[0] for d in ts.docs.values()}
    first, batch = FAMILIES, 40
    while True:
        yield [
            d for c in contracts(rng, batch, first, (10_000, 100_000), used) for d in documents(c)
        ]
        first += batch


def _note_batches(rng: random.Random, ts: TaskSet) -> Iterator[list[dict[str, str]]]:
    """Two hundred more notes at a time, about people ``ts`` never names."""
    used = {n for d in ts.docs.values() for n in landmarks.names_in(d.text)}
    names = landmarks.fresh_names(rng, used)
    first = len(ts.docs) + 1
    while True:
        yield landmarks.padding(rng, first, 200, names)
        first += 200


def _vault_batches(rng: random.Random, ts: TaskSet) -> Iterator[list[dict[str, str]]]:
    """One more vault record at a time, with a code ``ts`` never uses, until the codes run out."""
    codes = {d.text.rsplit(" ", 1)[1].rstrip(".") for d in ts.docs.values()}
    for d in more_vaults(rng, len(ts.docs) + 1, codes):
        yield [d]


#: the bundled task sets a generator extends: name -> (the seed their committed files were
#: generated from, their padding in batches; the extension stops between batches)
_PADDING: dict[
    str, tuple[int, Callable[[random.Random, TaskSet], Iterator[list[dict[str, str]]]]]
] = {
    "contracts": (SEED, _contract_batches),
    "landmarks": (landmarks.SEED, _note_batches),
    "records": (RECORDS_SEED, _vault_batches),
}
#: the task sets that can be extended, by name
EXTENDABLE = tuple(_PADDING)

"""The ``landmarks`` task set's generator: questions that share no word with their evidence.

Needle tests whose question repeats the needle's words are easy: a model (or a retriever) can
match words instead of reading. The NoLiMa benchmark showed the difference: with the literal
overlap removed, the accuracy of most long-context models falls far earlier in the window. Here
each note says where one person lives by a landmark ("Actually, Ilse Marchetti lives next to
the Charles Bridge."), and the question names only the city, the region or the country ("Which
colleague has been to Prague?"): answering takes one step of knowledge the model has (the Charles Bridge is
in Prague) and no word of the question appears in the evidence (checked for every item,
:func:`content_words`). Decoys are the other notes of the same form: people living by other
landmarks (other items' evidence) and by places no question names ("the old tram depot").

A city has one landmark in the whole corpus, so every question has one answer; a region or a
country is asked about only where exactly one landmark of the list lies in it. The padding that extends the corpus
for large windows (:func:`padding`) is more notes about places no question names, so the set
fills any window with neighbours of its own kind, never filler. Deterministic from the seed;
the committed files come from :func:`generate` (``python -m devtools.generate_landmarks``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "PLACES",
    "SEED",
    "content_words",
    "fresh_names",
    "generate",
    "names_in",
    "overlaps",
    "padding",
]

SEED = 20261205
#: the committed notes that name no landmark (the extension adds more of them)
NOTES = 1800

#: (landmark, city, country, region or ""): famous enough that a model knows where each is, and
#: no landmark names its city, its region or its country
PLACES = [
    ("the Charles Bridge", "Prague", "the Czech Republic", ""),
    ("the Eiffel Tower", "Paris", "France", ""),
    ("the Colosseum", "Rome", "Italy", "Lazio"),
    ("the Brandenburg Gate", "Berlin", "Germany", ""),
    ("the Sagrada Familia", "Barcelona", "Spain", "Catalonia"),
    ("the Acropolis", "Athens", "Greece", ""),
    ("Big Ben", "London", "the United Kingdom", "England"),
    ("the Little Mermaid statue", "Copenhagen", "Denmark", ""),
    ("the Atomium", "Brussels", "Belgium", ""),
    ("the Rijksmuseum", "Amsterdam", "the Netherlands", ""),
    ("the Hofburg", "Vienna", "Austria", ""),
    ("the Hagia Sophia", "Istanbul", "Turkey", ""),
    ("Red Square", "Moscow", "Russia", ""),
    ("the Chain Bridge over the Danube", "Budapest", "Hungary", ""),
    ("Wawel Castle", "Krakow", "Poland", ""),
    ("the Belem Tower", "Lisbon", "Portugal", ""),
    ("the Ha'penny Bridge", "Dublin", "Ireland", ""),
    ("Arthur's Seat", "Edinburgh", "the United Kingdom", "Scotland"),
    ("the Vasa Museum", "Stockholm", "Sweden", ""),
    ("the Vigeland sculpture park", "Oslo", "Norway", ""),
    ("the Suomenlinna fortress", "Helsinki", "Finland", ""),
    ("the Golden Gate Bridge", "San Francisco", "the United States", "California"),
    ("the CN Tower", "Toronto", "Canada", "Ontario"),
    ("the Christ the Redeemer statue", "Rio de Janeiro", "Brazil", ""),
    ("the Zocalo", "Mexico City", "Mexico", ""),
    ("the Forbidden City", "Beijing", "China", ""),
    ("the Senso-ji temple", "Tokyo", "Japan", ""),
    ("Gyeongbokgung Palace", "Seoul", "South Korea", ""),
    ("the Petronas Towers", "Kuala Lumpur", "Malaysia", ""),
    ("the Marina Bay Sands hotel", "Singapore", "Singapore", ""),
    ("the Grand Palace of Wat Phra Kaew", "Bangkok", "Thailand", ""),
    ("the Taj Mahal", "Agra", "India", "Uttar Pradesh"),
    ("the Burj Khalifa", "Dubai", "the United Arab Emirates", ""),
    ("Table Mountain", "Cape Town", "South Africa", ""),
    ("Bondi Beach", "Sydney", "Australia", "New South Wales"),
    ("the Western Wall", "Jerusalem", "Israel", ""),
    ("the Hallgrimskirkja church", "Reykjavik", "Iceland", ""),
    ("the Chapel Bridge", "Lucerne", "Switzerland", ""),
    ("the Shwedagon Pagoda", "Yangon", "Myanmar", ""),
    ("the Space Needle", "Seattle", "the United States", "Washington State"),
    ("the Uffizi Gallery", "Florence", "Italy", "Tuscany"),
    ("the Alhambra", "Granada", "Spain", "Andalusia"),
    ("the Hermitage Museum", "Saint Petersburg", "Russia", ""),
    ("the Rialto Bridge", "Venice", "Italy", "Veneto"),
    ("the Statue of Liberty", "New York", "the United States", "New York State"),
    ("the Hollywood sign", "Los Angeles", "the United States", "California"),
    ("the Bund waterfront", "Shanghai", "China", ""),
    ("the Fushimi Inari shrine", "Kyoto", "Japan", ""),
    ("the Marienplatz glockenspiel", "Munich", "Germany", "Bavaria"),
    ("the Palace of Culture and Science", "Warsaw", "Poland", ""),
    ("the Guggenheim Museum by the Nervion river", "Bilbao", "Spain", "the Basque Country"),
    ("the Plaza de Mayo", "Buenos Aires", "Argentina", ""),
    ("La Moneda palace", "Santiago", "Chile", ""),
    ("the Golden Temple", "Amritsar", "India", "Punjab"),
    ("the Hawa Mahal palace of winds", "Jaipur", "India", "Rajasthan"),
    ("the Kaaba", "Mecca", "Saudi Arabia", ""),
    ("the Pyramids", "Giza", "Egypt", ""),
    ("Jemaa el-Fnaa square", "Marrakesh", "Morocco", ""),
    ("Federation Square", "Melbourne", "Australia", "Victoria"),
    ("the Sky Tower", "Auckland", "New Zealand", ""),
    ("the Gateway Arch", "St. Louis", "the United States", "Missouri"),
    ("Graceland", "Memphis", "the United States", "Tennessee"),
    ("the Alamo", "San Antonio", "the United States", "Texas"),
    ("the Liberty Bell", "Philadelphia", "the United States", "Pennsylvania"),
    ("Fenway Park", "Boston", "the United States", "Massachusetts"),
    ("the Bellagio fountains", "Las Vegas", "the United States", "Nevada"),
    ("the Willis Tower", "Chicago", "the United States", "Illinois"),
    ("the Cavern Club", "Liverpool", "the United Kingdom", "England"),
    ("Old Trafford", "Manchester", "the United Kingdom", "England"),
    ("the Radcliffe Camera", "Oxford", "the United Kingdom", "England"),
    ("the Blarney Stone", "Cork", "Ireland", ""),
    ("the Promenade des Anglais", "Nice", "France", "Provence"),
    ("the Palais des Papes", "Avignon", "France", "Provence"),
    ("the Leaning Tower", "Pisa", "Italy", "Tuscany"),
    ("La Scala opera house", "Milan", "Italy", "Lombardy"),
    ("the Mezquita", "Cordoba", "Spain", "Andalusia"),
    ("the Prado Museum", "Madrid", "Spain", ""),
    ("the Dom Luis I bridge", "Porto", "Portugal", ""),
    ("the House of Blackheads", "Riga", "Latvia", ""),
    ("the Gediminas Tower", "Vilnius", "Lithuania", ""),
    ("the Palace of the Parliament", "Bucharest", "Romania", ""),
    ("the Alexander Nevsky Cathedral", "Sofia", "Bulgaria", ""),
    ("Diocletian's Palace", "Split", "Croatia", ""),
    ("the Old Bridge over the Neretva", "Mostar", "Bosnia and Herzegovina", ""),
    ("the Kalemegdan fortress", "Belgrade", "Serbia", ""),
    ("Stanley Park", "Vancouver", "Canada", "British Columbia"),
]

#: places no question names: the decoy notes' and the padding's
ORDINARY = [
    "the old tram depot",
    "a bakery on the corner",
    "the municipal swimming pool",
    "the allotment gardens",
    "a quiet cul-de-sac",
    "the regional archive",
    "the bus station",
    "a converted textile mill",
    "the night market",
    "a lighthouse keeper's cottage",
    "the cricket ground",
    "a row of almshouses",
    "the county hospital",
    "the canal locks",
    "a garden centre",
    "the rowing club",
    "an abandoned cinema",
    "the fire station",
    "a dairy farm",
    "the ferry terminal",
    "the botanical greenhouse",
    "a motorway service area",
    "the public library",
    "a hillside vineyard",
    "the ice rink",
    "the old quarry",
    "a roadside chapel",
    "the retail park",
    "the tennis courts",
    "a disused railway viaduct",
]
FIRST = [
    "Ilse", "Tomas", "Amara", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hugo",
    "Ingrid", "Jonas", "Keiko", "Lars", "Mina", "Nils", "Olga", "Pavel", "Quentin", "Rosa",
    "Soren", "Tala", "Ulrich", "Vera", "Wim", "Xenia", "Yusuf", "Zofia", "Anders", "Beatriz",
    "Cyril", "Dalia", "Emil", "Freya", "Gustav", "Hana", "Ivo", "Jana", "Kasper", "Lucia",
]  # fmt: skip
LAST = [
    "Marchetti", "Lindgren", "Okafor", "Kessler", "Novak", "Haddad", "Brandt", "Castillo",
    "Dufresne", "Eriksen", "Ferreira", "Grunwald", "Horvath", "Ivanova", "Jansen", "Kowalski",
    "Larsen", "Moreau", "Nakamura", "Oyelaran", "Petrov", "Quist", "Rossi", "Schulz", "Tanaka",
    "Ulmer", "Varga", "Wagner", "Yilmaz", "Zeller", "Abbasi", "Bergstrom", "Costa", "Dalton",
    "Esposito", "Fischer", "Gallo", "Holm", "Ishikawa", "Jovanovic",
]  # fmt: skip
#: how a note places its person (none of these words is in a question)
WHERE = [
    "Actually, {name} lives next to {place}.",
    "{name} mentioned that the flat overlooks {place}.",
    "{name} rents a studio a short walk from {place}.",
    "Each morning {name} jogs past {place}.",
    "{name} moved last spring into a house beside {place}.",
]
#: what else a note says (the same kind of text in every note)
ALSO = [
    "{first} prefers tea to coffee.",
    "{first} is learning the cello.",
    "{first} joined the design team in {year}.",
    "{first} keeps a sketchbook of street corners.",
    "{first} volunteers at a food bank on Saturdays.",
    "{first} collects vinyl records from the seventies.",
    "{first} bakes sourdough every weekend.",
    "{first} cycles to the office in all weathers.",
]
#: how a question asks (its words are never in a note)
ASK = [
    "Which colleague has been to {target}?",
    "Which colleague knows {target} well?",
    "Which colleague could show a visitor around {target}?",
]
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "from",
        "with",
        "and",
        "or",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "has",
        "have",
        "had",
        "which",
        "who",
        "what",
        "where",
        "when",
        "how",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "as",
        "into",
        "over",
        "around",
    ]
)

SKELETON = """You answer questions about the people described in the notes provided. A question may name a city or a country that no note names: use what you know about where each place in the notes is.
---
<documents>
{documents}
</documents>

Question: {question}
Reply with the person's full name only."""


def content_words(text: str) -> set[str]:
    """A text's words, lower-cased, less the stop words: what literal overlap is measured on."""
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in STOPWORDS}


def overlaps(question: str, evidence: str) -> set[str]:
    """The question's content words found in the evidence: the word itself, or, for words of
    four letters or more, one that starts with the other (``Prague`` in ``Praguers``)."""
    ev = content_words(evidence)
    return {
        q
        for q in content_words(question)
        for e in ev
        if q == e or (min(len(q), len(e)) >= 4 and (e.startswith(q) or q.startswith(e)))
    }


INITIALS = list("ABCDEFGHJKLMNOPRSTVW")
_NAME = re.compile(rf"\b(?:{'|'.join(FIRST)})(?: [A-Z]\.){{0,2}} (?:{'|'.join(LAST)})\b")


def names_in(text: str) -> set[str]:
    """The people a text names (so the padding never gives one of them a second home)."""
    return set(_NAME.findall(text))


def _names(rng: random.Random) -> Iterator[str]:
    """Every person's name once: first and last names, then with one middle initial, then
    with two (as many as a million-token corpus needs)."""
    pairs = [(f, last) for f in FIRST for last in LAST]
    for middle in ["", *INITIALS, *(a + ". " + b for a in INITIALS for b in INITIALS)]:
        rng.shuffle(pairs)
        yield from (f"{f} {middle}. {last}" if middle else f"{f} {last}" for f, last in pairs)


def _note(rng: random.Random, n: int, name: str, place: str) -> dict[str, str]:
    first = name.split()[0]
    text = (
        f"Note {n}. "
        + rng.choice(WHERE).format(name=name, place=place)
        + " "
        + rng.choice(ALSO).format(first=first, year=rng.randrange(2012, 2026))
    )
    return {"id": f"N-{n:05d}", "title": f"Note {n}", "text": text}


def fresh_names(rng: random.Random, used: set[str]) -> Iterator[str]:
    """Names in the order :func:`_names` draws them, less those in ``used`` (one stream per
    corpus: the padding takes from it batch after batch)."""
    return (n for n in _names(rng) if n not in used)


def padding(
    rng: random.Random, first: int, count: int, names: Iterator[str]
) -> list[dict[str, str]]:
    """``count`` notes numbered from ``first`` about the next people of ``names`` (see
    :func:`fresh_names`) living by places no question names."""
    return [_note(rng, first + k, next(names), rng.choice(ORDINARY)) for k in range(count)]


def generate(out: Path, seed: int = SEED) -> None:
    """Write the task set directory (the committed one is ``sweep/tasksets/landmarks``)."""
    from context_ceiling.sweep.taskset import write_taskset

    rng = random.Random(seed)
    names = _names(rng)
    docs: list[dict[str, str]] = []
    owners: list[tuple[str, str, str, str, str, str]] = []  # doc, name, landmark, city, ...
    for landmark, city, country, region in PLACES:
        name = next(names)
        note = _note(rng, len(docs) + 1, name, landmark)
        docs.append(note)
        owners.append((note["id"], name, landmark, city, country, region))
    docs += padding(rng, len(docs) + 1, NOTES, names)  # the same stream: every name once
    by_id = {d["id"]: d for d in docs}
    cities = [o[3] for o in owners]
    countries = [o[4] for o in owners]
    regions = [o[5] for o in owners]
    if len(set(cities)) != len(cities):
        raise AssertionError("a city has two landmarks: its question would have two answers")
    items = []
    for doc, name, _landmark, city, country, region in owners:
        # a region or a country is asked about only where one landmark lies in it
        targets = [("city", city)]
        if region and regions.count(region) == 1 and region not in cities:
            targets.append(("region", region))
        if countries.count(country) == 1 and country not in cities:
            targets.append(("country", country))
        others = [o for o in owners if o[0] != doc]
        for kind, target in targets:
            question = rng.choice(ASK).format(target=target)
            found = overlaps(question, by_id[doc]["text"])
            if found:
                raise AssertionError(f"{doc}: {question!r} shares {sorted(found)} with its note")
            decoys = sorted(rng.sample(others, 5))
            slug = re.sub(r"[^a-z0-9]+", "-", target.lower()).strip("-")
            items.append(
                {
                    "id": f"{kind}-{slug}",
                    "question": question,
                    "gold": [doc],
                    "answer": {"kind": "exact", "value": name},
                    "decoy_docs": [d[0] for d in decoys],
                    "decoy_values": [d[1] for d in decoys],
                }
            )
    items.sort(key=lambda i: str(i["id"]))
    docs.sort(key=lambda d: d["id"])
    meta = {
        "name": "landmarks",
        "format_version": 1,
        "seed": seed,
        "description": (
            f"Generated notes ({len(docs)}) on where people live, {len(PLACES)} of them by a "
            f"famous landmark; {len(items)} items: who has been to a city, region or country "
            "no note names (exact). No word of a question is in its evidence: the answer takes a "
            "step of knowledge (where the landmark is), not a word match."
        ),
        "licence": "CC0-1.0 (generated by context-ceiling)",
    }
    write_taskset(out, meta, items, docs, SKELETON)

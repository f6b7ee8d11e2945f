"""An inspect_ai reading-comprehension task as a team would already have it: a dataset of
samples whose metadata carries the passage that answers each question, a solver, and the
``includes()`` scorer. ``ceiling sweep run --taskset inspect:testkit/data/inspect/reading.py@reading``
sweeps it unchanged."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes, model_graded_qa
from inspect_ai.solver import generate

#: (passage, question, accepted answers)
PASSAGES = [
    (
        "The Harbour Line ferry leaves Pier 4 every 35 minutes between 06:10 and 23:40. "
        "Bicycles travel free; dogs need a day ticket.",
        "How often does the Harbour Line ferry leave Pier 4?",
        ["every 35 minutes", "35 minutes"],
    ),
    (
        "Ridgeway Library extended its Saturday hours in March: it now opens at 09:30 and "
        "closes at 18:00. The reading room closes half an hour earlier.",
        "At what time does Ridgeway Library close on Saturdays?",
        ["18:00", "6 pm"],
    ),
    (
        "The Coldwater dam supplies 41 percent of the valley's drinking water; the rest "
        "comes from two aquifers under the northern plain.",
        "What share of the valley's drinking water comes from the Coldwater dam?",
        ["41 percent", "41%"],
    ),
    (
        "Marta Velez chaired the orchestra board from 2014 until 2019, when Jonas Ekberg "
        "took over after a unanimous vote.",
        "Who took over as chair of the orchestra board in 2019?",
        ["Jonas Ekberg"],
    ),
    (
        "The hillside vineyard grows mostly Grüner Veltliner; a small terrace by the chapel "
        "is planted with Zweigelt for the estate's only red.",
        "Which grape is used for the estate's only red wine?",
        ["Zweigelt"],
    ),
    (
        "Applicants for the mobility grant must submit a budget, two references and a "
        "letter of intent by 15 October; late applications roll over to spring.",
        "What is the deadline for the mobility grant?",
        ["15 October", "October 15"],
    ),
    (
        "The old tram depot on Keller Street was converted into a market hall with 58 "
        "stalls, a bakery school and a rooftop garden.",
        "How many stalls does the market hall on Keller Street have?",
        ["58"],
    ),
    (
        "Firmware 4.2 for the Aster thermostat fixes the night-mode drift and adds support "
        "for the Zigbee 3.0 radio; version 4.1 is withdrawn.",
        "Which firmware version of the Aster thermostat was withdrawn?",
        ["4.1"],
    ),
    (
        "The coastal path between Selby Cove and Marram Point is 11.5 kilometres long and "
        "closes during the nesting season from April to June.",
        "How long is the coastal path between Selby Cove and Marram Point?",
        ["11.5 kilometres", "11.5 km"],
    ),
    (
        "Dr. Ines Carvalho leads the sleep study; recruitment is handled by the clinic's "
        "research nurse, Tomasz Bielecki.",
        "Who handles recruitment for the sleep study?",
        ["Tomasz Bielecki"],
    ),
    (
        "The community garden charges 24 euros a year per plot; tools in the shed are "
        "shared, and water is free until September.",
        "What is the yearly fee for a plot in the community garden?",
        ["24 euros", "24"],
    ),
    (
        "The 1907 flood reached 3.2 metres at the town bridge, a mark still painted on the "
        "pillar beside the mill.",
        "How high did the 1907 flood reach at the town bridge?",
        ["3.2 metres", "3.2 m"],
    ),
]


def _dataset() -> MemoryDataset:
    return MemoryDataset(
        [
            Sample(id=f"r{n}", input=q, target=answers, metadata={"context": passage})
            for n, (passage, q, answers) in enumerate(PASSAGES, 1)
        ],
        name="reading",
    )


@task
def reading() -> Task:
    return Task(dataset=_dataset(), solver=generate(), scorer=includes())


@task
def reading_judged() -> Task:
    """The same samples graded by a judge model: not a scorer the sweep can hold fixed."""
    return Task(dataset=_dataset(), solver=generate(), scorer=model_graded_qa())

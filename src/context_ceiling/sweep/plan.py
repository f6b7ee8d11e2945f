"""The plan (``plan.json``): what a sweep measures, written before its first call.

Task set, endpoint, levels, repeats, window, counter, seed and shard are fixed here, so a resumed
or sharded run measures exactly what was planned, and the analysis judges the log against the
plan (a planned call that is missing fails its level) rather than against whatever the log holds.
The adaptive parts (items drawn, the batches they came in, items per level, refined levels) are
updated in place and saved before the calls they add are made. :func:`finished` readies a plan
for its first call against what the run measured (:class:`Material`); :func:`opened_on` cuts
its opening to what a budget affords.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import ConfigDict, Field, ValidationError, model_validator

from context_ceiling.core.errors import UserError
from context_ceiling.core.prices import known_window
from context_ceiling.core.strict import Strict
from context_ceiling.core.utilization import practical_limit
from context_ceiling.core.vocabulary import SweepApi
from context_ceiling.sweep.design import Opening, asked_few, deferred
from context_ceiling.sweep.spec import Spec
from context_ceiling.sweep.statistics import ADDED_REPEATS
from context_ceiling.sweep.taskset import Item

#: the spec's field names (a plan written before the spec had a model names them at the top)
SPEC = frozenset(Spec.model_fields)

PLAN_FILE = "plan.json"


class EndpointRef(Strict):
    base_url: str
    api: SweepApi
    model: str


class TaskSetRef(Strict):
    """The task set's identity: any change to it is a reason to re-sweep."""

    name: str
    hash: str
    corpus_hash: str
    skeleton_hash: str
    #: what the answers measure: accuracy (labelled), agreement (unlabelled) or both
    metric: str = "accuracy"
    #: the traffic shape a task set built from captures was drawn from
    fingerprint: dict[str, float] | None = None


class Plan(Strict):
    """``plan.json``. Mutable on purpose: the adaptive design grows it between batches."""

    model_config = ConfigDict(frozen=False, validate_assignment=True)

    run_id: str
    created_at: str = ""
    #: what the sweep measures, as asked for
    spec: Spec
    min_accuracy: float | None = None
    shard: tuple[int, int] | None = None
    refine: bool = False
    adaptive: bool = False
    baseline: str | None = None  # the run a --reduced regression check is paired against
    merged_from: list[str] | None = None
    # resolved before the first call
    window: int | None = None
    counter: str | None = None
    endpoint: EndpointRef | None = None
    taskset: TaskSetRef | None = None
    groups: int | None = None
    system_tokens: int | None = None
    mean_doc_tokens: float | None = None
    # the design, grown as the sweep runs
    levels: list[float] = Field(default_factory=list)
    reference: float | None = None
    item_ids: list[str] = Field(default_factory=list)
    batches: list[int] = Field(default_factory=list)
    #: the repeats each batch's items are asked with (missing: the spec's), chosen by the
    #: repeats' measured agreement when the batch is drawn
    batch_repeats: list[int] = Field(default_factory=list)
    n_at: dict[str, int] = Field(default_factory=dict)
    n_control: int | None = None
    planned_items: int | None = None
    item_cap: int | None = None
    #: the items the pass test's bets are tuned for, fixed before the first call
    horizon: int | None = None
    #: levels the refinement added (their pass test runs at the refinement's share of the error)
    refined: list[float] = Field(default_factory=list)
    #: levels the dip scan added between passing levels
    scanned: list[float] = Field(default_factory=list)
    #: levels the refinement probed on the opening's items inside the deciding bracket
    probed: list[float] = Field(default_factory=list)
    #: grid levels asked as often as the added calls from the opening on (the practical limit
    #: of an adaptive design: ``design.asked_few``)
    few_repeats: list[float] = Field(default_factory=list)
    #: grid levels an adaptive design has not measured yet (``design.deferred``): each is
    #: measured on the opening's items, the first (``design.staged``) once the reference holds
    #: the accuracy floor, the others once every level below them passes
    grid_left: list[float] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """A plan written before the spec had a model of its own: its fields at the top level,
        three of them named after their arguments."""
        if not isinstance(data, dict) or "spec" in data:
            return data
        renamed = {"taskset_arg": "taskset", "levels_arg": "levels", "window_arg": "window"}
        resolved = {"taskset", "levels", "window"}  # the plan's own, resolved, of those names
        data = dict(data)
        moved = [k for k in data if k in renamed or (k in SPEC and k not in resolved)]
        spec = {renamed.get(k, k): data.pop(k) for k in moved}
        spec.setdefault("low_fill", 0.0)
        return {**data, "spec": spec}

    @classmethod
    def load(cls, run_dir: Path) -> Plan:
        path = run_dir / PLAN_FILE
        if not path.exists():
            raise UserError(f"{run_dir}: not a run directory (no {PLAN_FILE})")
        try:
            return cls.model_validate_json(path.read_text())
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(document)"
            raise UserError(f"{path}: {where}: {err['msg']}") from exc

    def save(self, run_dir: Path) -> None:
        (run_dir / PLAN_FILE).write_text(self.model_dump_json(indent=2, exclude_none=True) + "\n")

    def repeats_at(self, batch: int) -> int:
        """How many times the items of the ``batch``-th batch are asked at each level."""
        if batch < len(self.batch_repeats):
            return self.batch_repeats[batch]
        return self.spec.repeats

    def repeats_at_level(self, level: float) -> int:
        """The most times an item is asked at ``level``: the refinement's and the dip scan's
        points and the grid levels asked few times are asked ``ADDED_REPEATS`` times (the
        design's rule), every other level as its items' batches say."""
        if level in self.at_added_repeats():
            return min(self.spec.repeats, ADDED_REPEATS)
        return self.spec.repeats

    def at_added_repeats(self) -> tuple[float, ...]:
        """The levels the design asks ``ADDED_REPEATS`` times: the refinement's points and
        probes, the dip scan's points, the grid levels asked few times."""
        return (*self.refined, *self.scanned, *self.probed, *self.few_repeats)

    def level_repeats(self) -> dict[float, int]:
        """The levels asked fewer times than their items' batches."""
        return {
            lv: r
            for lv in self.at_added_repeats()
            if (r := self.repeats_at_level(lv)) < self.spec.repeats
        }

    def item_repeats(self) -> dict[str, int]:
        """The items asked a number of times other than the spec's."""
        out: dict[str, int] = {}
        lo = 0
        for b, hi in enumerate(self.batches):
            r = self.repeats_at(b)
            if r != self.spec.repeats:
                out |= dict.fromkeys(self.item_ids[lo:hi], r)
            lo = hi
        return out

    @property
    def measured_levels(self) -> list[float]:
        """The levels measured so far: the planned ones less the deferred grid levels."""
        return [lv for lv in self.levels if lv not in self.grid_left]

    def items_at(self, level: float) -> int:
        """How many of the drawn items are measured at ``level``."""
        return int(self.n_at.get(level_key(level), len(self.item_ids)))

    @property
    def chain_reference(self) -> float:
        """The reference level: the lowest level in the decision chain (the low-fill control lies
        below it and is not in the chain)."""
        if self.reference is not None:
            return self.reference
        chain = [lv for lv in self.levels if lv != self.spec.low_fill] or self.levels
        return min(chain)


def level_key(level: float) -> str:
    """How a level is written as a JSON key (four decimals, like the call keys)."""
    return f"{level:.4f}"


def engine_root(base_url: str) -> str:
    """An OpenAI-style base URL without its ``/v1``: where llama.cpp serves /props and /tokenize."""
    u = base_url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def window_of(arg: str, base_url: str, model: str | None = None) -> int:
    """``--window``: a number of tokens, or ``auto``: a llama.cpp server's own (/props), else
    the model entry of a context-ceiling sidecar at ``base_url`` (its ``/budget`` answer: the
    window the sidecar computes utilization against), else the model's advertised window in the
    genai-prices data set the prices come from."""
    if arg != "auto":
        try:
            return int(arg)
        except ValueError as exc:
            raise UserError(f"--window must be a number of tokens or auto, not {arg!r}") from exc
    root = engine_root(base_url)
    try:
        props = httpx.get(root + "/props", timeout=10, trust_env=False).json()
        return int(props["default_generation_settings"]["n_ctx"])
    except (httpx.HTTPError, KeyError, ValueError, TypeError):
        pass
    if model:
        entry = _sidecar_window(root, model)
        if entry is not None:
            return entry
        known = known_window(model)
        if known is not None:
            return known
    raise UserError(
        "--window auto needs a llama.cpp server (/props), a context-ceiling sidecar with a "
        f"model entry for it (/budget), or a model the price data set lists with its window "
        f"({model!r} is none of these); pass --window N"
    )


def _sidecar_window(root: str, model: str) -> int | None:
    """The window of the sidecar's model entry for ``model`` (``GET /budget``); None when
    ``root`` is no sidecar, has no entry for it, or asks for a token."""
    try:
        got = httpx.get(root + "/budget", params={"model": model}, timeout=10, trust_env=False)
        body = got.json() if got.status_code == 200 else None
        window = body.get("window") if isinstance(body, dict) else None
    except (httpx.HTTPError, ValueError):
        return None
    ok = isinstance(window, int) and not isinstance(window, bool) and window > 0
    return window if ok else None


@dataclass(frozen=True)
class Material:
    """What a plan is finished against, measured once before the first call: the window, the
    levels in fill, the task set's items in their drawn order and its fingerprints, the counter,
    the prompt skeleton's and the mean document's tokens."""

    window: int
    levels: list[float]
    order: list[str]
    counter: str
    taskset: TaskSetRef
    system_tokens: int
    mean_doc_tokens: float


#: how many haystack groups the first n items of a plan make (the task set's documents decide)
GroupCount = Callable[[Plan, int], int]


def finished(
    plan: Plan, m: Material, start: Opening, planned: int, group_count: GroupCount
) -> Plan:
    """The plan ready for its first call, a new object (``plan`` is left as it is): the levels
    in fill, the opening's items (a resumed plan keeps its own, less any the task set no longer
    has), one batch, each level's and the control's item counts, the references to the
    endpoint, the task set and the counter, the reference level, the sample-size plan and the
    horizon the pass test's bets are tuned for."""
    known = set(m.order)
    ids = [i for i in plan.item_ids if i in known] if plan.item_ids else m.order[: start.start]
    n = len(ids)
    out = plan.model_copy(
        update={
            "levels": sorted(m.levels),
            "item_ids": ids,
            "batches": plan.batches or [n],
            "n_at": plan.n_at or {level_key(lv): n for lv in m.levels},
            "n_control": (n if plan.spec.control else 0)
            if plan.n_control is None
            else plan.n_control,
            "window": m.window,
            "counter": m.counter,
            "endpoint": EndpointRef(
                base_url=plan.spec.base_url, api=plan.spec.api, model=plan.spec.model
            ),
            "taskset": m.taskset,
            "system_tokens": m.system_tokens,
            "mean_doc_tokens": m.mean_doc_tokens,
            "planned_items": planned,
            "item_cap": start.target,
            "horizon": plan.horizon or start.horizon,
        },
        deep=True,
    )
    out.reference = out.chain_reference
    if not plan.item_ids and plan.adaptive and not plan.spec.items:  # a resumed plan keeps its own
        out.few_repeats = asked_few(out.levels, out.reference)
        out.grid_left = deferred(out.levels, out.reference)
        out.n_at = out.n_at | {level_key(lv): 0 for lv in out.grid_left}
    out.groups = group_count(out, n)
    return out


def opened_on(plan: Plan, n: int, group_count: GroupCount) -> Plan:
    """``plan`` opened on its first ``n`` items only (fixed-budget planning), a new object:
    one batch, every level's and the control's counts, and the pass test's bets tuned to ``n``."""
    out = plan.model_copy(
        update={
            "item_ids": plan.item_ids[:n],
            "batches": [n],
            "n_at": {k: min(v, n) for k, v in plan.n_at.items()},  # a deferred level: none
            "n_control": n if plan.spec.control else 0,
            "horizon": n,
        },
        deep=True,
    )
    out.groups = group_count(out, n)
    return out


def levels_for(spec: str, window: int, reservation: int, low_fill: float = 0.0) -> list[float]:
    """The planned levels; ``low_fill`` (a control below the reference) is added when it lies
    below the lowest level asked for."""
    limit = round(practical_limit(window, reservation + 16), 4)
    out = []
    for part in spec.split(","):
        part = part.strip()
        try:
            v = limit if part == "max" else float(part)
        except ValueError as exc:
            raise UserError(f"--levels: {part!r} is not a number or 'max'") from exc
        if not 0 < v <= limit:
            raise UserError(
                f"--levels: {v} is outside (0, {limit}] (the practical limit for this window)"
            )
        out.append(round(v, 4))
    if 0 < low_fill < min(out):
        out.append(round(low_fill, 4))
    return sorted(set(out))


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``--shard i/n``."""
    if spec is None:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError as exc:
        raise UserError(f"--shard must look like i/n (e.g. 0/4), not {spec!r}") from exc
    if not 0 <= i < n:
        raise UserError(f"--shard {spec}: need 0 <= i < n")
    return i, n


def item_order(items: list[Item], seed: int) -> list[Item]:
    """The seeded order items are drawn in: a larger run is a superset of a smaller one."""
    rng = random.Random(seed)
    return sorted(items, key=lambda _: rng.random())

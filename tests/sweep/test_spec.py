"""The sweep's spec is named once: the command's options carry the spec's names and defaults,
the plan stores it whole, the solver calls with it, and a plan written before the spec had a
model of its own still loads (a run started then can be resumed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from context_ceiling.sweep.plan import SPEC, Plan
from context_ceiling.sweep.run import RunOptions
from context_ceiling.sweep.solver import Endpoint
from context_ceiling.sweep.spec import Spec


def test_the_command_options_name_the_spec_as_the_spec_does() -> None:
    options = {f.name: f for f in dataclasses.fields(RunOptions)}
    for name, field in Spec.model_fields.items():
        assert name in options, f"RunOptions has no {name}"
        if name not in ("base_url", "model"):  # optional there: a --reduced run takes them
            assert options[name].default == field.default, name
    assert "no_control" not in options and "no_json_mode" not in options


def test_the_plan_stores_the_spec_and_the_solver_calls_with_it(tmp_path: Path) -> None:
    spec = Spec(base_url="http://m/v1", model="m", repeats=2, json_mode=False, max_tokens=64)
    plan = Plan(run_id="r", spec=spec, levels=[0.2, 0.5])
    plan.save(tmp_path)
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["spec"]["repeats"] == 2 and "repeats" not in saved
    assert Plan.load(tmp_path).spec == spec
    ep = Endpoint.for_spec(spec, api_key="k")
    assert (ep.base_url, ep.model, ep.max_tokens, ep.json_mode) == ("http://m/v1", "m", 64, False)


def test_a_plan_written_before_the_spec_had_a_model_still_loads(tmp_path: Path) -> None:
    old = {
        "run_id": "run-1",
        "base_url": "http://m/v1",
        "api": "openai",
        "model": "m",
        "taskset_arg": "records",
        "levels_arg": "0.2,0.7,max",
        "window_arg": "4096",
        "repeats": 1,
        "tolerance": 0.15,
        "control": False,
        "low_fill": 0.1,
        "window": 4096,
        "levels": [0.1, 0.2, 0.7, 0.95],
        "taskset": {"name": "records", "hash": "h", "corpus_hash": "c", "skeleton_hash": "s"},
        "item_ids": ["a", "b"],
    }
    (tmp_path / "plan.json").write_text(json.dumps(old))
    plan = Plan.load(tmp_path)
    assert plan.spec.taskset == "records" and plan.spec.levels == "0.2,0.7,max"
    assert plan.spec.window == "4096" and plan.window == 4096
    assert plan.levels == [0.1, 0.2, 0.7, 0.95] and plan.taskset is not None
    assert (plan.spec.repeats, plan.spec.tolerance, plan.spec.control) == (1, 0.15, False)
    assert set(SPEC) == set(Spec.model_fields)

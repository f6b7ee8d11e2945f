"""The sweep's spec is named once: the command's options carry the spec's names and defaults,
the plan stores it whole, the solver calls with it, and a plan written before the spec had a
model of its own still loads (a run started then can be resumed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from context_ceiling.cli import Parser, add_json, options
from context_ceiling.cli.sweep import add_run_arguments
from context_ceiling.sweep.plan import SPEC, Plan
from context_ceiling.sweep.run import RunOptions
from context_ceiling.sweep.solver import Endpoint
from context_ceiling.sweep.spec import Spec


def test_the_command_options_are_the_spec_generated() -> None:
    """``sweep run``'s options are generated from the options model: every spec field is an
    option with the spec's default and the field's docstring as its help; nothing else is."""
    parser = Parser(prog="t")
    add_run_arguments(parser)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(actions) == set(RunOptions.model_fields) - {"as_json"}
    for name, field in Spec.model_fields.items():
        action = actions[name]
        assert field.description and action.help == " ".join(field.description.split())
        if name not in ("base_url", "model"):  # optional there: a --reduced run takes them
            assert action.default == field.default, name
    assert actions["control"].option_strings == ["--no-control"]
    assert actions["json_mode"].option_strings == ["--no-json-mode"]
    assert actions["batch_poll_s"].option_strings == ["--batch-poll"]
    assert actions["reasoning"].choices == ["auto", "off", "openai", "anthropic"]


def test_parsed_options_are_typed_and_checked_by_the_spec() -> None:
    parser = Parser(prog="t")
    add_run_arguments(parser)
    add_json(parser)
    args = parser.parse_args(
        ["--model", "m", "--no-control", "--repeats", "2", "--no-refine", "--json"]
    )
    opts = options(RunOptions, args)
    assert (opts.model, opts.control, opts.repeats, opts.refine, opts.as_json) == (
        "m",
        False,
        2,
        False,
        True,
    )
    assert opts.adaptive is None and opts.tolerance == Spec.model_fields["tolerance"].default
    with pytest.raises(ValidationError, match="batch inference"):
        options(RunOptions, parser.parse_args(["--api", "bedrock", "--batch"]))


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

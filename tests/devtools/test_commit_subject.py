"""The commit-subject hook: the rule CONTRIBUTING.md states, and the pre-commit config that runs
it with the project's own tools."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devtools.commit_subject import main, problems

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "message",
    [
        "Add AWS Bedrock as one provider module\n\nThe body says why.\n",
        "Fix the relay's split of event-stream messages",
        "# a comment git strips\nMake the registry the provider layer\n",
        "Embed the price data set",
    ],
)
def test_good_subjects_pass(message: str) -> None:
    assert problems(message) == []


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("Added Bedrock", "imperative"),
        ("Adds Bedrock", "imperative"),
        ("Adding Bedrock", "imperative"),
        ("Add Bedrock.", "period"),
        ("Add " + "x" * 80, "at most 72"),
        ("Add Bedrock\nthe body at once", "blank line"),
        ("\n# only comments\n", "empty"),
    ],
)
def test_bad_subjects_are_named(message: str, says: str) -> None:
    assert any(says in p for p in problems(message))


def test_the_hook_exits_1_with_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "COMMIT_EDITMSG"
    f.write_text("Added things.\n")
    assert main([str(f)]) == 1
    assert "imperative" in capsys.readouterr().err
    f.write_text("Add things\n")
    assert main([str(f)]) == 0


def test_pre_commit_runs_the_project_s_checks() -> None:
    cfg = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for r in cfg["repos"] for h in r["hooks"]}
    assert {"ruff-check", "ruff-format", "mypy", "commit-subject"} <= set(hooks)
    assert hooks["commit-subject"]["stages"] == ["commit-msg"]
    assert all(h["language"] == "system" for h in hooks.values())  # nothing fetched

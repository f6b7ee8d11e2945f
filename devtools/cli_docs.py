"""Writes ``docs/reference/cli.md`` from the ``ceiling`` parsers, so the CLI reference cannot
drift from the commands: every command, its usage, and every option with its help and default.

Run ``python -m devtools.cli_docs``; a test fails when the committed page is stale.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from context_ceiling.cli import build_parser

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"


def _commands(
    parser: argparse.ArgumentParser, path: list[str], about: str
) -> Iterator[tuple[list[str], argparse.ArgumentParser, str]]:
    yield path, parser, about
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _commands(sub, [*path, name], helps.get(name, ""))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    d = action.default
    if action.nargs == 0:  # a flag: its name says what it does
        return ""
    if d is None or d is False or d == [] or d is argparse.SUPPRESS:
        return ""
    return f"`{d}`"


def render() -> str:
    """The page's Markdown."""
    out = [
        "# CLI reference",
        "",
        "Generated from the parsers by `python -m devtools.cli_docs`; `ceiling COMMAND --help`",
        "prints the same. Every command that prints a result takes `--json`: one JSON object on",
        "stdout, progress and notes on stderr. Exit status: 0 done, 1 a failure (a refused",
        "ceiling, a push a target rejected), 2 bad input (one line on stderr says what).",
        "",
    ]
    for path, parser, about in _commands(build_parser(), ["ceiling"], ""):
        level = "#" * min(len(path) + 1, 4)
        out += [f"{level} `{' '.join(path)}`", ""]
        if about:
            out += [about[0].upper() + about[1:] + ("" if about.endswith(".") else "."), ""]
        if parser.description and not (
            about and parser.description.lower().startswith(about.lower())
        ):
            out += [parser.description, ""]
        usage = parser.format_usage().removeprefix("usage: ").strip()
        out += ["```text", " ".join(usage.split()), "```", ""]
        rows = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
            choices = (
                " One of: " + ", ".join(f"`{c}`" for c in action.choices) + "."
                if action.choices and not isinstance(action, argparse._SubParsersAction)
                else ""
            )
            help_text = (action.help or "") % {"default": action.default, "prog": parser.prog}
            rows.append(f"| {names} | {_cell(help_text + choices)} | {_default(action)} |")
        if rows:
            out += ["| argument | what it does | default |", "|---|---|---|", *rows, ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()

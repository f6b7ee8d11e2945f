"""``ceiling completion``: a shell completion script, generated from the parser itself by
``shtab``, so it never falls behind the commands and options."""

from __future__ import annotations

import argparse
from typing import Any

import shtab

SHELLS = ("bash", "zsh", "tcsh")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for SHELL. Install it, e.g.: ceiling completion "
        "bash > /etc/bash_completion.d/ceiling, or for zsh into a directory on $fpath as _ceiling.",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=completion_command)


def completion_command(args: argparse.Namespace) -> int:
    from context_ceiling.cli import build_parser

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0

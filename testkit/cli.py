"""Run the ``ceiling`` command as a user would: a child process, its output captured.

``CEILING_ADMIN_TOKEN`` is taken out of the inherited environment so a test states the token
it means (or none), whatever the shell running the suite has set."""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["ceiling"]


def ceiling(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """``ceiling ARGS...`` with ``CEILING_ADMIN_TOKEN`` set to ``token`` (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != "CEILING_ADMIN_TOKEN"}
    if token:
        env["CEILING_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )

"""What the tests and the benchmarks share, in one place: the provider doubles (``doubles``:
stand-ins for what cannot run here, each named as a double), generated traffic and canned
documents (``traffic``), the raw-ASGI pieces of the doubles (``asgi``), free loopback ports and
servers on them (``serving``), and the ``ceiling`` command as a child process (``cli``).

It is not part of the installed package; both ``pytest`` (``pythonpath``) and
``python -m benchmarks.<name>`` from the repository root import it as ``testkit``."""

import time
from collections.abc import Callable
from pathlib import Path

#: the repository's root (the tests and the benchmarks read its docs, charts and generated files)
REPO = Path(__file__).resolve().parents[1]

__all__ = ["REPO", "wait_for"]


def wait_for(pred: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll ``pred`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()

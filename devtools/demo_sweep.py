"""The demo's sweep on the embedded defaults, shared by ``make demo`` and the test that keeps it
true (``tests/sweep/test_real_model.py``: derive must accept it without ``--force``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEMO", "DemoSweep"]


@dataclass(frozen=True)
class DemoSweep:
    """The demo's sweep on the embedded defaults (a 0.5B model on two cores, ``records``).

    Chosen so that the product's own rule accepts the result: at 66 items and one repeat the
    pass test's margin of error is near a 15-point tolerance for this model (the rule that plans
    for a level with no drop to pass 80% of the time, ``items_for(0.15, 1)``, asks for more), the
    levels put the reference where this model reads the task well (~1,000 tokens) and go to the
    practical limit, and the whole demo stays within about 15 minutes on two cores. A production
    sweep holds a 5-point tolerance (``--dry-run`` prices it).

    The items fill whole haystack groups: at the 25% reference a shared haystack holds 22 of
    these items' records, so 66 items make three groups, and each group costs one uncached
    prefill per level (most of the sweep's time on a CPU); a 67th item would add a fourth."""

    taskset: str = "records"
    window: int = 4096
    levels: str = "0.25,0.45,0.7,0.95"
    items: int = 66
    repeats: int = 1
    tolerance: float = 0.15
    max_tokens: int = 16
    #: held-out requests replayed above the ceiling, and their size as a share of the window
    replay: int = 10
    replay_fill: float = 0.8

    def sweep_args(self, base_url: str, model: str, window: int, out: Path) -> list[str]:
        """``ceiling sweep run`` arguments (add ``--bypass`` through a sidecar)."""
        return [
            "sweep",
            "run",
            "--base-url",
            base_url,
            "--model",
            model,
            "--taskset",
            self.taskset,
            "--items",
            str(self.items),
            "--max-tokens",
            str(self.max_tokens),
            "--levels",
            self.levels,
            "--repeats",
            str(self.repeats),
            "--tolerance",
            str(self.tolerance),
            "--shared-haystack",
            "--no-json-mode",  # the skeleton asks for the code alone
            "--price",
            "0",  # a local model: no dollars per token
            "--window",
            str(window),
            # the demo's budget: its levels, no low-fill control, no refinement or added items
            "--low-fill",
            "0",
            "--no-refine",
            "--no-adaptive",
            "--out",
            str(out),
        ]


DEMO = DemoSweep()

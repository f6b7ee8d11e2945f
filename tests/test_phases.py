"""The per-phase profile (``benchmarks/phases.py``) runs in process and attributes a proxy's own
CPU to its phases: every target answers, the shares cover the whole, and the sidecar's counting
shows up where the bare pass-through has none. No speed is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.phases import ORDER, main, phase_of


def test_functions_fall_into_their_phase() -> None:
    assert phase_of("/x/context_ceiling/core/counting.py:text") == "count"
    assert phase_of("~:<method 'encode_ordinary' of 'riptoken._riptoken.CoreBPE' objects>") == (
        "count"
    )
    assert phase_of("/x/site-packages/prometheus_client/metrics.py:observe") == "metrics"
    assert phase_of("/x/site-packages/opentelemetry/sdk/trace/__init__.py:start_span") == (
        "tracing"
    )
    assert phase_of("/x/context_ceiling/sidecar/proxy.py:handle") == "request path"
    assert phase_of("/x/benchmarks/upstream_double.py:app") == "harness"
    assert phase_of("~:<method 'encode' of 'str' objects>") == "other"


def test_the_profile_attributes_each_proxys_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "phases.json"
    assert (
        main(
            [
                "--sizes",
                "1000",
                "--requests",
                "20",
                "--warmup",
                "5",
                "--rounds",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    cpu = result["cpu_ms"]["1000"]
    assert set(cpu) == {"direct", "bare", "sidecar", "bounded"}
    phases = result["phases"]["1000"]
    assert set(phases) == {"bare", "sidecar", "bounded"}
    for shares in phases.values():
        assert set(shares) == set(ORDER)
    # the default config counts every request; the bare pass-through counts nothing
    assert phases["sidecar"]["count"] > 0 and phases["bare"]["count"] == 0
    table = capsys.readouterr().out
    assert "| count |" in table and "vs bare pass-through" in table


def test_a_baseline_named_as_a_target_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """``bare`` and ``direct`` are the baselines every run measures: naming one as a sidecar
    config would profile a sidecar under the baseline's name and compare it with itself."""
    with pytest.raises(SystemExit) as exc:
        main(["--targets", "bare,bounded"])
    assert exc.value.code == 2
    assert "--targets takes sidecar configs (sidecar, bounded), not bare" in capsys.readouterr().err

"""``epp bench together``: what it refuses before anything starts, and the line it prints per
target. The run itself needs Envoy and the fleet; ``epp bench`` covers starting targets."""

from __future__ import annotations

import math

import pytest

from epp_tools.bench.cli import main as bench_main
from epp_tools.bench.runner import together
from epp_tools.bench.runner.driver import Outcome


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--targets", "epp"], id="one-target"),
        pytest.param(["--targets", "epp,epp"], id="same-target-twice"),
        pytest.param(["--targets", "epp,nginx"], id="unknown-target"),
        pytest.param(["--burners", "-1"], id="negative-burners"),
        pytest.param(["--probe", "0"], id="no-probe"),
    ],
)
def test_together_refuses_what_cannot_compare_when_parsing(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["together", *argv])
    assert exc.value.code == 2
    assert "epp bench together" in capsys.readouterr().err


def test_percentile_is_nearest_rank_in_ms_over_finite_values_when_computed() -> None:
    assert together.percentile([0.001, 0.002, math.nan, 0.003, 0.004], 0.5) == 3.0
    assert together.percentile([0.010], 0.9) == 10.0
    assert math.isnan(together.percentile([math.nan], 0.5))


def test_line_counts_only_answered_requests_when_summarised() -> None:
    outcomes = [
        Outcome(0, "s", "", 200, ttft=0.020, tokens=3, latency=0.05),
        Outcome(1, "s", "", 200, ttft=0.040, tokens=3, latency=0.05),
        Outcome(2, "s", "", 500, error="HTTP 500"),
    ]
    probe = {"fresh": [0.003, 0.005, 0.004], "reused": [0.002]}
    text = together.line("epp-buffered", outcomes, probe, {"epp": 0.010, "envoy": 0.004})
    assert text.startswith("epp-buffered: 2/3 ok, TTFT p50 40.0 p90 40.0")
    assert "probe fresh 4.0 reused 2.0" in text
    assert text.endswith("CPU ms/req envoy 2.00 · epp 5.00")

"""``epp bench chaos`` bookkeeping: when a request went to a pod discovery had dropped, and the
report table."""

from __future__ import annotations

import pytest

from epp_tools.bench.chaos.pod_scenarios import _lag
from epp_tools.bench.chaos.report import Row, render

TIMELINE = [
    (0.0, frozenset({"a", "b"})),
    (1.0, frozenset({"a"})),
    (2.0, frozenset({"a"})),
    (3.0, frozenset({"a", "b"})),
]


@pytest.mark.parametrize(
    ("pod", "sent", "lag"),
    [
        pytest.param("b", 0.5, 0.0, id="member"),
        pytest.param("b", 1.2, 0.2, id="just-dropped"),
        pytest.param("b", 2.5, 1.5, id="dropped-since-the-first-change"),
        pytest.param("b", 3.1, 0.0, id="back"),
        pytest.param("c", 0.5, 0.5, id="never-listed"),
    ],
)
def test_lag_counts_from_when_the_pod_left_the_file(pod: str, sent: float, lag: float) -> None:
    assert _lag(TIMELINE, pod, sent) == pytest.approx(lag)


def test_report_marks_a_scenario_whose_outcome_was_not_the_expected_one() -> None:
    good = Row("pod-kill", "kill", "few failures", requests=100, failed=2, attributed=2, ok=True)
    bad = Row("churn", "churn", "0 failures", requests=50, failed=1, stop_routing_ms=12.0)
    text = render([good, bad])
    assert "| pod-kill | kill | few failures | 100 | 2 | 2 | 0 | - | - | as expected |" in text
    assert "| churn | churn | 0 failures | 50 | 1 | 0 | 1 | 12 | - | NOT as expected |" in text

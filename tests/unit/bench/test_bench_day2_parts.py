"""``epp bench day2`` bookkeeping: outcomes split at the event, the TTFT it added, the report's
row, and the arguments it refuses."""

from __future__ import annotations

import math

import pytest

from epp_tools.bench.day2.cli import main
from epp_tools.bench.day2.report import Row, render
from epp_tools.bench.day2.rig import Phases, pod_host
from epp_tools.bench.runner.driver import Outcome


def _o(sent: float, *, ttft: float = 0.1, ok: bool = True, cached: int = 50) -> Outcome:
    return Outcome(
        index=0, session="s", objective="", status=200 if ok else 500, sent=sent, ttft=ttft,
        latency=0.5, tokens=4 if ok else 0, prompt_tokens=100, cached_tokens=cached,
    )  # fmt: skip


def test_phases_split_at_the_event_and_measure_what_it_added() -> None:
    outcomes = [_o(3.0, cached=90), _o(4.0, cached=90), _o(10.0, ttft=0.3, cached=40),
                _o(11.0, ok=False), _o(20.0, cached=80)]  # fmt: skip
    phases = Phases(outcomes, t0=9.0, t1=12.0)
    assert [o.sent for o in phases.during] == [10.0, 11.0]
    assert phases.hits() == (0.9, 0.4, 0.8)
    p50, _ = phases.added_ttft_ms()
    assert math.isclose(p50, 200.0)
    row = Row("x", "an event", "0 failed")
    row.measure(outcomes, phases)
    assert (row.requests, row.failed) == (5, 1)
    text = render([row])
    assert "| x | an event | 5 | 1 | 90.0% / 40.0% / 80.0% | 200 /" in text
    assert "NOT met" in text and "x failures: 1 x 500" in text


def test_replacement_pods_get_addresses_of_their_own() -> None:
    assert [pod_host(i) for i in range(6)] == [
        "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.10", "127.0.0.11",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args", [["--scenarios", "nope"], ["--lease", "0"], ["--rolled", "5"], ["--clients", "0"]]
)
def test_arguments_that_cannot_work_are_refused(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2

"""The process counters ``epp_tools.bench.micro.idle`` reads, on this test's own process."""

from __future__ import annotations

import os

from epp_tools.bench.micro.idle import IdleCost, _user_system, context_switches, run_seconds


def test_counters_of_a_running_process_are_read() -> None:
    pid = os.getpid()
    before = run_seconds(pid)
    assert before > 0
    # The kernel folds a running thread's time into schedstat at its next tick or switch, so
    # one short burst may not show yet: burn in steps until it does (bounded: 100 steps).
    for _ in range(100):
        sum(range(200_000))
        if run_seconds(pid) > before:
            break
    assert run_seconds(pid) > before
    assert context_switches(pid) >= 0
    user, system = _user_system(pid)
    assert user > 0 and system >= 0


def test_cpu_per_scrape_is_the_share_over_the_rate() -> None:
    cost = IdleCost(pods=4, share=0.016, scrapes_per_s=80.0)
    assert cost.expected_per_s == 80.0
    assert round(cost.us_per_scrape) == 200
    assert IdleCost(pods=4, share=0.01, scrapes_per_s=0.0).us_per_scrape == 0.0

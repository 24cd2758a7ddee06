"""The supervisor's restart policy and group readiness."""

from __future__ import annotations

import pytest

from epp.workers.policy import GroupHealth, RestartPolicy


def test_restart_delay_doubles_per_crash_up_to_the_cap() -> None:
    policy = RestartPolicy(max_crashes=10, window=100.0, first_delay=0.5, max_delay=3.0)
    assert [policy.on_crash(t) for t in (1.0, 2.0, 3.0, 4.0, 5.0)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_gives_up_when_max_crashes_fall_within_the_window() -> None:
    policy = RestartPolicy(max_crashes=3, window=10.0, first_delay=0.1)
    assert policy.on_crash(0.0) is not None
    assert policy.on_crash(1.0) is not None
    assert policy.on_crash(2.0) is None
    assert policy.recent_crashes() == 3


def test_crashes_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy(max_crashes=3, window=10.0, first_delay=0.5)
    policy.on_crash(0.0)
    policy.on_crash(5.0)
    # 0.0 is out of the window at 12.0: two crashes within it, not three; the delay shrinks too.
    assert policy.on_crash(12.0) == 1.0
    assert policy.recent_crashes() == 2


def test_a_worker_that_stays_up_starts_again_from_the_first_delay() -> None:
    policy = RestartPolicy(max_crashes=5, window=60.0, first_delay=0.5)
    for t in (0.0, 1.0, 2.0):
        policy.on_crash(t)
    assert policy.on_crash(1000.0) == 0.5


@pytest.mark.parametrize(
    "kwargs", [{"max_crashes": 0}, {"window": 0.0}], ids=["no-crashes", "no-window"]
)
def test_policy_refuses_meaningless_bounds(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RestartPolicy"):
        RestartPolicy(**kwargs)


def test_group_is_ready_only_when_every_worker_is_until_warm() -> None:
    group = GroupHealth(3)
    assert not group.ready()
    group.set(0, True)
    group.set(1, True)
    assert not group.ready() and not group.warm
    group.set(2, True)
    assert group.ready() and group.warm


def test_once_warm_the_group_is_ready_while_any_worker_is() -> None:
    group = GroupHealth(2)
    group.set(0, True)
    group.set(1, True)
    group.set(0, False)  # worker 0 crashed and restarts
    assert group.ready()
    group.set(1, False)
    assert not group.ready()
    group.set(0, True)
    assert group.ready()


def test_a_draining_group_is_never_ready() -> None:
    group = GroupHealth(1)
    group.set(0, True)
    group.drain()
    assert not group.ready()
    group.set(0, True)
    assert not group.ready()


def test_group_health_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="size >= 1"):
        GroupHealth(0)

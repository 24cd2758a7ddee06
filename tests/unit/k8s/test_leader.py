"""Lease election logic over an in-memory lease store with a fake clock."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from epp.k8s.leader import ElectionConfig, LeaderElector, lease_name, micro_time
from tests.unit.k8s.fakes import Clock, MemoryLeases

NAME = lease_name("ns", "pool")
WALL = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def elector(leases: MemoryLeases, identity: str, clock: Clock) -> LeaderElector:
    config = ElectionConfig(
        NAME, "ns", identity, lease_duration=15, renew_deadline=10, retry_period=2
    )
    # wall time moves with the monotonic clock, from WALL at clock 100
    return LeaderElector(
        leases,
        config,
        clock=clock,
        wall=lambda: WALL + datetime.timedelta(seconds=clock.now - 100),
    )


def test_lease_name_and_time_format_match_upstream_when_built() -> None:
    assert NAME == "epp-ns-pool.llm-d.ai"
    assert micro_time(WALL) == "2026-01-02T03:04:05.000000Z"


def test_first_replica_creates_the_lease_when_none_exists() -> None:
    leases, clock = MemoryLeases(), Clock()
    a = elector(leases, "a", clock)
    assert a.try_acquire_or_renew() is True
    assert leases.spec(NAME) == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-02T03:04:05.000000Z",
        "renewTime": "2026-01-02T03:04:05.000000Z",
        "leaseTransitions": 0,
    }


def test_follower_takes_over_only_when_the_lease_expired() -> None:
    leases, clock = MemoryLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b observes a's record now
    clock.advance(14.9)
    assert not b.try_acquire_or_renew()  # not yet expired on b's clock
    clock.advance(0.2)
    assert b.try_acquire_or_renew()
    spec = leases.spec(NAME)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)


def test_expiry_counts_from_the_last_observed_change_when_the_leader_renews() -> None:
    leases, clock = MemoryLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    for _ in range(10):  # a renews every 2s; b keeps seeing a changing record
        clock.advance(2)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()


def test_released_lease_is_taken_at_once_when_the_leader_resigns() -> None:
    leases, clock = MemoryLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a._round()
    assert a.is_leader()
    b.try_acquire_or_renew()
    assert a.release() is True
    assert not a.is_leader()
    assert leases.spec(NAME)["holderIdentity"] == ""
    assert leases.spec(NAME)["leaseDurationSeconds"] == 1
    assert b.try_acquire_or_renew()
    assert leases.spec(NAME)["holderIdentity"] == "b"


def test_leader_steps_down_when_it_cannot_renew_within_the_deadline() -> None:
    leases, clock = MemoryLeases(), Clock()
    a = elector(leases, "a", clock)
    a._round()
    assert a.is_leader()
    leases.fail_next = RuntimeError("connection refused")
    clock.advance(2)
    a._round()
    assert a.is_leader()  # one missed renewal is tolerated
    clock.advance(8.1)
    assert not a.is_leader()  # past the renew deadline even before the next round
    leases.fail_next = RuntimeError("connection refused")
    a._round()
    assert not a.is_leader()


def test_racing_write_loses_when_the_lease_changed_since_it_was_read() -> None:
    leases, clock = MemoryLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.try_acquire_or_renew()
    clock.advance(16)  # expired for both
    original_get = leases.get

    def get_then_a_writes(name: str) -> dict[str, Any] | None:
        seen = original_get(name)
        leases._store(name, original_get(name) or {})  # a writes between b's read and write
        return seen

    leases.get = get_then_a_writes  # type: ignore[method-assign]
    assert b.try_acquire_or_renew() is False
    assert leases.spec(NAME)["holderIdentity"] == "a"


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [
        pytest.param(10, 10, 2, id="renew-equals-lease"),
        pytest.param(15, 10, 10, id="retry-equals-renew"),
        pytest.param(15, 10, 0, id="zero-retry"),
    ],
)
def test_config_is_rejected_when_the_timings_are_inconsistent(
    lease: float, renew: float, retry: float
) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        ElectionConfig(NAME, "ns", "a", lease, renew, retry)

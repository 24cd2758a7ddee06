from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from epp.datalayer.store import Datastore
from epp.plugin import Endpoint, Metrics
from tests.builders import make_endpoint


class _Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _bare(i: int, **changes: Any) -> Endpoint:
    return dataclasses.replace(make_endpoint(i), metrics=None, **changes)


def test_snapshot_returns_same_tuple_when_nothing_changed() -> None:
    store = Datastore(_Clock())
    store.set_endpoints([_bare(0), _bare(1)])
    first = store.snapshot()
    assert store.snapshot() is first
    assert [e.id for e in first] == ["default/pod-0-rank-0", "default/pod-1-rank-0"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.set_endpoints([_bare(0)]), id="set-replaced"),
        pytest.param(lambda s: s.update_metrics("default/pod-0-rank-0", Metrics()), id="metrics"),
    ],
)
def test_snapshot_is_rebuilt_when_store_changed(change: Callable[[Datastore], None]) -> None:
    store = Datastore(_Clock())
    store.set_endpoints([_bare(0), _bare(1)])
    first, version = store.snapshot(), store.version
    change(store)
    assert store.snapshot() is not first
    assert store.version == version + 1


def test_set_endpoints_is_a_no_op_when_set_is_identical() -> None:
    store = Datastore(_Clock())
    store.set_endpoints([_bare(0)])
    first, version = store.snapshot(), store.version
    store.set_endpoints([_bare(0)])
    assert (store.snapshot() is first, store.version) == (True, version)


def test_set_endpoints_keeps_metrics_when_id_persists() -> None:
    store = Datastore(_Clock())
    store.set_endpoints([_bare(0), _bare(1)])
    metrics = Metrics(waiting_queue_size=5, update_time=99.0)
    store.update_metrics("default/pod-0-rank-0", metrics)
    store.set_endpoints([_bare(0, labels={"new": "label"}), _bare(2)])
    kept = store.get("default/pod-0-rank-0")
    assert kept is not None
    assert (kept.metrics, kept.labels) == (metrics, {"new": "label"})
    assert store.get("default/pod-1-rank-0") is None
    added = store.get("default/pod-2-rank-0")
    assert added is not None and added.metrics is None


def test_update_metrics_is_ignored_when_endpoint_vanished() -> None:
    store = Datastore(_Clock())
    store.set_endpoints([_bare(0)])
    version = store.version
    assert store.update_metrics("default/gone-rank-0", Metrics(waiting_queue_size=1)) is False
    assert store.version == version
    assert len(store) == 1


def test_update_metrics_replaces_endpoint_object_when_metrics_change() -> None:
    store = Datastore(_Clock())
    store.set_endpoints([_bare(0)])
    before = store.snapshot()[0]
    store.update_metrics(before.id, Metrics(running_requests_size=3))
    after = store.snapshot()[0]
    assert before.metrics is None
    assert after.metrics == Metrics(running_requests_size=3)


def test_listener_receives_new_ids_when_id_set_changes() -> None:
    store = Datastore(_Clock())
    seen: list[frozenset[str]] = []
    store.add_listener(seen.append)
    store.set_endpoints([_bare(0)])
    store.set_endpoints([_bare(0, address="10.9.9.9")])  # same ids: no notification
    store.update_metrics("default/pod-0-rank-0", Metrics())
    store.set_endpoints([])
    store.remove_listener(seen.append)
    store.set_endpoints([_bare(3)])
    assert seen == [frozenset({"default/pod-0-rank-0"}), frozenset()]


def test_fresh_count_counts_recent_scrapes_when_clock_advances() -> None:
    clock = _Clock(100.0)
    store = Datastore(clock)
    store.set_endpoints([_bare(0), _bare(1), _bare(2)])
    store.update_metrics("default/pod-0-rank-0", Metrics(update_time=99.5))
    store.update_metrics("default/pod-1-rank-0", Metrics(update_time=97.0))
    store.update_metrics("default/pod-2-rank-0", Metrics())
    assert store.fresh_count(2.0) == 1
    clock.now = 98.0
    assert store.fresh_count(2.0) == 2


def test_routable_leaves_out_down_endpoints_until_they_are_up_again() -> None:
    store = Datastore(lambda: 0.0)
    a, b = make_endpoint(0), make_endpoint(1)
    store.set_endpoints([a, b])
    store.mark_down(b.id)
    assert [e.id for e in store.routable()] == [a.id]
    assert store.routable() is store.routable()
    store.mark_up(b.id)
    assert [e.id for e in store.routable()] == [a.id, b.id]


def test_routable_is_everything_when_every_endpoint_is_down() -> None:
    store = Datastore(lambda: 0.0)
    a, b = make_endpoint(0), make_endpoint(1)
    store.set_endpoints([a, b])
    store.mark_down(a.id)
    store.mark_down(b.id)
    assert [e.id for e in store.routable()] == [a.id, b.id]


def test_down_mark_is_forgotten_when_the_endpoint_leaves_and_unknown_ids_are_ignored() -> None:
    store = Datastore(lambda: 0.0)
    a, b = make_endpoint(0), make_endpoint(1)
    store.set_endpoints([a, b])
    store.mark_down(b.id)
    store.mark_down("default/nobody")
    store.set_endpoints([a])
    store.set_endpoints([a, b])
    assert store.down == frozenset()
    assert [e.id for e in store.routable()] == [a.id, b.id]

"""``sheddable-eviction-filter`` and ``priority-then-time-eviction-order-policy``: upstream's
in-flight eviction policies, checked alone and by the contract kit."""

from __future__ import annotations

from epp.plugin import NoParams, Stability
from epp.plugin.flow import EvictionFilterPolicy, EvictionItem, EvictionOrderingPolicy
from epp.plugin.testing import (
    check_eviction_filter_policy,
    check_eviction_ordering_policy,
    sample_eviction_items,
)
from epp.plugins.flow.eviction import PriorityThenTimeEvictionOrderPolicy
from filters.sheddable_eviction import SheddableEvictionFilter
from tests.builders import handle, make_request


def _item(rid: str, priority: int, at: float, seq: int) -> EvictionItem:
    return EvictionItem(make_request(request_id=rid), priority, "f", at, seq)


def test_only_sheddable_requests_are_evictable() -> None:
    policy = SheddableEvictionFilter(name="", params=NoParams(), handle=handle())
    assert isinstance(policy, EvictionFilterPolicy)
    assert [policy.evictable(_item("r", p, 1.0, 0)) for p in (-5, -1, 0, 3)] == [
        True,
        True,
        False,
        False,
    ]
    check_eviction_filter_policy(policy, sample_eviction_items(12))


def test_lowest_priority_then_newest_dispatch_goes_first() -> None:
    policy = PriorityThenTimeEvictionOrderPolicy(name="", params=NoParams(), handle=handle())
    assert isinstance(policy, EvictionOrderingPolicy)
    items = [
        _item("old-low", -3, 1.0, 0),
        _item("new-low", -3, 2.0, 1),
        _item("newest-mid", -1, 3.0, 2),
        _item("tie-later-arrival", -3, 2.0, 3),
    ]
    ranked = sorted(items, key=policy.eviction_key)
    assert [i.request.request_id for i in ranked] == [
        "tie-later-arrival",
        "new-low",
        "old-low",
        "newest-mid",
    ]
    check_eviction_ordering_policy(policy, sample_eviction_items(12))


def test_both_are_alpha_like_upstream() -> None:
    assert SheddableEvictionFilter.STABILITY is Stability.ALPHA
    assert PriorityThenTimeEvictionOrderPolicy.STABILITY is Stability.ALPHA

"""Revision shares (upstream's README examples and its planner's rollout steps), the dominant
role, the weighted draw, and pod counting from endpoint events (ranks count once)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from epp.plugins.screeners.revisions import (
    MAX_ROLE,
    SUM,
    PodRevisions,
    distribution,
    dominant_role,
    pick_revision,
    pod_key,
)
from tests.builders import make_endpoint

ROLES = ("prefill", "decode")
# 2P:10D mid-rollout: prefill A=2, B=1; decode A=9, B=1
MIXED = {"A": {"prefill": 2, "decode": 9}, "B": {"prefill": 1, "decode": 1}}


def test_sum_weighs_a_revision_by_its_pods_over_the_required_roles() -> None:
    shares = distribution(MIXED, ROLES, SUM).shares
    assert shares == pytest.approx({"A": 11 / 13, "B": 2 / 13})


def test_max_role_weighs_every_revision_by_the_globally_largest_role() -> None:
    shares = distribution(MIXED, ROLES, MAX_ROLE).shares
    assert shares == pytest.approx({"A": 0.9, "B": 0.1})


@pytest.mark.parametrize(
    ("old", "new", "old_share"),
    [  # the planner's steps 4, 6 and 8 of a 2P:10D rollout with maxUnavailable 2
        ({"decode": 6, "prefill": 1}, {"decode": 4, "prefill": 1}, 0.6),
        ({"decode": 4, "prefill": 1}, {"decode": 6, "prefill": 1}, 0.4),
        ({"decode": 2, "prefill": 1}, {"decode": 8, "prefill": 1}, 0.2),
    ],
)
def test_max_role_follows_a_rollout(
    old: dict[str, int], new: dict[str, int], old_share: float
) -> None:
    shares = distribution({"old": old, "new": new}, ROLES, MAX_ROLE).shares
    assert shares == pytest.approx({"old": old_share, "new": 1 - old_share})


def test_a_revision_missing_a_required_role_gets_no_share() -> None:
    counts = {"old": {"decode": 8, "prefill": 2}, "new": {"decode": 2}}  # step 2: no new prefill
    for mode in (SUM, MAX_ROLE):
        assert distribution(counts, ROLES, mode).shares == {"old": 1.0}
    assert distribution({"new": {"decode": 2}}, ROLES, SUM).shares == {}
    assert distribution({}, ROLES, MAX_ROLE).shares == {}


def test_roles_not_required_neither_cover_nor_weigh() -> None:
    counts = {"A": {"decode": 1, "prefill": 1, "encode": 50}, "B": {"decode": 1, "prefill": 1}}
    assert distribution(counts, ROLES, SUM).shares == {"A": 0.5, "B": 0.5}


def test_the_first_listed_role_wins_a_tie() -> None:
    covered = {"A": {"prefill": 2, "decode": 1}, "B": {"prefill": 1, "decode": 2}}
    assert dominant_role(covered, ("prefill", "decode")) == "prefill"
    assert dominant_role(covered, ("decode", "prefill")) == "decode"


def test_the_draw_lands_in_proportion_to_the_shares() -> None:
    shares = {"B": 0.25, "A": 0.75}
    assert pick_revision(shares, 0.0) == "A"  # sorted: A covers [0, 0.75)
    assert pick_revision(shares, 0.7499) == "A"
    assert pick_revision(shares, 0.75) == "B"
    assert pick_revision(shares, 0.9999) == "B"
    assert pick_revision({}, 0.5) == ""
    rng = random.Random(3)
    drawn = Counter(pick_revision(shares, rng.random()) for _ in range(4000))
    assert 0.72 < drawn["A"] / 4000 < 0.78


def test_pods_are_counted_once_whatever_their_ranks() -> None:
    pods = PodRevisions()
    assert pods.put("ns/p0-rank-0", "ns/p0", "A", "decode")
    assert not pods.put("ns/p0-rank-1", "ns/p0", "A", "decode")  # another rank of the same pod
    assert not pods.put("ns/p0-rank-1", "ns/p0", "A", "decode")  # the same event again
    assert pods.put("ns/p1-rank-0", "ns/p1", "A", "prefill")
    assert pods.role_counts() == {"A": {"decode": 1, "prefill": 1}}
    assert not pods.remove("ns/p0-rank-0")  # rank 1 keeps the pod
    assert pods.remove("ns/p0-rank-1")
    assert pods.role_counts() == {"A": {"prefill": 1}}
    assert not pods.remove("ns/unknown")


def test_a_pod_that_changes_revision_moves() -> None:
    pods = PodRevisions()
    pods.put("ns/p0", "ns/p0", "A", "decode")
    assert pods.put("ns/p0", "ns/p0", "B", "decode")
    assert pods.role_counts() == {"B": {"decode": 1}}


def test_the_pod_of_an_endpoint_drops_the_rank_suffix() -> None:
    ep = make_endpoint(0)
    assert pod_key(ep) == "default/pod-0"
    assert pod_key(dataclasses.replace(ep, name="vllm-3-rank-2")) == "default/vllm-3"

"""Revision accounting for ``disaggregatedset-rollout-screener``: which revisions can serve, and
what share of the traffic each gets.

``PodRevisions`` counts the pods in scope per revision and role, from endpoint events. A pod is
counted once whatever the number of its endpoints (data-parallel ranks): its key is the
endpoint's namespace and name without the ``-rank-<n>`` suffix Kubernetes discovery adds.

``distribution`` turns the counts into shares. A revision is *covered* when every required role
has at least one pod in it; only covered revisions get a share, so a revision missing a role
never receives a request (it would pair a prefill and a decode pod of different revisions, or
none at all). The weights of the covered revisions:

* ``sum``: ``weight(r) = sum over the required roles of pods(r, role)``;
* ``max-role``: the *dominant* role is the required role with the most pods over all covered
  revisions (ties: the earlier in ``requireRoles.values``), and ``weight(r) = pods(r, dominant)``;

and ``share(r) = weight(r) / sum of the weights``. With prefill ``A=2, B=1`` and decode
``A=9, B=1``: ``sum`` gives A 11/13, B 2/13; ``max-role`` (decode dominates, 10 against 3) gives
A 0.9, B 0.1.

``pick_revision`` draws one revision with probability proportional to its share (revisions in
sorted order, so one random draw always picks the same revision).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from epp.plugin import Endpoint

SUM: Final = "sum"
MAX_ROLE: Final = "max-role"
DISABLED: Final = "disabled"
_RANK_SUFFIX: Final = re.compile(r"-rank-\d+$")

RoleCounts = Mapping[str, Mapping[str, int]]
"""revision → role → pods."""


def pod_key(endpoint: Endpoint) -> str:
    """The pod an endpoint belongs to: ``<namespace>/<name>`` without a ``-rank-<n>`` suffix."""
    return f"{endpoint.namespace}/{_RANK_SUFFIX.sub('', endpoint.name)}"


class PodRevisions:
    """Pods in scope, counted per revision and role; each endpoint id remembers its pod."""

    def __init__(self) -> None:
        self._endpoints: dict[str, tuple[str, str, str]] = {}
        """endpoint id → (pod, revision, role)."""
        self._members: Counter[tuple[str, str, str]] = Counter()
        """(pod, revision, role) → endpoints of that pod in that revision and role."""
        self._counts: dict[str, Counter[str]] = {}

    def put(self, endpoint_id: str, pod: str, revision: str, role: str) -> bool:
        """Record (or move) an endpoint; whether the pod counts changed."""
        entry = (pod, revision, role)
        if self._endpoints.get(endpoint_id) == entry:
            return False
        changed = self.remove(endpoint_id)
        self._endpoints[endpoint_id] = entry
        self._members[entry] += 1
        if self._members[entry] == 1:
            self._counts.setdefault(revision, Counter())[role] += 1
            changed = True
        return changed

    def remove(self, endpoint_id: str) -> bool:
        """Forget an endpoint; whether the pod counts changed."""
        entry = self._endpoints.pop(endpoint_id, None)
        if entry is None:
            return False
        self._members[entry] -= 1
        if self._members[entry]:
            return False
        del self._members[entry]
        _, revision, role = entry
        roles = self._counts[revision]
        roles[role] -= 1
        if not roles[role]:
            del roles[role]
        if not roles:
            del self._counts[revision]
        return True

    def role_counts(self) -> dict[str, dict[str, int]]:
        return {revision: dict(roles) for revision, roles in self._counts.items()}


@dataclass(frozen=True, slots=True)
class Distribution:
    role_counts: RoleCounts = field(default_factory=dict)
    shares: Mapping[str, float] = field(default_factory=dict)
    """Covered revisions only, each in (0, 1]; they sum to 1."""


def distribution(counts: RoleCounts, required: Sequence[str], mode: str) -> Distribution:
    """The shares of the covered revisions under ``mode`` (``sum`` or ``max-role``)."""
    covered = {
        revision: roles
        for revision, roles in counts.items()
        if all(roles.get(role, 0) > 0 for role in required)
    }
    if mode == MAX_ROLE:
        dominant = dominant_role(covered, required)
        weights = {revision: roles.get(dominant, 0) for revision, roles in covered.items()}
    else:
        weights = {r: sum(roles.get(role, 0) for role in required) for r, roles in covered.items()}
    total = sum(weights.values())
    shares = {r: w / total for r, w in weights.items() if w > 0} if total > 0 else {}
    return Distribution(role_counts=counts, shares=shares)


def dominant_role(covered: RoleCounts, required: Sequence[str]) -> str:
    """The required role with the most pods over ``covered``; the first listed wins a tie."""
    best, best_count = "", -1
    for role in required:
        count = sum(roles.get(role, 0) for roles in covered.values())
        if count > best_count:
            best, best_count = role, count
    return best


def pick_revision(shares: Mapping[str, float], draw: float) -> str:
    """The revision ``draw`` (uniform in [0, 1)) lands on, ``""`` when there is none."""
    revisions = sorted(shares)
    total = sum(shares.values())
    if total <= 0:
        return ""
    x = draw * total
    cumulative = 0.0
    for revision in revisions:
        cumulative += shares[revision]
        if x < cumulative:
            return revision
    return revisions[-1]

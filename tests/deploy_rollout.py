"""The arithmetic Kubernetes uses for a Deployment's rolling update and a PodDisruptionBudget, so
the deploy tests can check that a rendered strategy finishes and keeps pods serving without a
cluster.

``rollout`` replays the Deployment controller's ``rolloutRolling`` pass by pass (kube-controller-
manager, ``pkg/controller/deployment/rolling.go``): a pass either scales the new ReplicaSet up
(``maxSurge`` above ``replicas``) and ends, or scales old ones down, unready old pods first
(``cleanupUnhealthyReplicas``), by at most ``allPods - (replicas - maxUnavailable) -
newUnavailable``, and ready old pods only while more than ``replicas - maxUnavailable`` pods are
ready. A pod created in one pass has started by the next; which started pods are ready is the
EPP's readiness: every one (one replica, active-active) or only the lease holder (leader
election: a standby is not ready, and a new pod can take the lease only once the old leader has
been stopped, as it releases the lease on SIGTERM). ``maxSurge`` rounds up and ``maxUnavailable``
down, as ``intstr`` percentages do; both 0 means ``maxUnavailable`` 1.

``disruptions_allowed`` is the eviction API's budget: ready pods less the pods the budget must
keep (``minAvailable``, or the Deployment's replicas less ``maxUnavailable``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def resolve(value: int | str, replicas: int, *, round_up: bool) -> int:
    """An ``intstr`` of a strategy or budget (``2`` or ``"25%"``) against ``replicas``."""
    if isinstance(value, int):
        return value
    share = float(value.rstrip("%")) * replicas / 100.0
    return math.ceil(share) if round_up else math.floor(share)


@dataclass
class _Pod:
    new: bool
    started: bool = False
    leader: bool = False


@dataclass
class Rollout:
    completed: bool
    passes: int
    fewest_ready: int
    """The fewest ready pods seen after any pass (a ready pod is one the Service sends to)."""
    leader_stopped_before_a_new_pod_existed: bool = False
    log: list[str] = field(default_factory=list)


def _ready(pods: list[_Pod], leader_only: bool) -> list[_Pod]:
    if not leader_only:
        return [p for p in pods if p.started]
    if not any(p.leader for p in pods):
        candidates = [p for p in pods if p.started]
        if candidates:
            candidates[0].leader = True  # the lease is free: a started pod takes it
    return [p for p in pods if p.leader]


def rollout(
    replicas: int,
    max_surge: int | str,
    max_unavailable: int | str,
    *,
    leader_only: bool,
    passes: int = 50,
) -> Rollout:
    """Replace ``replicas`` running pods (all started; with ``leader_only`` the first leads)."""
    surge = resolve(max_surge, replicas, round_up=True)
    unavailable = resolve(max_unavailable, replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    unavailable = min(unavailable, replicas)
    pods = [_Pod(new=False, started=True) for _ in range(replicas)]
    out = Rollout(completed=False, passes=0, fewest_ready=replicas)
    for n in range(1, passes + 1):
        for p in pods:
            p.started = True
        ready = _ready(pods, leader_only)
        old = [p for p in pods if not p.new]
        new = [p for p in pods if p.new]
        out.fewest_ready = min(out.fewest_ready, len(ready))
        if not old and len(new) == replicas:
            out.completed, out.passes = bool(ready), n
            return out
        up = min(replicas + surge - len(pods), replicas - len(new))
        if up > 0:
            pods += [_Pod(new=True) for _ in range(up)]
            out.log.append(f"pass {n}: new pods +{up}")
            continue
        min_available = replicas - unavailable
        new_unavailable = len([p for p in new if p not in ready])
        budget = len(pods) - min_available - new_unavailable
        if budget <= 0:
            out.log.append(f"pass {n}: blocked ({len(ready)} ready, {len(new)} new)")
            continue
        for p in [p for p in old if p not in ready][:budget]:
            pods.remove(p)
            budget -= 1
        spare = len(ready) - min_available
        for p in [p for p in old if p in ready][: max(0, min(budget, spare))]:
            if p.leader and not new:
                out.leader_stopped_before_a_new_pod_existed = True
            pods.remove(p)
        out.log.append(f"pass {n}: {len(old) - len([p for p in pods if not p.new])} old stopped")
    out.passes = passes
    return out


def disruptions_allowed(
    ready: int, replicas: int, *, max_unavailable: int | str | None, min_available: int | str | None
) -> int:
    """Evictions the budget allows now (``status.disruptionsAllowed``)."""
    if min_available is not None:
        keep = resolve(min_available, replicas, round_up=True)
    else:
        assert max_unavailable is not None
        keep = replicas - resolve(max_unavailable, replicas, round_up=True)
    return max(0, ready - keep)

"""Session statistics of a target: colocation, Responses follow-ups, foreign-load avoidance.

Computed from the driver's outcomes alone (``x-sim-pod`` names the pod that answered):

* **colocation**: over consecutive turns of one session (turn order) that were both served
  (HTTP 200 streamed to the end), the share where the later turn was served by the same pod as
  the earlier one. A session's first turn has no predecessor; a pair with a failed turn is left
  out. ``colocation_pairs`` is the number of pairs counted. Round robin over N pods gives about
  1/N; keeping each conversation's context hot on one pod gives 1.
* **follow-up success**: over the Responses turns sent with ``previous_response_id``
  (``Outcome.followup_status`` != 0), the share answered 200; ``followups_404`` counts those
  that reached a pod without the previous response (the driver then resent them as a new chain,
  so they were served anyway, see ``epp_tools.bench.runner.driver``).
* **foreign-load avoidance** (a workload with a ``ForeignLoad``): every request the target
  routed, counted per pod (a follow-up refused with 404 counts for the pod that refused it, and
  its resend for the pod that served it); ``busy_pod_share`` is the busy pod's share of them
  (ideal: well below 1/N while the others have room), ``others_imbalance`` the busiest other
  pod / the mean of the other pods. With foreign load the simulator's own counters include the
  foreign requests, so the target's ``per_pod``, ``imbalance`` and hit ratio come from the
  outcomes instead (``x-sim-pod`` and each answer's usage: its ``cached_tokens`` / its
  ``prompt_tokens``, which is what the counters add up to without the foreign requests).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.runner.results import TargetResult


def colocation(outcomes: Sequence[Outcome]) -> tuple[float | None, int]:
    """(share of served consecutive turn pairs on one pod, pairs counted); None: no pairs."""
    by_session: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_session.setdefault(o.session, []).append(o)
    same = pairs = 0
    for turns in by_session.values():
        ordered = sorted(turns, key=lambda o: o.turn)
        for prev, nxt in itertools.pairwise(ordered):
            if prev.ok and nxt.ok and prev.pod and nxt.pod:
                pairs += 1
                same += prev.pod == nxt.pod
    return (same / pairs if pairs else None), pairs


def followups(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Responses follow-ups: how many were sent, answered 200, refused with 404; the share ok."""
    sent = [o for o in outcomes if o.followup_status]
    ok = sum(o.followup_status == 200 for o in sent)
    return {
        "followups": len(sent),
        "followups_ok": ok,
        "followups_404": sum(o.followup_status == 404 for o in sent),
        "followup_success": ok / len(sent) if sent else None,
    }


def routed_per_pod(outcomes: Sequence[Outcome], pods: Sequence[str]) -> dict[str, int]:
    """Requests the target sent to each pod (404'd follow-ups count for the refusing pod)."""
    counts = dict.fromkeys(pods, 0)
    for o in outcomes:
        for pod in (o.pod, o.lost_pod):
            if pod:
                counts[pod] = counts.get(pod, 0) + 1
    return counts


def avoidance(per_pod: Mapping[str, int], busy: str) -> dict[str, float]:
    """The busy pod's share of the requests and the imbalance among the other pods."""
    total = sum(per_pod.values())
    others = [c for pod, c in per_pod.items() if pod != busy]
    mean = statistics.fmean(others) if others else 0.0
    return {
        "busy_pod_share": per_pod.get(busy, 0) / total if total else 0.0,
        "others_imbalance": max(others) / mean if mean else 0.0,
    }


def add_session_stats(result: TargetResult, outcomes: Sequence[Outcome]) -> None:
    """Colocation and follow-up success (see the module doc) into ``result``."""
    result.colocation, result.colocation_pairs = colocation(outcomes)
    stats = followups(outcomes)
    result.followups, result.followups_ok = stats["followups"], stats["followups_ok"]
    result.followups_404 = stats["followups_404"]
    result.followup_success = stats["followup_success"]


def add_foreign_stats(
    result: TargetResult,
    outcomes: Sequence[Outcome],
    pods: Sequence[str],
    busy: str,
    foreign: Mapping[str, Any],
    oracle_ratio: float,
) -> None:
    """Foreign-load avoidance, and per-pod load and hit ratio from the outcomes (module doc)."""
    result.per_pod = routed_per_pod(outcomes, pods)
    counts = list(result.per_pod.values())
    mean = statistics.fmean(counts) if counts else 0.0
    result.imbalance = max(counts) / mean if mean else 0.0
    stats = avoidance(result.per_pod, busy)
    result.busy_pod = busy
    result.busy_pod_share = stats["busy_pod_share"]
    result.others_imbalance = stats["others_imbalance"]
    result.foreign_load = dict(foreign)
    result.hit_ratio = result.client_hit_ratio
    result.oracle_share = result.hit_ratio / oracle_ratio if oracle_ratio > 0 else 0.0

"""Model-server scenarios of ``epp bench day2``: the pool's pods rolled one at a time, and a pod
killed mid-stream (see ``epp_tools.bench.day2.cli`` for what each expects)."""

from __future__ import annotations

import asyncio
import math

from epp_tools.bench.day2.report import Row
from epp_tools.bench.day2.rig import (
    LABELS,
    PODS_N,
    RECOVERED,
    Day2Options,
    Phases,
    Running,
    Stage,
    log,
    pod_host,
    run_load,
    stage,
)
from epp_tools.bench.fleet import sim_pod
from epp_tools.bench.kube.objects import PODS, pod
from epp_tools.bench.runner.agentload import between, failed, hit_ratio, recovery_seconds
from epp_tools.bench.runner.driver import Outcome
from epp_tools.stack.replicas import wait_endpoints

RETRIES = "cluster.pool.upstream_rq_retry"
RETRIED_OK = "cluster.pool.upstream_rq_retry_success"
EJECTED = "cluster.pool.outlier_detection.ejections_enforced_total"
RETRY_REFUSED = "cluster.pool.upstream_rq_retry_overflow"
"""Retries the cluster's retry budget refused (the request then fails with its try's error)."""
KILL_WINDOW = 1.0
"""Seconds after the kill counted as "during" (the EPP stops routing to it within a scrape)."""
ROUTING_LAG = 0.1
"""Seconds after a pod's termination during which a request may still be routed to it (the EPP
hears of the termination through its pod watch); such a request finds the listener closed and
Envoy retries it on another pod."""


def _ended(o: Outcome) -> float:
    return o.sent + (o.latency if math.isfinite(o.latency) else 0.0)


def _counters(st: Stage) -> dict[str, int]:
    return {k: st.envoy_stat(k) for k in (RETRIES, RETRIED_OK, EJECTED, RETRY_REFUSED)}


def _delta(st: Stage, before: dict[str, int]) -> dict[str, float]:
    now = _counters(st)
    return {
        "envoy_retries": float(now[RETRIES] - before[RETRIES]),
        "envoy_retries_ok": float(now[RETRIED_OK] - before[RETRIED_OK]),
        "envoy_ejections": float(now[EJECTED] - before[EJECTED]),
        "envoy_retries_refused": float(now[RETRY_REFUSED] - before[RETRY_REFUSED]),
    }


def _retried(figures: dict[str, float]) -> str:
    return (
        f"Envoy retried {figures['envoy_retries']:.0f} ({figures['envoy_retries_ok']:.0f} "
        f"succeeded, {figures['envoy_retries_refused']:.0f} refused by the retry budget)"
    )


async def _roll_one(st: Stage, k: int, run: Running) -> tuple[float, float]:
    """Pod ``k`` terminating (deletionTimestamp set and SIGTERM at once, as the kubelet does),
    gone once its process exited, then its replacement (a new address, an empty cache) Ready.
    Returns when the termination started and when the replacement was routable."""
    name = f"pod-{k}"
    t_term = run.now()
    st.api.replace(PODS, pod(name, pod_host(k), LABELS, terminating=True))
    await asyncio.to_thread(st.pods[name].terminate, name)
    st.api.delete(PODS, name)
    await asyncio.to_thread(st.add_pod, PODS_N + k)
    await asyncio.to_thread(wait_endpoints, st.epp.ports[0].metrics, PODS_N)
    return t_term, run.now()


async def model_roll(opts: Day2Options) -> Row:
    row = Row(
        "model-roll",
        f"{opts.rolled} of {PODS_N} model servers replaced one at a time (terminating pod "
        "drains; its replacement starts with an empty cache)",
        "0 failed",
    )
    async with stage(opts, row.scenario, slots=1, initial=1, shared=False, replacements=True) as st:
        run = await run_load(opts, st.epp.url)
        counters = await asyncio.to_thread(_counters, st)
        t0 = run.now()
        rolled: dict[str, tuple[float, float]] = {}
        for k in range(opts.rolled):
            rolled[f"pod-{k}"] = await _roll_one(st, k, run)
            log(f"{row.scenario}: pod-{k} replaced at {run.now():.1f}s")
        t1 = run.now()
        outcomes = await run.finish(opts.after)
        row.figures = await asyncio.to_thread(_delta, st, counters)
    phases = Phases(outcomes, t0, t1)
    row.measure(outcomes, phases)
    level = RECOVERED * row.hit_before
    row.recovery_s = recovery_seconds(outcomes, t1, level, limit=max(0.0, opts.after - 2.0))
    in_flight = [
        o for o in outcomes
        for name, (t_term, _) in rolled.items()
        if sim_pod(o.pod) == name and o.sent < t_term < _ended(o)
    ]  # fmt: skip
    late = [
        o for o in outcomes
        for name, (t_term, _) in rolled.items()
        if sim_pod(o.pod) == name and o.sent > t_term + ROUTING_LAG
    ]  # fmt: skip
    new_names = {f"pod-{PODS_N + k}" for k in range(opts.rolled)}
    last = between(outcomes, t1, math.inf)
    share = sum(1 for o in last if sim_pod(o.pod) in new_names) / len(last) if last else math.nan
    row.figures |= {
        "in_flight_at_termination": float(len(in_flight)),
        "in_flight_failed": float(failed(in_flight)),
        "sent_to_terminating": float(len(late)),
        "new_pods_share_after": share,
    }
    row.ok = row.failed == 0 and not late
    row.notes.append(
        f"{len(in_flight)} requests in flight on a pod when it began terminating, "
        f"{failed(in_flight)} of them failed; {len(late)} served by a terminating pod more than "
        f"{ROUTING_LAG * 1000:.0f} ms after; {_retried(row.figures)}; the new pods served "
        f"{100 * share:.0f}% of the requests after the roll, at a hit ratio of "
        f"{100 * hit_ratio(last):.1f}%"
    )
    return row


async def model_kill(opts: Day2Options) -> Row:
    row = Row(
        "model-kill",
        f"1 of {PODS_N} model servers SIGKILLed mid-stream",
        "failures only among the requests streaming from it",
    )
    async with stage(opts, row.scenario, slots=1, initial=1, shared=False) as st:
        run = await run_load(opts, st.epp.url)
        counters = await asyncio.to_thread(_counters, st)
        t0 = run.now()
        st.pods["pod-3"].kill("pod-3")
        await asyncio.sleep(KILL_WINDOW)
        t1 = run.now()
        outcomes = await run.finish(opts.after)
        row.figures = await asyncio.to_thread(_delta, st, counters)
    phases = Phases(outcomes, t0, t1)
    row.measure(outcomes, phases)
    streaming = [o for o in outcomes if sim_pod(o.pod) == "pod-3" and o.sent < t0 < _ended(o)]
    cut = [o for o in streaming if not o.ok]
    others = [o for o in outcomes if not o.ok and o not in cut]
    served_after = [o for o in outcomes if o.ok and sim_pod(o.pod) == "pod-3" and o.sent > t0]
    row.figures |= {
        "streaming_from_it": float(len(streaming)),
        "streams_cut": float(len(cut)),
        "other_failures": float(len(others)),
        "served_by_it_after": float(len(served_after)),
    }
    row.ok = not others and not served_after
    row.notes.append(
        f"{len(streaming)} requests were streaming from the pod, {len(cut)} of them cut; "
        f"{len(others)} other failures; {_retried(row.figures)} of the requests that had not "
        f"reached it, and ejected it {row.figures['envoy_ejections']:.0f} time(s); "
        f"{len(served_after)} requests sent after the kill were served by it"
    )
    return row

"""Pod-side scenarios of ``epp bench chaos``: a pod killed, ``/metrics`` faults, a black-hole
pod, discovery churn (see ``epp_tools.bench.chaos.cli`` for what each expects)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from epp_tools.bench.chaos.load import Shot, StreamLoad, between, failures
from epp_tools.bench.chaos.report import Row
from epp_tools.bench.chaos.rig import ChaosOptions
from epp_tools.bench.fleet import PodSet, sim_pod
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.replicas import EppSet, wait_endpoints

SCRAPE_INTERVAL = 0.05
STALENESS = 0.2
CHURN_LAG_LIMIT = 0.5


@dataclass
class Rig:
    pods: PodSet
    epp: EppSet
    endpoints: Path


def config(endpoints: Path, *, exclude: bool = False, watch: bool = False) -> str:
    """The built-in default with file discovery; ``exclude`` adds the utilization detector with
    ``stalenessPolicy: exclude``; ``watch`` re-reads the endpoints file every 100 ms."""
    doc = yaml.safe_load(epp_config_text(endpoints, ()))
    if watch:
        for plugin in doc["plugins"]:
            if plugin.get("type") == "file-discovery":
                plugin["parameters"].update({"watchFile": True, "pollInterval": "100ms"})
    if exclude:
        doc["plugins"].append(
            {"type": "utilization-detector", "parameters": {"stalenessPolicy": "exclude"}}
        )
        doc["saturationDetector"] = {"pluginRef": "utilization-detector"}
    return str(yaml.safe_dump(doc, sort_keys=False))


@contextlib.asynccontextmanager
async def rig(
    opts: ChaosOptions, name: str, pods: int, *, fail_open: bool = False, **config_kw: bool
) -> AsyncIterator[Rig]:
    """Pods, then the EPP behind Envoy (``fail_open``: the buffered fail-open config, falling
    back to round robin over the pods), torn down at the end."""
    workdir = opts.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    spec = FleetSpec(pods=1, time_scale=opts.time_scale)
    podset = PodSet(workdir, spec, pods)
    endpoints = workdir / "endpoints.yaml"
    epp = EppSet(workdir, "")
    try:
        await asyncio.to_thread(podset.start)
        endpoints.write_text(podset.endpoints_yaml())
        epp.config_text = config(endpoints, **config_kw)
        if fail_open:
            epp.envoy_config = "buffered-failopen"
            epp.fallback = [podset.hostport(n) for n in podset.names]
        await asyncio.to_thread(epp.start)
        await asyncio.to_thread(wait_endpoints, epp.ports[0].metrics, pods)
        yield Rig(podset, epp, endpoints)
    finally:
        await asyncio.to_thread(epp.stop)
        await asyncio.to_thread(podset.stop)


async def loaded(opts: ChaosOptions, url: str, request_timeout: float = 5.0) -> StreamLoad:
    """Load started, warmed for ``--before`` seconds."""
    load = StreamLoad(url, clients=opts.clients, request_timeout=request_timeout).start()
    await asyncio.sleep(opts.before)
    return load


def last_sent_after(shots: Sequence[Shot], t0: float) -> float:
    """Milliseconds from ``t0`` to the latest ``sent`` among ``shots`` (NaN when none)."""
    return max(((s.sent - t0) * 1000.0 for s in shots), default=float("nan"))


async def pod_kill(opts: ChaosOptions) -> Row:
    row = Row("pod-kill", "SIGKILL 1 of 4 pods", "failures only in flight on it; "
              "no request to it > 1 scrape interval after death")  # fmt: skip
    async with rig(opts, row.scenario, 4) as r:
        load = await loaded(opts, r.epp.url)
        t_kill = time.perf_counter()
        r.pods.kill("pod-3")
        await asyncio.sleep(opts.after)
        shots = await load.stop()
    row.count(shots)
    failed = failures(shots)
    in_flight = [s for s in failed if s.sent < t_kill and sim_pod(s.pod) in ("pod-3", "")]
    routed_dead = [s for s in failed if s.sent >= t_kill and not s.pod]
    row.attributed = len(in_flight) + len(routed_dead)
    row.stop_routing_ms = last_sent_after(routed_dead, t_kill)
    late = [s for s in routed_dead if s.sent - t_kill > SCRAPE_INTERVAL]
    served_after = [s for s in shots if s.ok and sim_pod(s.pod) == "pod-3" and s.sent > t_kill]
    row.ok = row.unexplained == 0 and not late and not served_after
    after = (
        f"the last {row.stop_routing_ms:.0f} ms after it (sent time), {len(late)} of them more "
        f"than one scrape interval ({SCRAPE_INTERVAL * 1000:.0f} ms) after"
        if routed_dead
        else "none after it"
    )
    row.notes.append(
        f"{len(in_flight)} failures in flight on the killed pod; {len(routed_dead)} requests "
        f"routed to it after its death, {after}"
    )
    return row


async def metrics_faults(opts: ChaosOptions) -> Row:
    row = Row("metrics-faults", "/metrics stalled, 400 ms late, garbage, 503 (4 of 5 pods)",
              "0 failures")  # fmt: skip
    faults: dict[str, dict[str, Any]] = {
        "pod-1": {"stall_metrics": True},
        "pod-2": {"metrics_delay_ms": 400},
        "pod-3": {"metrics_garbage": True},
        "pod-4": {"metrics_status": 503},
    }
    async with rig(opts, row.scenario, 5) as r:
        load = await loaded(opts, r.epp.url)
        t0 = time.perf_counter()
        await asyncio.gather(*(r.pods.afault(p, f) for p, f in faults.items()))
        await asyncio.sleep(opts.fault)
        t1 = time.perf_counter()
        await asyncio.gather(*(r.pods.afault(p, {}) for p in faults))
        await asyncio.sleep(opts.after)
        shots = await load.stop()
    row.count(shots)
    during = [s for s in between(shots, t0, t1) if s.ok]
    share = {p: sum(1 for s in during if sim_pod(s.pod) == p) for p in ["pod-0", *faults]}
    row.ok = row.failed == 0
    row.notes.append(f"requests per pod while faulted: {share}")
    return row


async def black_hole(opts: ChaosOptions, *, exclude: bool) -> Row:
    name = "black-hole-exclude" if exclude else "black-hole"
    expected = (
        "no request to it once its metrics are stale (200 ms)"
        if exclude
        else "requests routed to it time out"
    )
    row = Row(name, "1 of 4 pods accepts and never answers", expected)
    async with rig(opts, name, 4, exclude=exclude) as r:
        # shorter than the fault, so a request held by the black hole times out
        load = await loaded(opts, r.epp.url, request_timeout=min(2.0, opts.fault / 2))
        t0 = time.perf_counter()
        await r.pods.afault("pod-3", {"black_hole": True})
        await asyncio.sleep(opts.fault)
        t1 = time.perf_counter()
        await r.pods.afault("pod-3", {})
        await asyncio.sleep(opts.after)
        shots = await load.stop()
    row.count(shots)
    # A request to the black hole gets no answer: it fails with the client's timeout, with no pod
    # (or, released when the fault clears, with pod-3 and a stream cut by the same timeout).
    held = [s for s in failures(shots) if sim_pod(s.pod) in ("", "pod-3") and "Timeout" in s.error]
    row.attributed = len(held)
    row.stop_routing_ms = last_sent_after([s for s in held if s.sent >= t0], t0)
    if exclude:
        late = [s for s in held if t0 + STALENESS + SCRAPE_INTERVAL < s.sent < t1]
        row.ok = row.unexplained == 0 and not late
    else:
        row.ok = row.unexplained == 0
    row.notes.append(
        f"{len(held)} requests routed to the black hole timed out "
        f"({load.request_timeout:g} s client timeout)"
    )
    return row


async def churn(opts: ChaosOptions) -> Row:
    row = Row(
        "churn",
        "endpoints file rewritten every 1 s (3-5 of 6 live pods)",
        "0 failures; a dropped pod gets no request once the file is re-read (100 ms poll)",
    )
    rng = random.Random(opts.seed)
    timeline: list[tuple[float, frozenset[str]]] = []
    async with rig(opts, row.scenario, 6, watch=True) as r:
        timeline.append((time.perf_counter(), frozenset(r.pods.names)))
        load = await loaded(opts, r.epp.url)
        end = time.perf_counter() + opts.fault + opts.after
        while time.perf_counter() < end:
            chosen = sorted(rng.sample(r.pods.names, rng.randint(3, 5)))
            tmp = r.endpoints.with_suffix(".tmp")
            tmp.write_text(r.pods.endpoints_yaml(chosen))
            tmp.replace(r.endpoints)
            timeline.append((time.perf_counter(), frozenset(chosen)))
            await asyncio.sleep(1.0)
        shots = await load.stop()
    row.count(shots)
    lags = [_lag(timeline, sim_pod(s.pod), s.sent) for s in shots if s.ok]
    stray = [lag for lag in lags if lag > 0]
    row.stop_routing_ms = max(stray, default=float("nan")) * 1000.0
    row.ok = row.failed == 0 and max(stray, default=0.0) < CHURN_LAG_LIMIT
    row.notes.append(
        f"{len(timeline) - 1} membership changes; {len(stray)} requests sent to a pod after it "
        f"had left the file (stop routing: the longest such delay; limit "
        f"{CHURN_LAG_LIMIT * 1000:.0f} ms, on a shared machine)"
    )
    return row


def _lag(timeline: Sequence[tuple[float, frozenset[str]]], pod: str, sent: float) -> float:
    """Seconds since ``pod`` left the endpoints file when a request to it was sent (0 when it
    was in the file then)."""
    removed_at: float | None = None
    for at, members in timeline:
        if at > sent:
            break
        if pod in members:
            removed_at = None
        elif removed_at is None:
            removed_at = at
    return 0.0 if removed_at is None else sent - removed_at

"""What the report shows for each target, computed from one run's raw measurements.

* hit ratio: the simulator's own counters over the measured phase, summed over pods:
  ``prefix_hit_tokens / prefix_query_tokens`` (what ``prompt_tokens_details.cached_tokens``
  adds up to); ``oracle_share`` divides it by the workload's achievable reuse
  (``epp_tools.bench.workloads.oracle``);
* TTFT p50/p90/p99 (wall-clock ms, keep-alive connections as the load generator uses them) and
  the fresh-connection probe's p50; ITL: p50 (and p90) over requests of each request's mean gap
  between content chunks; throughput: successful requests and output tokens per second of the
  run;
* load imbalance: requests served by the busiest pod / the mean over all pods;
* CPU: ``utime + stime`` of the target's processes during the measured phase, per successful
  request; peak RSS (VmHWM) at the end;
* per traffic class and per tenant: see ``epp_tools.bench.runner.classes``, over the requests that
  arrive after the workload's lead-in (``Workload.measure_from``); ``epp_memory`` (EPP targets of a
  workload with objectives): RSS after warm-up, peak flow-control queue bytes and requests,
  configured byte caps (``epp_tools.bench.runner.eppmetrics``);
* session statistics (``colocation``, Responses ``followup_success``) and, with foreign load,
  ``busy_pod_share`` and ``others_imbalance`` (``per_pod``, ``imbalance`` and the hit ratio then
  come from the target's own answers): see ``epp_tools.bench.runner.sessions``; ``None`` where they
  do not apply (no multi-turn sessions, no follow-ups, no foreign load);
* P/D (from the simulator's counters): ``remote_prefills``, the requests whose prompt was
  prefilled on another pod and whose KV was pulled (``remote_prefill_share`` of the successful
  requests), and ``kv_transfer_blocks``, the blocks pulled. On a P/D fleet the per-pod counts,
  imbalance and hit ratio include the prefill legs;
* ``vs_best_peer``: this target's value / the best value among the peer routers that ran
  (sglang-router, vllm-router; the Envoy baselines when neither ran), the row's own target
  excluded; ``best_peer`` names which peer was best per metric (hit share and throughput:
  higher is better; TTFT: lower is better).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from epp_tools.bench.runner.classes import class_stats, tenant_stats
from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.workloads.text import percentile

PEER_METRICS: dict[str, bool] = {
    "oracle_share": True,
    "ttft_p50_ms": False,
    "ttft_p90_ms": False,
    "out_tok_per_s": True,
}
"""Metric -> higher is better."""


@dataclass
class TargetResult:
    target: str
    label: str
    status: str = "ok"
    reason: str = ""
    requests: int = 0
    ok: int = 0
    errors: int = 0
    hit_ratio: float = 0.0
    client_hit_ratio: float = 0.0
    oracle_share: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p90_ms: float = 0.0
    ttft_p99_ms: float = 0.0
    ttft_fresh_p50_ms: float = 0.0
    ttft_reused_p50_ms: float = 0.0
    itl_p50_ms: float = 0.0
    itl_p90_ms: float = 0.0
    duration_s: float = 0.0
    req_per_s: float = 0.0
    out_tok_per_s: float = 0.0
    per_pod: dict[str, int] = field(default_factory=dict)
    imbalance: float = 0.0
    evictions: int = 0
    preemptions: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    cpu_ms_per_req: float = 0.0
    idle_cores: dict[str, float] = field(default_factory=dict)
    """Each process's CPU with no traffic, measured before the run (cores)."""
    measured_s: float = 0.0
    cpu_net_s: dict[str, float] = field(default_factory=dict)
    """``cpu_s`` less each process's idle rate over the measured phase (``measured_s``)."""
    cpu_ms_per_req_net: float | None = None
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    tenants: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """Objective -> tenant -> stats, for objectives whose requests carry a fairness id."""
    epp_memory: dict[str, Any] = field(default_factory=dict)
    colocation: float | None = None
    colocation_pairs: int = 0
    followups: int = 0
    followups_ok: int = 0
    followups_404: int = 0
    followup_success: float | None = None
    busy_pod: str = ""
    busy_pod_share: float | None = None
    others_imbalance: float | None = None
    foreign_load: dict[str, Any] = field(default_factory=dict)
    """The foreign traffic's own numbers over the measured phase
    (``epp_tools.bench.runner.foreign``)."""
    remote_prefills: int = 0
    remote_prefill_share: float = 0.0
    kv_transfer_blocks: int = 0
    error_samples: list[str] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    vs_best_peer: dict[str, float] = field(default_factory=dict)
    best_peer: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TargetResult:
        return cls(**dict(data))


def net_of_idle(result: TargetResult, idle: Mapping[str, float], wall_s: float) -> TargetResult:
    """Each process's CPU over the measured phase less its idle rate times the phase's wall
    time (at least 0), and the total per successful request."""
    result.idle_cores = dict(idle)
    result.measured_s = round(wall_s, 3)
    result.cpu_net_s = {
        name: round(max(0.0, cpu - idle.get(name, 0.0) * wall_s), 3)
        for name, cpu in result.cpu_s.items()
    }
    if result.ok:
        result.cpu_ms_per_req_net = sum(result.cpu_net_s.values()) * 1000.0 / result.ok
    return result


def _ms(values: Sequence[float], q: float) -> float:
    return round(percentile(values, q) * 1000.0, 3)


def summarize(
    result: TargetResult,
    outcomes: Sequence[Outcome],
    sim_delta: Mapping[str, Mapping[str, float]],
    oracle_ratio: float,
    cpu_s: Mapping[str, float],
    probe: Mapping[str, Sequence[float]],
    measured: Sequence[Outcome] | None = None,
) -> TargetResult:
    """Fill ``result`` from one target's measurements; the per-class and per-tenant stats come
    from ``measured`` when given (the requests after the workload's lead-in)."""
    ok = [o for o in outcomes if o.ok]
    result.requests, result.ok = len(outcomes), len(ok)
    result.errors = len(outcomes) - len(ok)
    result.error_samples = sorted({o.error or f"HTTP {o.status}" for o in outcomes if not o.ok})[:5]
    queried = sum(p.get("prefix_query_tokens", 0) for p in sim_delta.values())
    hits = sum(p.get("prefix_hit_tokens", 0) for p in sim_delta.values())
    result.hit_ratio = hits / queried if queried else 0.0
    prompt = sum(o.prompt_tokens for o in ok)
    result.client_hit_ratio = sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0
    result.oracle_share = result.hit_ratio / oracle_ratio if oracle_ratio > 0 else 0.0
    ttfts = [o.ttft for o in ok]
    result.ttft_p50_ms, result.ttft_p90_ms = _ms(ttfts, 0.5), _ms(ttfts, 0.9)
    result.ttft_p99_ms = _ms(ttfts, 0.99)
    result.ttft_ms = sorted(round(t * 1000.0, 3) for t in ttfts)
    result.ttft_fresh_p50_ms = _ms(probe.get("fresh", []), 0.5)
    result.ttft_reused_p50_ms = _ms(probe.get("reused", []), 0.5)
    itls = [o.itl for o in ok if not math.isnan(o.itl)]
    result.itl_p50_ms = _ms(itls, 0.5)
    result.itl_p90_ms = _ms(itls, 0.9)
    if ok:
        begin = min(o.sent for o in ok)
        end = max(o.sent + o.latency for o in ok)
        result.duration_s = round(end - begin, 3)
        if result.duration_s > 0:
            result.req_per_s = len(ok) / result.duration_s
            result.out_tok_per_s = sum(o.tokens for o in ok) / result.duration_s
    result.per_pod = {pod: int(c.get("requests_received", 0)) for pod, c in sim_delta.items()}
    counts = list(result.per_pod.values())
    mean = statistics.fmean(counts) if counts else 0.0
    result.imbalance = max(counts) / mean if mean else 0.0
    result.evictions = int(sum(c.get("evictions", 0) for c in sim_delta.values()))
    result.preemptions = int(sum(c.get("preemptions", 0) for c in sim_delta.values()))
    result.remote_prefills = int(sum(c.get("remote_prefills", 0) for c in sim_delta.values()))
    result.remote_prefill_share = result.remote_prefills / len(ok) if ok else 0.0
    result.kv_transfer_blocks = int(sum(c.get("kv_transfer_blocks", 0) for c in sim_delta.values()))
    result.cpu_s = {name: round(v, 3) for name, v in cpu_s.items()}
    total_cpu = sum(cpu_s.values())
    result.cpu_ms_per_req = total_cpu * 1000.0 / len(ok) if ok else 0.0
    window = outcomes if measured is None else measured
    result.classes = class_stats(window)
    result.tenants = {
        name: tenant_stats(window, name)
        for name in sorted({o.objective for o in window if o.tenant})
    }
    return result


def add_peer_ratios(results: Sequence[TargetResult], routers: Sequence[str]) -> None:
    """Set ``vs_best_peer`` / ``best_peer`` of every target that ran (see the module doc)."""
    ran = [r for r in results if r.status == "ok" and r.ok]
    peers = [r for r in ran if r.target in routers] or [
        r for r in ran if not r.target.startswith("epp")
    ]
    for r in ran:
        others = [p for p in peers if p is not r]
        r.vs_best_peer, r.best_peer = {}, {}
        for metric, higher in PEER_METRICS.items():
            candidates = [p for p in others if getattr(p, metric) > 0]
            mine = getattr(r, metric)
            if not candidates or mine <= 0:
                continue
            pick = max if higher else min
            best = pick(candidates, key=lambda p: float(getattr(p, metric)))
            r.vs_best_peer[metric] = round(mine / getattr(best, metric), 3)
            r.best_peer[metric] = best.target

"""Per-class and per-tenant outcomes, queue sampling, byte caps and the overload verdicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from epp_tools.bench.runner.classes import class_stats, max_min_shares, refusal, tenant_stats
from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.runner.eppmetrics import (
    DEFAULT_BAND_MAX_BYTES,
    QueueSampler,
    byte_caps,
    parse_queue,
)
from epp_tools.bench.runner.overload_report import (
    latency_verdict,
    memory_verdict,
    render,
    shedding_verdict,
    tenant_verdict,
)

REPO = Path(__file__).resolve().parents[3]


def _out(
    i: int,
    objective: str,
    status: int = 200,
    *,
    tenant: str = "",
    reason: str = "",
    error: str = "",
    ttft: float = 0.1,
) -> Outcome:
    ok = status == 200 and not error
    return Outcome(
        index=i,
        session=f"s{i}",
        objective=objective,
        status=status,
        ttft=ttft if ok else math.nan,
        tokens=5 if status == 200 else 0,
        error=error or ("" if status == 200 else "inference error: ResourceExhausted - full"),
        tenant=tenant,
        reason=reason,
    )


@pytest.mark.parametrize(
    ("demands", "total", "expected"),
    [
        pytest.param({"a": 290, "b": 29}, 150, {"a": 121.0, "b": 29.0}, id="light-tenant-capped"),
        pytest.param({"a": 100, "b": 100}, 80, {"a": 40.0, "b": 40.0}, id="equal-split"),
        pytest.param({"a": 290, "b": 29}, 319, {"a": 290.0, "b": 29.0}, id="all-served"),
        pytest.param({"a": 10, "b": 5, "c": 50}, 30, {"a": 10.0, "b": 5.0, "c": 15.0}, id="three"),
        pytest.param({"a": 10, "b": 10}, 0, {"a": 0.0, "b": 0.0}, id="nothing-served"),
    ],
)
def test_max_min_shares_water_fill_demands_when_split(
    demands: dict[str, int], total: int, expected: dict[str, float]
) -> None:
    assert max_min_shares(demands, total) == pytest.approx(expected)


def test_tenant_stats_compare_served_with_the_fair_share_when_tenants_compete() -> None:
    outcomes = [_out(i, "agentic", tenant="tenant-a") for i in range(6)]
    outcomes += [_out(6 + i, "agentic", 429, tenant="tenant-a") for i in range(4)]
    outcomes += [_out(10, "agentic", tenant="tenant-b"), _out(11, "agentic", tenant="tenant-b")]
    stats = tenant_stats(outcomes, "agentic")
    assert (stats["tenant-b"]["served"], stats["tenant-b"]["fair_share"]) == (2, 0.25)
    assert stats["tenant-a"]["share"] == stats["tenant-a"]["fair_share"] == 0.75
    assert stats["tenant-a"]["deviation"] == pytest.approx(0.0)
    assert stats["tenant-a"]["sent"] == 10


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        pytest.param(_out(0, "b", 429, reason="rejected-ttl-expired"), "rejected-ttl-expired",
                     id="header"),
        pytest.param(_out(0, "b", 429, error="inference error: ResourceExhausted - system "
                          "saturated, sheddable request dropped"),
                     "no header: system saturated, sheddable request dropped", id="legacy-body"),
        pytest.param(_out(0, "b", 429, error="busy"), "no header: busy", id="plain-body"),
    ],
)  # fmt: skip
def test_refusal_prefers_the_drop_reason_header_when_one_was_sent(
    outcome: Outcome, expected: str
) -> None:
    assert refusal(outcome) == expected


def test_class_stats_count_429_reasons_503_and_others_when_requests_fail() -> None:
    outcomes = [
        _out(0, "batch", 429, reason="rejected-saturated"),
        _out(1, "batch", 429, reason="rejected-saturated"),
        _out(2, "batch", 429, reason="rejected-ttl-expired"),
        _out(3, "batch", 503, reason="rejected-no-endpoints"),
        _out(4, "batch", 200, error="ClientPayloadError: cut"),
        _out(5, "batch", ttft=0.25),
    ]
    c = class_stats(outcomes)["batch"]
    assert (c["sent"], c["served"], c["rejected_429"]) == (6, 1, 3)
    assert c["reasons_429"] == {"rejected-saturated": 2, "rejected-ttl-expired": 1}
    assert (c["unavailable_503"], c["other_errors"], c["ttft_p99_ms"]) == (1, 1, 250.0)


METRICS = """\
# HELP llm_d_epp_flow_control_queue_bytes Bytes of requests held in flow-control queues
# TYPE llm_d_epp_flow_control_queue_bytes gauge
llm_d_epp_flow_control_queue_bytes{fairness_id="tenant-a",priority="0",inference_pool="default",\
model_name="m",target_model_name="m"} 4096.0
llm_d_epp_flow_control_queue_bytes{fairness_id="tenant-b",priority="0",inference_pool="default",\
model_name="m",target_model_name="m"} 1024.0
llm_d_epp_flow_control_queue_bytes{fairness_id="default-flow",priority="-1",\
inference_pool="default",model_name="m",target_model_name="m"} 2048.0
llm_d_epp_flow_control_queue_size{fairness_id="default-flow",priority="-1",\
inference_pool="default",model_name="m",target_model_name="m"} 3.0
inference_extension_flow_control_queue_bytes{fairness_id="x",priority="0"} 99.0
"""


def test_queue_sampler_keeps_peaks_per_band_when_readings_arrive() -> None:
    reading = parse_queue(METRICS)
    assert reading == {"bytes": {"0": 5120.0, "-1": 2048.0}, "requests": {"-1": 3.0}}
    sampler = QueueSampler("http://127.0.0.1:1/metrics")
    sampler.add(reading)
    sampler.add({"bytes": {"0": 100.0, "-1": 8000.0}, "requests": {}})
    assert sampler.as_json() == {
        "samples": 2,
        "peak_bytes": {"-1": 8000, "0": 5120},
        "peak_requests": {"-1": 3},
        "peak_total_bytes": 8100,
        "peak_total_requests": 3,
    }


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param("plugins: []\n", {}, id="no-flow-control"),
        pytest.param(
            "featureGates: [flowControl]\nflowControl:\n  maxBytes: 4Mi\n  priorityBands:\n"
            "  - {priority: 10, maxBytes: 1Mi}\n  defaultNegativePriorityBand: {maxBytes: 64Ki}\n",
            {"global": 4 * 2**20, "10": 2**20, "0": DEFAULT_BAND_MAX_BYTES, "-1": 64 * 1024},
            id="bands-and-templates",
        ),
        pytest.param(
            "featureGates: [flowControl]\nflowControl:\n  defaultPriorityBand: {maxBytes: 1k}\n",
            {"global": 0, "10": 1000, "0": 1000, "-1": 1000},
            id="positive-template-for-all",
        ),
    ],
)
def test_byte_caps_follow_the_flow_control_defaults_when_read(
    config: str, expected: dict[str, int]
) -> None:
    assert byte_caps(config, [10, 0, -1]) == expected


def test_byte_caps_of_the_flow_control_example_are_the_documented_ones_when_read() -> None:
    text = (REPO / "deploy" / "configs" / "flow-control.yaml").read_text()
    assert byte_caps(text, [10, 0, -1]) == {
        "global": 4 * 2**20, "10": 2**20, "0": 2 * 2**20, "-1": 128 * 1024,
    }  # fmt: skip


def _classes(**dropped: tuple[int, int, dict[str, int]]) -> dict[str, Any]:
    return {
        name: {
            "sent": sent, "served": sent - n, "rejected_429": sum(reasons.values()),
            "reasons_429": reasons, "unavailable_503": 0, "other_errors": 0,
            "ttft_p50_ms": 100.0, "ttft_p99_ms": 300.0,
        }
        for name, (sent, n, reasons) in dropped.items()
    }  # fmt: skip


PRIORITIES = {"ls": 10, "agentic": 0, "batch": -1}


@pytest.mark.parametrize(
    ("classes", "holds"),
    [
        pytest.param(_classes(ls=(10, 0, {}), agentic=(10, 2, {"rejected-ttl-expired": 2}),
                              batch=(10, 9, {"rejected-saturated": 9})), True, id="by-priority"),
        pytest.param(_classes(ls=(10, 0, {}), agentic=(10, 0, {}),
                              batch=(10, 9, {"no header: system saturated": 9})), False,
                     id="legacy-no-reason"),
        pytest.param(_classes(ls=(10, 1, {"rejected-ttl-expired": 1}), agentic=(10, 0, {}),
                              batch=(10, 0, {})), False, id="priority-inverted"),
    ],
)  # fmt: skip
def test_shedding_holds_only_when_drops_follow_priority_with_reasons(
    classes: dict[str, Any], holds: bool
) -> None:
    assert shedding_verdict({"classes": classes}, PRIORITIES)[1] is holds


@pytest.mark.parametrize(
    ("p99", "dropped", "holds"),
    [
        pytest.param(450.0, 0, True, id="at-1.5x"),
        pytest.param(451.0, 0, False, id="over"),
        pytest.param(200.0, 1, False, id="one-dropped"),
    ],
)
def test_latency_target_is_1_5x_the_idle_p99_with_nothing_dropped(
    p99: float, dropped: int, holds: bool
) -> None:
    classes = _classes(ls=(10, dropped, {}))
    classes["ls"]["ttft_p99_ms"] = p99
    ref = {"status": "ok", "ttft_p99_ms": 300.0}
    text, ok = latency_verdict({"classes": classes}, "ls", ref)
    assert ok is holds
    assert f"p99 {p99:.0f} ms" in text
    assert latency_verdict({"classes": classes}, "ls", {})[1] is None


def test_tenant_target_allows_ten_percent_from_the_fair_share() -> None:
    def tenants(dev: float) -> dict[str, Any]:
        s = {"sent": 10, "served": 5, "share": 0.5, "fair_share": 0.5, "deviation": dev}
        return {"tenants": {"agentic": {"tenant-a": s}}}

    assert tenant_verdict(tenants(-0.1))[1] is True
    assert tenant_verdict(tenants(0.11))[1] is False
    assert tenant_verdict({"tenants": {}})[1] is None


def test_memory_target_compares_queue_peaks_with_the_caps_when_flow_control_ran() -> None:
    r = {
        "peak_rss_mb": {"epp": 80.0},
        "epp_memory": {
            "rss_start_mb": 69.0,
            "caps": {"global": 4096, "-1": 1024},
            "queue": {"peak_bytes": {"-1": 1024}, "peak_total_bytes": 3000},
        },
    }
    text, ok = memory_verdict(r, {-1: "batch"})
    assert ok is True and "batch 1 of 1 KiB" in text and "RSS 69 -> 80 MB" in text
    r["epp_memory"]["queue"]["peak_total_bytes"] = 5000
    assert memory_verdict(r, {-1: "batch"})[1] is False
    assert memory_verdict({"peak_rss_mb": {}, "epp_memory": {}}, {})[1] is None


def test_render_shows_the_targets_table_per_epp_target_when_the_workload_has_a_reference() -> None:
    result = {
        "target": "epp:fc.yaml", "label": "EPP (fc) via Envoy", "status": "ok",
        "classes": _classes(ls=(10, 0, {}), batch=(10, 10, {"rejected-saturated": 10})),
        "tenants": {}, "peak_rss_mb": {"epp": 80.0}, "epp_memory": {},
    }  # fmt: skip
    w = {
        "results": [result], "objectives": [["ls", 10], ["batch", -1]],
        "reference_objective": "ls",
        "reference": {"status": "ok", "label": "EPP (fc) via Envoy", "objective": "ls",
                      **_classes(ls=(10, 0, {}))["ls"], "ttft_p99_ms": 250.0},
    }  # fmt: skip
    text = "\n".join(render(w))
    assert "| ls requests | p99 TTFT <= 1.5x idle, none dropped | p99 300 ms = 1.20x idle" in text
    assert "| EPP (fc) via Envoy | batch (-1) | 10 | 0 | 10 (rejected-saturated 10) |" in text
    assert "| EPP (fc) via Envoy | ls, idle fleet | 10 | 10 | 0 | 0 | 0 | 100 | 250 |" in text

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.runner.report import render_markdown, write
from epp_tools.bench.runner.results import TargetResult, add_peer_ratios, net_of_idle, summarize


def _outcome(i: int, pod: str, ttft: float, *, status: int = 200, objective: str = "") -> Outcome:
    return Outcome(
        index=i,
        session=f"s{i}",
        objective=objective,
        status=status,
        pod=pod,
        sent=float(i),
        ttft=ttft,
        latency=1.0,
        tokens=10 if status == 200 else 0,
        itl=0.002,
        prompt_tokens=100,
        cached_tokens=50,
        error="" if status == 200 else "boom",
    )


def _sim_delta(counts: dict[str, int], queried: int, hits: int) -> dict[str, dict[str, float]]:
    n = len(counts)
    return {
        pod: {
            "requests_received": c,
            "prefix_query_tokens": queried / n,
            "prefix_hit_tokens": hits / n,
            "evictions": 5,
            "preemptions": 0,
        }
        for pod, c in counts.items()
    }


def _result(target: str, *, hit: float, p90: float, tok: float) -> TargetResult:
    r = TargetResult(target, target.upper(), ok=10, requests=10)
    r.oracle_share, r.ttft_p90_ms, r.ttft_p50_ms, r.out_tok_per_s = hit, p90, p90 / 2, tok
    return r


def test_summarize_computes_hit_share_imbalance_and_cpu_when_given_measurements() -> None:
    outcomes = [_outcome(i, f"pod-{i % 2}", 0.010 * (i + 1)) for i in range(9)]
    outcomes.append(_outcome(9, "pod-0", math.nan, status=503))
    r = summarize(
        TargetResult("epp", "EPP"),
        outcomes,
        _sim_delta({"pod-0": 6, "pod-1": 3, "pod-2": 0}, queried=1000, hits=600),
        oracle_ratio=0.8,
        cpu_s={"epp": 0.09, "envoy": 0.018},
        probe={"fresh": [0.004, 0.002, 0.003], "reused": [0.05]},
    )
    assert (r.requests, r.ok, r.errors) == (10, 9, 1)
    assert r.error_samples == ["boom"]
    assert r.hit_ratio == pytest.approx(0.6)
    assert r.oracle_share == pytest.approx(0.75)
    assert r.client_hit_ratio == pytest.approx(0.5)
    assert (r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == (50.0, 90.0, 90.0)
    assert (r.ttft_fresh_p50_ms, r.ttft_reused_p50_ms) == (3.0, 50.0)
    assert r.itl_p50_ms == 2.0
    assert r.per_pod == {"pod-0": 6, "pod-1": 3, "pod-2": 0}
    assert r.imbalance == pytest.approx(2.0)
    assert r.evictions == 15
    assert r.cpu_ms_per_req == pytest.approx(12.0)
    assert r.duration_s == pytest.approx(9.0)  # first sent at 0, last ends at 8 + 1
    assert r.out_tok_per_s == pytest.approx(10.0)


def test_summarize_splits_outcomes_per_class_when_requests_carry_an_objective() -> None:
    outcomes = [
        _outcome(0, "pod-0", 0.1, objective="critical"),
        _outcome(1, "pod-0", 0.3, objective="sheddable"),
        _outcome(2, "pod-0", math.nan, status=429, objective="sheddable"),
    ]
    r = summarize(TargetResult("rr", "RR"), outcomes, {}, 0.5, {}, {})
    assert r.classes["critical"] == {
        "sent": 1, "served": 1, "rejected_429": 0, "reasons_429": {}, "unavailable_503": 0,
        "other_errors": 0, "ttft_p50_ms": 100.0, "ttft_p99_ms": 100.0,
    }  # fmt: skip
    assert r.classes["sheddable"]["rejected_429"] == 1
    assert r.tenants == {}
    assert r.hit_ratio == 0.0 and r.imbalance == 0.0


def test_summarize_counts_classes_over_the_measured_window_when_given_one() -> None:
    outcomes = [_outcome(i, "pod-0", 0.1 * (i + 1), objective="chat") for i in range(4)]
    r = summarize(TargetResult("rr", "RR"), outcomes, {}, 0.5, {}, {}, measured=outcomes[2:])
    assert (r.ok, r.classes["chat"]["sent"], r.classes["chat"]["ttft_p50_ms"]) == (4, 2, 300.0)


def test_peer_ratios_compare_with_the_best_router_when_routers_ran() -> None:
    epp = _result("epp", hit=0.9, p90=100.0, tok=500.0)
    rr = _result("rr", hit=0.3, p90=20.0, tok=900.0)
    sg = _result("sglang", hit=1.0, p90=200.0, tok=400.0)
    vl = _result("vllm", hit=0.95, p90=50.0, tok=300.0)
    skipped = TargetResult("lr", "LR", status="skipped", reason="x")
    add_peer_ratios([epp, rr, sg, vl, skipped], ["sglang", "vllm"])
    assert epp.vs_best_peer == {
        "oracle_share": 0.9, "ttft_p50_ms": 2.0, "ttft_p90_ms": 2.0, "out_tok_per_s": 1.25,
    }  # fmt: skip
    assert epp.best_peer == {
        "oracle_share": "sglang", "ttft_p50_ms": "vllm", "ttft_p90_ms": "vllm",
        "out_tok_per_s": "sglang",
    }  # fmt: skip
    assert sg.vs_best_peer["oracle_share"] == pytest.approx(1.0 / 0.95, abs=1e-3)
    assert skipped.vs_best_peer == {}


def test_peer_ratios_fall_back_to_the_baselines_when_no_router_ran() -> None:
    epp = _result("epp", hit=0.9, p90=100.0, tok=500.0)
    rr = _result("rr", hit=0.3, p90=20.0, tok=1000.0)
    add_peer_ratios([epp, rr], ["sglang", "vllm"])
    assert epp.vs_best_peer["oracle_share"] == 3.0
    assert epp.best_peer["out_tok_per_s"] == "rr"
    assert rr.vs_best_peer == {}  # no other peer to compare with


def _report() -> dict[str, Any]:
    epp = summarize(
        TargetResult("epp", "EPP (default config) via Envoy"),
        [_outcome(i, "pod-0", 0.02, objective="chat") for i in range(4)],
        _sim_delta({"pod-0": 4, "pod-1": 0}, 400, 300),
        0.8,
        {"epp": 0.04, "envoy": 0.02},
        {"fresh": [0.003], "reused": [0.004]},
    )
    epp.peak_rss_mb = {"epp": 70.0, "envoy": 60.0}
    sglang = TargetResult("sglang", "sglang-router cache_aware", "skipped", "pip failed")
    return {
        "run": {
            "started": "2026-01-01 00:00 UTC", "scale": "default", "seed": 1, "cpus": 2,
            "targets": ["epp", "sglang"],
        },
        "workloads": [
            {
                "name": "d", "title": "overload", "description": "synthetic", "requests": 4,
                "concurrency": 8,
                "fleet": {"pods": 2, "kv_tokens_per_pod": 32000, "time_scale": 1.0},
                "shape": {}, "oracle": {"achievable_reuse": 0.8}, "objectives": [["chat", 10]],
                "results": [epp.as_json(), sglang.as_json()],
            }
        ],
    }  # fmt: skip


def test_markdown_shows_rows_skips_and_objectives_when_rendered_from_a_result() -> None:
    text = render_markdown(_report())
    row = next(line for line in text.splitlines() if line.startswith("| EPP"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:8] == ["EPP (default config) via Envoy", "4 / 0", "75.0%", "93.8%", "20.0",
                         "20.0", "20.0", "3.0 / 4.0"]  # fmt: skip
    assert cells[12] == "15.00 (epp 10.00 · envoy 5.00)"  # (0.04 + 0.02) s / 4 requests, split
    assert cells[13] == "-"  # measured without the idle rates
    assert cells[14] == "130"
    assert "sglang-router cache_aware: skipped (pip failed)" in text
    assert "EPP process alone: 10.00 ms CPU per request, peak RSS 70 MB" in text
    assert "| EPP (default config) via Envoy | chat (10) | 4 | 4 | 0 | 0 | 0 | 20 | 20 |" in text
    assert "oracle's achievable reuse **80.0%**" in text


def test_write_creates_json_markdown_and_plots_when_matplotlib_is_installed(
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    paths = write(_report(), tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        ["results.json", "report.md", "ttft_cdf.png", "hit_ratio.png", "per_pod_load.png"]
    )
    assert json.loads((tmp_path / "results.json").read_text())["run"]["seed"] == 1
    assert (tmp_path / "ttft_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    restored = TargetResult.from_json(json.loads((tmp_path / "results.json").read_text())[
        "workloads"][0]["results"][0])  # fmt: skip
    assert restored.ok == 4 and restored.target == "epp"


def test_cpu_net_of_idle_subtracts_each_process_rate_over_the_run() -> None:
    report = _report()
    epp = TargetResult.from_json(report["workloads"][0]["results"][0])
    # the EPP idled at 1% of a core, Envoy at 5%, over a 2 s run; Envoy's rate is more than
    # its own run's CPU, and its net figure is floored at 0
    net_of_idle(epp, {"epp": 0.01, "envoy": 0.05}, 2.0)
    assert epp.cpu_net_s == {"epp": 0.02, "envoy": 0.0}
    assert epp.cpu_ms_per_req_net == pytest.approx(5.0)
    report["workloads"][0]["results"][0] = epp.as_json()
    text = render_markdown(report)
    row = next(line for line in text.splitlines() if line.startswith("| EPP"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[13] == "5.00 (epp 5.00 · envoy 0.00)"
    line = "10.00 ms CPU per request (5.00 net of its idle 1.0% of a core over the 2.0 s run)"
    assert line in text

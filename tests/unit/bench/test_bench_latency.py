"""``epp bench latency``: the workload, the attainment arithmetic and the report."""

from __future__ import annotations

import itertools
import math

import pytest

from epp_tools.bench.latency import (
    CLASSES,
    DEFAULT_TARGETS,
    FLEET,
    SLORequest,
    attainment,
    build_requests,
    main,
    prediction_error,
    report_md,
    summarize,
)
from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.runner.targets import is_known


def test_workload_is_seeded_poisson_with_the_class_shares_and_wall_clock_slos() -> None:
    requests = build_requests(rate=10.0, duration=100.0, seed=3, fleet=FLEET)
    assert requests == build_requests(rate=10.0, duration=100.0, seed=3, fleet=FLEET)
    assert 900 < len(requests) < 1100  # 10/s over 100 s
    assert all(0 <= a.at < b.at < 100 for a, b in itertools.pairwise(requests))
    shares = {c.name: sum(r.session.startswith(c.name + "-") for r in requests) for c in CLASSES}
    assert shares["chat"] / len(requests) == pytest.approx(0.6, abs=0.05)
    chat = next(r for r in requests if r.session.startswith("chat-"))
    assert chat.messages[0]["role"] == "system"
    assert chat.headers()["x-llm-d-slo-ttft-ms"] == f"{800.0 / FLEET.time_scale:g}"
    assert chat.headers()["x-llm-d-slo-tpot-ms"] == f"{60.0 / FLEET.time_scale:g}"
    assert chat.body()["stream"] is True and chat.max_tokens == 48


def _request(name: str, ttft: float = 100.0, tpot: float = 10.0) -> SLORequest:
    return SLORequest(name, 0, "m", ({"role": "user", "content": "x"},), 4, 0.0, "", "", "chat",
                      None, ttft, tpot)  # fmt: skip


def _outcome(status: int, ttft_s: float = math.nan, itl_s: float = math.nan) -> Outcome:
    return Outcome(0, "s", "", status, ttft=ttft_s, itl=itl_s, tokens=2 if status == 200 else 0)


def test_attainment_counts_both_slos_and_failures() -> None:
    requests = [_request(f"chat-{i}") for i in range(4)] + [_request("doc-4")]
    outcomes = [
        _outcome(200, 0.05, 0.005),  # both met
        _outcome(200, 0.05, 0.02),  # TTFT met, TPOT missed
        _outcome(200, 0.2, 0.005),  # TTFT missed
        _outcome(429),  # rejected
        _outcome(500),  # failed
    ]
    result = attainment(outcomes, requests, FLEET)
    assert result["slo_attainment"] == pytest.approx(1 / 5)
    assert result["ttft_attainment"] == pytest.approx(2 / 5)
    assert (result["rejected"], result["failed"]) == (1, 1)
    assert result["classes"]["chat"]["slo_attainment"] == pytest.approx(1 / 4)
    assert result["classes"]["doc"]["requests"] == 1
    assert result["ttft_p50_ms"] == pytest.approx(50.0 * FLEET.time_scale)  # simulated ms


def test_prediction_error_in_simulated_ms_and_report() -> None:
    state = {
        "predictionError": {
            "ttft": {
                "n": 10,
                "maeMs": 20.0,
                "biasMs": -5.0,
                "mape": 0.2,
                "p50AbsPctError": 0.1,
                "p90AbsPctError": 0.5,
            },
            "tpot": {"n": 0},
        }
    }
    error = prediction_error(state, time_scale=2.0)
    assert error == {
        "ttft": {
            "n": 10,
            "mae_wall_ms": 20.0,
            "mae_sim_ms": 40.0,
            "bias_sim_ms": -10.0,
            "mape": 0.2,
            "p50_abs_pct_error": 0.1,
            "p90_abs_pct_error": 0.5,
        },
    }
    rows = [
        {"target": "epp:x.yaml", "label": "EPP (x)", "prediction_error": error, "seed": seed,
         "load_at_start": 1.5, **attainment([_outcome(200, t, 0.005)], [_request("chat-0")], FLEET)}
        for seed, t in ((1, 0.05), (2, 0.5), (3, 0.05))
    ]  # fmt: skip
    summary = summarize(rows, ["epp:x.yaml", "epp:absent.yaml"])
    assert len(summary) == 1 and summary[0]["runs"] == 3
    assert summary[0]["slo_attainment"] == 1.0 and summary[0]["slo_attainment_range"] == [0, 1]
    assert summary[0]["ttft_mape"] == 0.2
    report = {"command": "epp bench latency", "date": "d", "machine": "m",
              "requests": {1: 1, 2: 1, 3: 1}, "measured_from_s": 0.0, "summary": summary,
              "results": rows}  # fmt: skip
    text = report_md(report)
    assert (
        "| EPP (x) | 100.0% (0.0%-100.0%) | 100.0% (0.0%-100.0%) | 100 | 20.0% | 10.0% | - | - |"
        in text
    )
    assert "| EPP (x) | 2 | 1.5 | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% |" in text
    assert "| EPP (x) | 1 | TTFT | 10 | 40.0 | -10.0 | 20.0% | 10.0% | 50.0% |" in text


def test_default_targets_are_the_shipped_configs() -> None:
    assert all(is_known(key) for key in DEFAULT_TARGETS)


def test_cli_refuses_targets_other_than_epp_configs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--targets", "rr"])
    assert "epp:<existing config.yaml>" in capsys.readouterr().err

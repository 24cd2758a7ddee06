"""``latency-slo-admitter``: a sheddable request with an SLO is rejected when no endpoint is
predicted to meet it and none is idle or cold."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import DropReason, Endpoint, ErrorCode
from epp.plugin.latency import LATENCY_PREDICTION_INFO, LatencyPredictionInfo
from epp.plugin.params import decode
from epp.plugin.testing import check_admitter
from epp.plugins.flow.latency_slo import LatencySLOAdmitter
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

KEY = LATENCY_PREDICTION_INFO.key("predicted-latency-producer")
SLO = {"x-llm-d-slo-ttft-ms": "500"}


def _admitter(**params: Any) -> LatencySLOAdmitter:
    return LatencySLOAdmitter(
        name="slo", params=decode(LatencySLOAdmitter.Params, params), handle=FakeHandle()
    )


def _busy(i: int) -> Endpoint:
    return make_endpoint(i, kv=0.5, running=3)


def _request(valid: list[bool], *, priority: int = -1, headers: Any = None, key: str = KEY) -> Any:
    infos = {
        _busy(i).id: LatencyPredictionInfo(v, True, 1.0 if v else -1.0, 0.0, 10.0, 0.0)
        for i, v in enumerate(valid)
    }
    hdrs = SLO if headers is None else headers
    return make_request(priority=priority, headers=hdrs, attributes={key: infos})


def _admit(admitter: LatencySLOAdmitter, request: Any, endpoints: list[Endpoint]) -> Any:
    return admitter.admit(make_cycle(), request, endpoints)


BUSY = [_busy(i) for i in range(3)]


def test_rejects_a_sheddable_request_no_endpoint_can_serve() -> None:
    error = _admit(_admitter(), _request([False, False, False]), BUSY)
    assert error is not None
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    assert error.drop_reason == DropReason.SATURATED


def test_admits_when_one_endpoint_meets_the_slo() -> None:
    assert _admit(_admitter(), _request([False, True, False]), BUSY) is None


@pytest.mark.parametrize(
    "spare",
    [
        make_endpoint(3, kv=0.5, running=0),  # idle
        make_endpoint(3, kv=0.01, running=5),  # cold
        dataclasses.replace(make_endpoint(3), metrics=None),  # no metrics yet
    ],
    ids=["idle", "cold", "unscraped"],
)
def test_admits_when_an_endpoint_is_idle_or_cold(spare: Endpoint) -> None:
    assert _admit(_admitter(), _request([False, False, False]), [*BUSY, spare]) is None


@pytest.mark.parametrize(
    ("priority", "headers"),
    [
        (0, SLO),  # not sheddable
        (5, SLO),
        (-1, {}),  # no SLO header
        (-1, {"x-llm-d-slo-ttft-ms": "abc"}),  # not a number: no SLO
        (-1, {"x-llm-d-slo-ttft-ms": "0", "x-llm-d-slo-tpot-ms": "0"}),
    ],
)
def test_admits_without_a_reason_to_judge(priority: int, headers: dict[str, str]) -> None:
    request = _request([False, False, False], priority=priority, headers=headers)
    assert _admit(_admitter(), request, BUSY) is None


@pytest.mark.parametrize("header", ["x-slo-tpot-ms", "x-llm-d-slo-tpot-ms", "x-slo-ttft-ms"])
def test_any_slo_header_or_alias_counts(header: str) -> None:
    request = _request([False, False, False], headers={header: "20"})
    assert _admit(_admitter(), request, BUSY) is not None


def test_admits_without_predictions() -> None:
    assert _admit(_admitter(), make_request(priority=-1, headers=SLO), BUSY) is None
    other = _request([False, False, False], key=LATENCY_PREDICTION_INFO.key("other"))
    assert _admit(_admitter(), other, BUSY) is None
    assert _admit(_admitter(latencyPredictionInfoProducerName="other"), other, BUSY) is not None


def test_contract() -> None:
    check_admitter(_admitter(), _request([False, False, False]), BUSY)

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import (
    InferenceRequest,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.plugin.params import ParamError, decode
from epp.plugins.flow.concurrency import ConcurrencyDetector
from tests.builders import NOW, handle, make_cycle, make_endpoint
from tests.unit.flowcontrol.flow_builders import build_plugin, request

EPS = [make_endpoint(i) for i in range(2)]


def _detector(**params: Any) -> ConcurrencyDetector:
    detector: ConcurrencyDetector = build_plugin(handle(), "concurrency-detector", **params)
    return detector


def _schedule(detector: ConcurrencyDetector, req: InferenceRequest, endpoint: int) -> None:
    result = SchedulingResult({"default": ProfileResult(targets=(EPS[endpoint],))}, "default")
    detector.pre_request(req, result)


def _tokens(n: int) -> dict[str, Any]:
    return {"TokenizedPrompt/token-producer": TokenizedPrompt.from_token_ids([[7] * n])}


def _load(detector: ConcurrencyDetector, placement: list[tuple[int, int]]) -> None:
    """Schedule one request per (endpoint, prompt tokens) pair."""
    for i, (endpoint, tokens) in enumerate(placement):
        _schedule(detector, request(f"r{i}", attributes=_tokens(tokens)), endpoint)


@pytest.mark.parametrize(
    ("params", "placement", "expected"),
    [
        pytest.param({"maxConcurrency": 4}, [], 0.0, id="requests-idle"),
        # 3 requests over 2 endpoints * 4 = 0.375
        pytest.param({"maxConcurrency": 4}, [(0, 1), (0, 1), (1, 1)], 0.375, id="requests"),
        pytest.param(
            {"concurrencyMode": "tokens", "maxTokenConcurrency": 100},
            [(0, 50), (1, 100)],
            0.75,
            id="tokens",
        ),
        # ep0: max(2/4, 20/100)=0.5 ; ep1: max(0/4, 90/100)=0.9 -> mean 0.7
        pytest.param(
            {"concurrencyMode": "hybrid", "maxConcurrency": 4, "maxTokenConcurrency": 100},
            [(0, 10), (0, 10), (1, 0), (1, 90)],
            pytest.approx((0.5 + 0.9) / 2),
            id="hybrid-per-endpoint-max",
        ),
        pytest.param(
            {"maxConcurrency": 1}, [(0, 1), (0, 1), (1, 1), (1, 1)], 2.0, id="over-capacity"
        ),
    ],
)
def test_saturation_follows_mode_formula_when_requests_in_flight(
    params: dict[str, Any], placement: list[tuple[int, int]], expected: float
) -> None:
    detector = _detector(**params)
    _load(detector, placement)
    assert detector.saturation(NOW, EPS) == expected


def test_saturation_is_one_when_no_endpoints() -> None:
    assert _detector().saturation(NOW, []) == 1.0


def test_saturation_counts_reserved_requests_when_dispatched_but_not_scheduled() -> None:
    detector = _detector(maxConcurrency=2, concurrencyMode="hybrid", maxTokenConcurrency=1000)
    detector.reserve(request("a", size=400))  # 100 estimated tokens, no endpoint yet
    detector.reserve(request("b", size=400))
    assert detector.reserved == (2, 200)
    # reserved load spread over 2 endpoints: each max(1/2, 100/1000) = 0.5
    assert detector.saturation(NOW, EPS) == pytest.approx(0.5)


def test_reserved_request_moves_to_endpoint_when_scheduled() -> None:
    detector = _detector()
    req = request("a", size=40)
    detector.reserve(req)
    _schedule(detector, req, 1)
    assert detector.reserved == (0, 0)
    assert detector.load(EPS[1].id) == (1, 10)


@pytest.mark.parametrize(
    "finish",
    [
        pytest.param(
            lambda d, r: d.response_complete(r, ResponseInfo(request_id="a", headers={})),
            id="response-complete",
        ),
        pytest.param(lambda d, r: d.release(r), id="release"),
        pytest.param(
            lambda d, r: (
                d.release(r),
                d.response_complete(r, ResponseInfo(request_id="a", headers={})),
            ),
            id="both-idempotent",
        ),
    ],
)
def test_load_is_released_when_request_finishes(finish: Any) -> None:
    detector = _detector()
    req = request("a")
    _schedule(detector, req, 0)
    finish(detector, req)
    assert detector.load(EPS[0].id) == (0, 0)
    assert detector.saturation(NOW, EPS) == 0.0


def test_requests_counted_apart_when_they_share_a_request_id() -> None:
    detector = _detector()
    first, second = request("same"), request("same")
    _schedule(detector, first, 0)
    _schedule(detector, second, 0)
    detector.release(first)
    assert detector.load(EPS[0].id) == (1, 25)


@pytest.mark.parametrize(
    ("params", "placement", "kept"),
    [
        pytest.param({"maxConcurrency": 2}, [(0, 1), (0, 1), (1, 1)], [1], id="requests-limit"),
        pytest.param(
            {"maxConcurrency": 2, "headroom": 0.5},
            [(0, 1), (0, 1), (1, 1), (1, 1), (1, 1)],
            [0],
            id="headroom-raises-limit-to-3",
        ),
        pytest.param(
            {"concurrencyMode": "tokens", "maxTokenConcurrency": 50},
            [(0, 50), (1, 49)],
            [1],
            id="tokens-limit",
        ),
        pytest.param(
            {"concurrencyMode": "hybrid", "maxConcurrency": 2, "maxTokenConcurrency": 50},
            [(0, 60), (1, 1), (1, 1)],
            [],
            id="hybrid-either-dimension",
        ),
    ],
)
def test_filter_drops_endpoints_when_at_burst_limit(
    params: dict[str, Any], placement: list[tuple[int, int]], kept: list[int]
) -> None:
    detector = _detector(**params)
    _load(detector, placement)
    out = detector.filter(make_cycle(), request(), EPS)
    assert [ep.id for ep in out] == [EPS[i].id for i in kept]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"maxConcurrency": 0}, "maxConcurrency", id="zero-requests"),
        pytest.param({"maxTokenConcurrency": -1}, "maxTokenConcurrency", id="negative-tokens"),
        pytest.param({"headroom": -0.1}, "headroom", id="negative-headroom"),
        pytest.param({"concurrencyMode": "bytes"}, "must be one of", id="unknown-mode"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(ConcurrencyDetector.Params, params)


def test_it_reads_no_response_body() -> None:
    from epp.plugin import ResponseInfo
    from tests.builders import make_request

    info = ResponseInfo(request_id="r", headers={})
    assert _detector().needs_response_body(make_request(), info) is False

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import Endpoint, Filter, SaturationDetector
from epp.plugin.params import ParamError, decode
from epp.plugin.units import parse_duration as _parse_duration
from epp.plugins.flow.utilization import UtilizationDetector
from tests.builders import NOW, handle, make_cycle, make_endpoint, make_request


def _detector(**params: Any) -> UtilizationDetector:
    return UtilizationDetector(
        name="", params=decode(UtilizationDetector.Params, params), handle=handle()
    )


def _no_metrics(i: int) -> Endpoint:
    return dataclasses.replace(make_endpoint(i), metrics=None)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        pytest.param(make_endpoint(0), 0.0, id="idle"),
        pytest.param(make_endpoint(0, queue=5), 1.0, id="queue-at-threshold"),
        pytest.param(make_endpoint(0, queue=2, kv=0.2), 0.4, id="queue-dominates"),
        pytest.param(make_endpoint(0, queue=1, kv=0.6), 0.75, id="kv-dominates"),
        pytest.param(make_endpoint(0, queue=10), 2.0, id="over-threshold-not-capped"),
        pytest.param(_no_metrics(0), 1.0, id="no-metrics"),
        pytest.param(make_endpoint(0, update_time=NOW - 0.15), 0.0, id="within-staleness"),
        pytest.param(make_endpoint(0, update_time=NOW - 0.201), 1.0, id="stale"),
        pytest.param(make_endpoint(0, update_time=0.0), 1.0, id="never-scraped"),
    ],
)
def test_saturation_per_endpoint_when_defaults(endpoint: Endpoint, expected: float) -> None:
    assert _detector().saturation(NOW, [endpoint]) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("endpoints", "expected"),
    [
        pytest.param([], 1.0, id="empty-is-saturated"),
        pytest.param([make_endpoint(0), make_endpoint(1, queue=5)], 0.5, id="unweighted-mean"),
        pytest.param(
            [make_endpoint(0, kv=0.4), _no_metrics(1), make_endpoint(2, queue=10)],
            (0.5 + 1.0 + 2.0) / 3,
            id="mixed",
        ),
    ],
)
def test_pool_saturation_is_mean_when_several_endpoints(
    endpoints: list[Endpoint], expected: float
) -> None:
    assert _detector().saturation(NOW, endpoints) == pytest.approx(expected)


def test_saturation_uses_configured_thresholds_when_given() -> None:
    detector = _detector(
        queueDepthThreshold=10, kvCacheUtilThreshold=0.5, metricsStalenessThreshold="2s"
    )
    endpoints = [make_endpoint(0, queue=5, kv=0.1, update_time=NOW - 1.5)]
    assert detector.saturation(NOW, endpoints) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("params", "endpoints", "expected"),
    [
        pytest.param(
            {},
            [make_endpoint(0, queue=5), make_endpoint(1, queue=6), make_endpoint(2, kv=0.81)],
            [0],
            id="drops-over-thresholds",
        ),
        pytest.param(
            {},
            [make_endpoint(0), _no_metrics(1), make_endpoint(2, update_time=NOW - 1.0)],
            [0],
            id="drops-stale-and-missing",
        ),
        pytest.param(
            {"headroom": 0.2},
            [make_endpoint(0, queue=6), make_endpoint(1, queue=7), make_endpoint(2, kv=0.95)],
            [0, 2],
            id="headroom-raises-limits",
        ),
        pytest.param(
            {"headroom": 1.0},
            [make_endpoint(0, kv=1.0), make_endpoint(1, kv=1.01)],
            [0],
            id="kv-limit-capped-at-one",
        ),
        pytest.param(
            {},
            [make_endpoint(0, queue=9), _no_metrics(1)],
            [0, 1],
            id="all-dropped-returns-original",
        ),
        pytest.param({}, [], [], id="empty"),
    ],
)
def test_filter_drops_saturated_endpoints_when_placed_in_profile(
    params: dict[str, Any], endpoints: list[Endpoint], expected: list[int]
) -> None:
    kept = _detector(**params).filter(make_cycle(), make_request(), endpoints)
    assert [endpoints.index(ep) for ep in kept] == expected


def test_filter_judges_staleness_by_cycle_clock_when_filtering() -> None:
    endpoints = [make_endpoint(0, update_time=NOW), make_endpoint(1, update_time=NOW + 5)]
    kept = _detector().filter(make_cycle(now=NOW + 5), make_request(), endpoints)
    assert [ep.id for ep in kept] == [endpoints[1].id]


def test_params_default_when_not_configured() -> None:
    p = decode(UtilizationDetector.Params, None)
    assert (
        p.queue_depth_threshold,
        p.kv_cache_util_threshold,
        p.metrics_staleness_threshold,
        p.staleness_seconds,
        p.headroom,
        p.staleness_policy,
    ) == (5, 0.8, "200ms", pytest.approx(0.2), 0.0, "saturated")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"queueDepthThreshold": 0}, "queueDepthThreshold", id="queue-zero"),
        pytest.param({"kvCacheUtilThreshold": 0.0}, "kvCacheUtilThreshold", id="kv-zero"),
        pytest.param({"kvCacheUtilThreshold": 1.5}, "kvCacheUtilThreshold", id="kv-above-one"),
        pytest.param({"headroom": -0.1}, "headroom", id="headroom-negative"),
        pytest.param({"metricsStalenessThreshold": "soon"}, "invalid duration", id="bad-duration"),
        pytest.param({"metricsStalenessThreshold": "0s"}, "metricsStaleness", id="zero-duration"),
        pytest.param({"metricsStalenessThreshold": 200}, "expected a string", id="number"),
        pytest.param({"stalenessSeconds": 1.0}, "stalenessSeconds", id="derived-not-settable"),
        pytest.param({"threshold": 1}, "threshold", id="unknown-key"),
        pytest.param({"stalenessPolicy": "bogus"}, "stalenessPolicy", id="bad-policy"),
        pytest.param({"stalenessPolicy": "Ignore"}, "stalenessPolicy", id="policy-case"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(UtilizationDetector.Params, params)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("200ms", 0.2, id="ms"),
        pytest.param("0", 0.0, id="bare-zero"),
        pytest.param("1.5s", 1.5, id="fractional"),
        pytest.param("1h2m3s", 3723.0, id="compound"),
        pytest.param("1m30.5s", 90.5, id="compound-fraction"),
        pytest.param(".5s", 0.5, id="leading-dot"),
        pytest.param("250us", 250e-6, id="us"),
        pytest.param("250\u00b5s", 250e-6, id="micro-sign"),
        pytest.param("10ns", 10e-9, id="ns"),
        pytest.param("+2s", 2.0, id="plus"),
        pytest.param("-2s", -2.0, id="minus"),
    ],
)
def test_parse_duration_returns_seconds_when_valid(text: str, seconds: float) -> None:
    assert _parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("200", id="no-unit"),
        pytest.param("1d", id="unknown-unit"),
        pytest.param("ms", id="unit-only"),
        pytest.param("1s garbage", id="trailing"),
        pytest.param("-", id="sign-only"),
    ],
)
def test_parse_duration_raises_when_invalid(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        _parse_duration(text)


def test_plugin_is_detector_and_filter_when_constructed() -> None:
    plugin = _detector()
    assert isinstance(plugin, SaturationDetector)
    assert isinstance(plugin, Filter)
    assert plugin.typed_name.type == "utilization-detector"


_STALE = NOW - 1.0
_FRESH_AND_STALE = [make_endpoint(0, queue=1), make_endpoint(1, queue=4, update_time=_STALE)]


@pytest.mark.parametrize(
    ("policy", "endpoints", "expected"),
    [
        pytest.param("saturated", _FRESH_AND_STALE, (0.2 + 1.0) / 2, id="saturated-counts-1"),
        pytest.param("ignore", _FRESH_AND_STALE, 0.2, id="ignore-leaves-the-mean"),
        pytest.param("exclude", _FRESH_AND_STALE, 0.2, id="exclude-leaves-the-mean"),
        pytest.param("saturated", [_no_metrics(0)], 1.0, id="saturated-all-stale"),
        pytest.param("ignore", [_no_metrics(0), _no_metrics(1)], 0.0, id="ignore-all-stale"),
        pytest.param("exclude", [make_endpoint(0, update_time=_STALE)], 0.0, id="exclude-all"),
        pytest.param("ignore", [], 1.0, id="ignore-empty-is-saturated"),
    ],
)
def test_saturation_follows_the_staleness_policy_when_metrics_are_stale(
    policy: str, endpoints: list[Endpoint], expected: float
) -> None:
    assert _detector(stalenessPolicy=policy).saturation(NOW, endpoints) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("policy", "endpoints", "expected"),
    [
        pytest.param("saturated", _FRESH_AND_STALE, [0, 1], id="saturated-keeps-stale"),
        pytest.param("ignore", _FRESH_AND_STALE, [0, 1], id="ignore-keeps-stale"),
        pytest.param("exclude", _FRESH_AND_STALE, [0], id="exclude-drops-stale"),
        pytest.param(
            "exclude", [make_endpoint(0), _no_metrics(1)], [0], id="exclude-drops-unscraped"
        ),
        pytest.param(
            "exclude",
            [make_endpoint(0, update_time=_STALE), _no_metrics(1)],
            [0, 1],
            id="exclude-all-stale-keeps-all",
        ),
    ],
)
def test_routable_drops_stale_endpoints_only_when_policy_is_exclude(
    policy: str, endpoints: list[Endpoint], expected: list[int]
) -> None:
    kept = _detector(stalenessPolicy=policy).routable(NOW, endpoints)
    assert [endpoints.index(ep) for ep in kept] == expected


def test_stale_gauge_counts_stale_endpoints_when_policy_is_ignore() -> None:
    assert _detector(stalenessPolicy="ignore").stale_endpoints(NOW, _FRESH_AND_STALE) == 1


def _sized(i: int, kv: float, update_time: float = NOW, blocks: int = 1000) -> Endpoint:
    ep = make_endpoint(i, kv=kv, update_time=update_time)
    assert ep.metrics is not None
    metrics = dataclasses.replace(ep.metrics, cache_num_blocks=blocks, cache_block_size=16)
    return dataclasses.replace(ep, metrics=metrics)


def _sent(rid: str, prompt_tokens: int, max_tokens: int) -> Any:
    from epp.plugin import RequestBody
    from epp.plugin.prefix import TokenizedPrompt

    body = RequestBody("chat", {}, b"{}", max_output_tokens=max_tokens)
    req = make_request(request_id=rid, body=body)
    req.attributes["TokenizedPrompt/token-producer"] = TokenizedPrompt.from_token_ids(
        [list(range(prompt_tokens))]
    )
    return req


def _dispatch(d: UtilizationDetector, req: Any, ep: Endpoint) -> None:
    from epp.plugin import ProfileResult, SchedulingResult

    d.pre_request(req, SchedulingResult({"default": ProfileResult((ep,))}, "default"))


def test_what_this_epp_sent_counts_before_the_next_scrape() -> None:
    d = _detector(kvCacheUtilThreshold=0.8)
    ep = _sized(0, kv=0.2)  # 16,000 tokens, 20% used at the scrape
    assert d.saturation(NOW, [ep]) == pytest.approx(0.25)
    d.handle.now = NOW + 0.05  # type: ignore[attr-defined]
    _dispatch(d, _sent("a", 6_000, 400), ep)  # after the scrape: +6,400 tokens
    assert d.saturation(NOW + 0.05, [ep]) == pytest.approx((0.2 + 0.4) / 0.8)
    from epp.plugin import ResponseInfo

    d.response_complete(_sent("a", 6_000, 400), ResponseInfo(request_id="a", headers={}))
    assert d.saturation(NOW + 0.06, [ep]) == pytest.approx(0.25)


def test_requests_queued_at_the_server_count_although_the_scrape_shows_none() -> None:
    d = _detector(kvCacheUtilThreshold=1.0)
    d.handle.now = NOW - 1.0  # type: ignore[attr-defined]
    for n in range(3):  # sent before the scrape, which found them waiting, holding no KV
        _dispatch(d, _sent(f"q{n}", 4_000, 800), _sized(0, kv=0.05))
    ep = _sized(0, kv=0.05)
    assert d.saturation(NOW, [ep]) == pytest.approx(3 * 4_800 / 16_000)
    assert d.filter(make_cycle(), make_request(), [ep, _sized(1, kv=0.5)]) == [ep, _sized(1, 0.5)]
    full = _detector(kvCacheUtilThreshold=0.8)
    full.handle.now = NOW - 1.0  # type: ignore[attr-defined]
    _dispatch(full, _sent("big", 14_000, 0), ep)
    assert full.filter(make_cycle(), make_request(), [ep, _sized(1, kv=0.5)]) == [_sized(1, 0.5)]


def test_requests_flow_control_dispatched_count_until_they_are_scheduled() -> None:
    d = _detector(kvCacheUtilThreshold=1.0)
    eps = [_sized(0, kv=0.0), _sized(1, kv=0.0)]
    req = _sent("r", 7_000, 1_000)
    d.reserve(req)
    d.reserve(req)  # once
    assert d.saturation(NOW, eps) == pytest.approx(8_000 / 2 / 16_000)
    _dispatch(d, req, eps[1])  # scheduled: on its endpoint now
    assert d.saturation(NOW, eps) == pytest.approx((0 + 8_000 / 16_000) / 2)
    d.release(req)
    d.release(req)
    assert d.saturation(NOW, eps) == pytest.approx(0.0)

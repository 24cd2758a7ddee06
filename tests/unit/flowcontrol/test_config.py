from __future__ import annotations

from typing import Any

import pytest

from epp.config.loader import ensure_flow_defaults
from epp.config.schema import FlowControlSpec
from epp.flowcontrol.config import FlowControlConfigError, resolve_config
from epp.plugin.params import decode
from tests.builders import handle
from tests.unit.flowcontrol.flow_builders import build_plugin

DEFAULT_TYPES = [
    "fcfs-ordering-policy",
    "global-strict-fairness-policy",
    "static-usage-limit-policy",
]


def _plugins(*extra: tuple[str, str]) -> dict[str, Any]:
    h = handle()
    out = {t: build_plugin(h, t) for t in DEFAULT_TYPES}
    for type_name, name in extra:
        out[name] = build_plugin(h, type_name, name)
    return out


def _resolve(raw: dict[str, Any] | None, *extra: tuple[str, str]) -> Any:
    spec = decode(FlowControlSpec, raw) if raw is not None else None
    return resolve_config(spec, _plugins(*extra))


@pytest.mark.parametrize(
    ("declared", "added"),
    [
        pytest.param({}, DEFAULT_TYPES, id="none-declared"),
        pytest.param({"fcfs-ordering-policy": object()}, DEFAULT_TYPES[1:], id="one-declared"),
        pytest.param({t: object() for t in DEFAULT_TYPES}, [], id="all-declared"),
    ],
)
def test_defaults_added_when_missing(declared: dict[str, Any], added: list[str]) -> None:
    calls: list[str] = []
    ensure_flow_defaults(calls.append, declared)
    assert calls == added


def test_defaults_match_upstream_when_no_spec() -> None:
    cfg = _resolve(None)
    assert (cfg.default_ttl, cfg.no_endpoint_ttl) == (60.0, 60.0)
    assert (cfg.max_requests, cfg.max_bytes) == (0, 0)
    assert (cfg.default_band.max_requests, cfg.default_band.max_bytes) == (5000, 1_000_000_000)
    assert cfg.negative_band is cfg.default_band
    assert cfg.usage_limit.typed_name.type == "static-usage-limit-policy"
    assert cfg.default_band.fairness.typed_name.type == "global-strict-fairness-policy"
    assert cfg.default_band.ordering.typed_name.type == "fcfs-ordering-policy"
    assert not cfg.enable_eviction and cfg.adjusters == ()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param({"defaultRequestTTL": "30s"}, (30.0, 30.0), id="no-endpoint-follows-default"),
        pytest.param(
            {"defaultRequestTTL": "30s", "noEndpointRequestTTL": "2m"}, (30.0, 120.0), id="both"
        ),
        pytest.param({"defaultRequestTTL": "0s"}, (0.0, 0.0), id="disabled"),
    ],
)
def test_ttls_parsed_when_given(raw: dict[str, Any], expected: tuple[float, float]) -> None:
    cfg = _resolve(raw)
    assert (cfg.default_ttl, cfg.no_endpoint_ttl) == expected


def test_band_settings_resolved_when_configured() -> None:
    cfg = _resolve(
        {
            "maxBytes": "1Gi",
            "maxRequests": 7,
            "priorityBands": [
                {"priority": 10, "maxRequests": "200", "orderingPolicyRef": "edf"},
                {"priority": 2, "maxBytes": "0", "fairnessPolicyRef": "rr"},
            ],
            "defaultNegativePriorityBand": {"maxRequests": "1k"},
        },
        ("edf-ordering-policy", "edf"),
        ("round-robin-fairness-policy", "rr"),
    )
    assert (cfg.max_bytes, cfg.max_requests) == (2**30, 7)
    assert cfg.bands[10].max_requests == 200 and cfg.bands[10].max_bytes == 1_000_000_000
    assert cfg.bands[10].ordering.typed_name.name == "edf"
    assert cfg.bands[2].max_bytes == 1_000_000_000  # "0" means the default
    assert cfg.bands[2].fairness.typed_name.name == "rr"
    assert cfg.template(-4).max_requests == 1000
    assert cfg.template(4) is cfg.default_band


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            {"priorityBands": [{"priority": 1, "fairnessPolicyRef": "nope"}]},
            r"priorityBands\[0\].fairnessPolicyRef: no plugin named 'nope'",
            id="unknown-ref",
        ),
        pytest.param(
            {
                "priorityBands": [
                    {"priority": 1, "orderingPolicyRef": "global-strict-fairness-policy"}
                ]
            },
            "is not an ordering policy",
            id="wrong-role",
        ),
        pytest.param(
            {"priorityBands": [{"priority": 3}, {"priority": 3}]},
            r"priorityBands\[1\].priority: duplicate priority 3",
            id="duplicate-band",
        ),
        pytest.param(
            {"defaultPriorityBand": {"maxBytes": "lots"}},
            "defaultPriorityBand.maxBytes: invalid quantity",
            id="bad-quantity",
        ),
        pytest.param(
            {"defaultRequestTTL": "-1s"}, "defaultRequestTTL: must be >= 0", id="negative-ttl"
        ),
        pytest.param(
            {"noEndpointRequestTTL": "1 minute"}, "noEndpointRequestTTL", id="bad-duration"
        ),
        pytest.param(
            {"usageLimitPolicyPluginRef": "fcfs-ordering-policy"},
            "usageLimitPolicyPluginRef: plugin 'fcfs-ordering-policy' is not a usage-limit",
            id="usage-limit-wrong-role",
        ),
    ],
)
def test_config_rejected_when_invalid(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(FlowControlConfigError, match=message):
        _resolve(raw)


def test_missing_default_policy_named_when_loader_did_not_add_it() -> None:
    with pytest.raises(FlowControlConfigError, match="fcfs-ordering-policy"):
        resolve_config(None, {})


def test_priority_adjusters_collected_when_declared() -> None:
    cfg = _resolve({}, ("turn-priority", "turns"))
    assert [a.typed_name.name for a in cfg.adjusters] == ["turns"]

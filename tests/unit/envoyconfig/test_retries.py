"""The retry policy and the model-server cluster's failure handling ``epp envoy-config`` writes
(``epp.envoyconfig.retries``): which failures are retried, where a retry can go, and when a pod
is ejected. Behaviour under load, with the real Envoy, is ``epp bench day2``'s."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from epp.envoyconfig.cli import generate, parser

EPP = ["--epp-address", "127.0.0.1:9002"]
POOL = ["--pool-endpoint", "10.0.0.7:8000", "--pool-endpoint", "10.0.0.8:8000"]


def _bootstrap(*args: str) -> dict[str, Any]:
    return dict(yaml.safe_load(generate(parser().parse_args([*EPP, *args]))))


def _routes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    (listener,) = doc["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return list(hcm["route_config"]["virtual_hosts"][0]["routes"])


def _pool(doc: dict[str, Any]) -> dict[str, Any]:
    (pool,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == "pool"]
    return dict(pool)


def test_original_dst_retries_only_what_never_got_an_answer_and_on_the_same_pod() -> None:
    doc = _bootstrap()
    (route,) = _routes(doc)
    policy = route["route"]["retry_policy"]
    # the failures that happen before a response starts; no HTTP status, no timeout per try
    assert policy == {"retry_on": "connect-failure,refused-stream,reset", "num_retries": 2}
    pool = _pool(doc)
    assert pool["type"] == "ORIGINAL_DST"
    assert "outlier_detection" not in pool  # its load balancer ignores a host's state


def test_a_known_pool_retries_elsewhere_and_ejects_failing_pods() -> None:
    doc = _bootstrap(*POOL)
    (route,) = _routes(doc)
    policy = route["route"]["retry_policy"]
    assert policy["retry_on"] == "connect-failure,refused-stream,reset"
    assert "per_try_timeout" not in policy
    (predicate,) = policy["retry_host_predicate"]
    assert predicate["name"] == "envoy.retry_host_predicates.previous_hosts"
    pool = _pool(doc)
    assert pool["type"] == "STATIC" and "lb_policy" not in pool
    hosts = [
        e["endpoint"]["address"]["socket_address"]
        for e in pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert [(h["address"], h["port_value"]) for h in hosts] == [
        ("10.0.0.7", 8000),
        ("10.0.0.8", 8000),
    ]
    (lb,) = pool["load_balancing_policy"]["policies"]
    override = lb["typed_extension_config"]["typed_config"]
    assert override["override_host_sources"][0] == {"header": "x-gateway-destination-endpoint"}
    assert override["override_host_sources"][1]["metadata"]["key"] == "envoy.lb"
    assert override["selected_host_key"]["path"] == [
        {"key": "x-gateway-destination-endpoint-served"}
    ]
    (fallback,) = override["fallback_policy"]["policies"]
    assert fallback["typed_extension_config"]["name"].endswith("least_request")
    outlier = pool["outlier_detection"]
    assert outlier["split_external_local_origin_errors"] is True
    assert outlier["consecutive_local_origin_failure"] == 1
    assert outlier["enforcing_consecutive_local_origin_failure"] == 100
    assert outlier["max_ejection_percent"] == 50


@pytest.mark.parametrize("pool", [[], POOL], ids=["original-dst", "known-pool"])
def test_retries_are_budgeted_by_share_not_envoys_three_at_once(pool: list[str]) -> None:
    # Envoy's default lets 3 retries run at once per cluster: a pod dying under load failed the
    # rest of the requests routed to it (tests/integration/test_envoy_pool_retries.py)
    (threshold,) = _pool(_bootstrap(*pool))["circuit_breakers"]["thresholds"]
    assert threshold["retry_budget"] == {
        "budget_percent": {"value": 50.0},
        "min_retry_concurrency": 32,
    }


def test_a_retry_picks_up_to_ten_times_to_avoid_a_pod_already_tried() -> None:
    # least request favours the pod a try just failed on: it holds no requests
    (route,) = _routes(_bootstrap(*POOL))
    assert route["route"]["retry_policy"]["host_selection_retry_max_attempts"] == "10"


def test_a_hostname_pool_is_resolved_by_dns_and_the_fallback_route_retries_too() -> None:
    doc = _bootstrap(
        "--body", "buffered", "--fail-open", "--fallback", "models:8000",
        "--pool-endpoint", "models:8000",
    )  # fmt: skip
    assert _pool(doc)["type"] == "STRICT_DNS"
    decided, fallback = _routes(doc)
    for route in (decided, fallback):
        assert route["route"]["retry_policy"]["retry_host_predicate"], route


def test_retries_0_writes_no_retry_policy() -> None:
    (route,) = _routes(_bootstrap("--retries", "0", *POOL))
    assert "retry_policy" not in route["route"]


def test_negative_retries_are_refused() -> None:
    with pytest.raises(ValueError, match="retries"):
        generate(parser().parse_args([*EPP, "--retries", "-1"]))


def test_a_pool_health_path_health_checks_each_model_server_and_none_by_default() -> None:
    assert "health_checks" not in _pool(_bootstrap(*POOL))
    (check,) = _pool(_bootstrap(*POOL, "--pool-health-path", "/health"))["health_checks"]
    assert check["http_health_check"] == {"path": "/health"}
    assert (check["unhealthy_threshold"], check["healthy_threshold"]) == (1, 1)


def test_a_health_checked_pool_never_routes_retries_to_failing_addresses_in_panic() -> None:
    # Envoy's default panic threshold (50%) would spread retries over every listed address once
    # half of them fail their checks: a roll's gone pods and not-yet-started replacements
    checked = _pool(_bootstrap(*POOL, "--pool-health-path", "/health"))
    assert checked["common_lb_config"]["healthy_panic_threshold"] in ({}, {"value": 0.0})
    assert "common_lb_config" not in _pool(_bootstrap(*POOL))

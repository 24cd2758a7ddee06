"""Pods and InferencePools → endpoints, label selectors."""

from __future__ import annotations

from typing import Any

import pytest

from epp.k8s.meta import DecodeError
from epp.k8s.pods import PodInfo, active_ports, decode_pod, pool_endpoints
from epp.k8s.pool import EndpointPool, decode_pool
from epp.plugin.selectors import LabelSelector, parse_selector
from epp_tools.bench.kube.objects import pod, pool

POOL = EndpointPool(
    name="p",
    namespace="default",
    selector=LabelSelector.from_match_labels({"app": "vllm"}),
    target_ports=(8000, 8001, 8002),
)


def info(name: str = "vllm-0", **kw: Any) -> PodInfo:
    base: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "ip": "10.0.0.5",
        "labels": {"app": "vllm"},
        "annotations": {},
        "ready": True,
        "terminating": False,
    }
    base.update(kw)
    return PodInfo(**base)


@pytest.mark.parametrize(
    ("pod_info", "expected"),
    [
        pytest.param(info(), [0, 1, 2], id="every-target-port"),
        pytest.param(info(ready=False), [], id="not-ready"),
        pytest.param(info(terminating=True), [], id="terminating"),
        pytest.param(info(ip=""), [], id="no-ip"),
        pytest.param(info(namespace="other"), [], id="other-namespace"),
        pytest.param(info(labels={"app": "sglang"}), [], id="selector-mismatch"),
        pytest.param(info(annotations={"llm-d.ai/active-ports": "8002,8000"}), [0, 2], id="active"),
        pytest.param(
            info(annotations={"inference.networking.k8s.io/active-ports": "8001"}),
            [1],
            id="legacy-active",
        ),
        pytest.param(
            info(
                annotations={
                    "llm-d.ai/active-ports": "8000",
                    "inference.networking.k8s.io/active-ports": "8001",
                }
            ),
            [0],
            id="new-annotation-wins",
        ),
        pytest.param(info(annotations={"llm-d.ai/active-ports": "9000, x"}), [], id="no-active"),
    ],
)
def test_pod_ranks_are_its_active_target_ports_when_the_pod_is_eligible(
    pod_info: PodInfo, expected: list[int]
) -> None:
    endpoints = pool_endpoints([pod_info], POOL)
    assert [e.rank for e in endpoints] == expected
    for e in endpoints:
        assert e.id == f"default/vllm-0-rank-{e.rank}"
        assert e.name == f"vllm-0-rank-{e.rank}"
        assert (e.address, e.port) == ("10.0.0.5", POOL.target_ports[e.rank])
        assert e.labels == {"app": "vllm"}


def test_endpoints_are_ordered_by_pod_name_when_several_pods_match() -> None:
    endpoints = pool_endpoints([info("b"), info("a")], POOL)
    assert [e.id for e in endpoints][:4] == [
        "default/a-rank-0",
        "default/a-rank-1",
        "default/a-rank-2",
        "default/b-rank-0",
    ]
    assert pool_endpoints([info()], None) == []


def test_active_ports_are_none_when_no_annotation_is_set() -> None:
    assert active_ports({}) is None
    assert active_ports({"llm-d.ai/active-ports": " 8000 ,8001"}) == frozenset({8000, 8001})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("8000,invalid,8002", {8000, 8002}, id="invalid-entry-skipped"),
        pytest.param("8000,-1,8002", {8000, 8002}, id="negative-skipped"),
        pytest.param("8000,8001,8000", {8000, 8001}, id="duplicates"),
        pytest.param("", set(), id="empty-means-none-active"),
        pytest.param("+8001", {8001}, id="sign"),
        pytest.param("8001abc, 8002 x", {8001, 8002}, id="leading-digits-as-sscanf"),
        pytest.param("0x1f41,0", set(), id="zero-and-hex-are-not-ports"),
    ],
)
def test_active_ports_read_entries_as_upstream_when_annotated(
    text: str, expected: set[int]
) -> None:
    assert active_ports({"llm-d.ai/active-ports": text}) == frozenset(expected)


def test_rank_keeps_its_target_port_index_when_earlier_ports_are_inactive() -> None:
    pod = info(annotations={"llm-d.ai/active-ports": "8001abc"})
    (endpoint,) = pool_endpoints([pod], POOL)
    assert (endpoint.id, endpoint.port, endpoint.rank) == ("default/vllm-0-rank-1", 8001, 1)


def test_pod_decodes_when_shaped_as_the_api_server_sends_it() -> None:
    decoded = decode_pod(pod("vllm-0", "10.0.0.9", {"app": "vllm"}, ready=False))
    assert (decoded.name, decoded.ip, decoded.ready, decoded.terminating) == (
        "vllm-0",
        "10.0.0.9",
        False,
        False,
    )
    assert decode_pod(pod("t", "10.0.0.9", terminating=True)).terminating
    pending = {"metadata": {"name": "p"}, "status": {"phase": "Pending"}}
    assert decode_pod(pending) == PodInfo("p", "default", "", {}, {}, False, False)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({"metadata": {}}, "metadata.name: required", id="no-name"),
        pytest.param({"metadata": {"name": "p", "labels": {"a": 1}}}, "labels", id="labels"),
        pytest.param({"metadata": {"name": "p"}, "status": []}, "status", id="status"),
        pytest.param(
            {"metadata": {"name": "p"}, "status": {"conditions": {}}}, "conditions", id="conds"
        ),
    ],
)
def test_pod_decode_fails_when_a_field_has_the_wrong_shape(raw: Any, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_pod(raw)


def test_pool_decodes_when_shaped_as_the_crd() -> None:
    decoded = decode_pool(
        pool("p", {"app": "vllm"}, [8000, 8002], app_protocol="kubernetes.io/h2c")
    )
    assert decoded.target_ports == (8000, 8002)
    assert decoded.app_protocol == "kubernetes.io/h2c"
    assert decoded.selector.matches({"app": "vllm", "x": "y"})
    assert not decoded.selector.matches({"app": "other"})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"targetPorts": [{"number": 1}]}, "spec.selector", id="no-selector"),
        pytest.param({"selector": {"matchLabels": {}}}, "targetPorts: required", id="no-ports"),
        pytest.param(
            {"selector": {}, "targetPorts": [{"number": 1}, {"number": 1}]}, "unique", id="dupes"
        ),
        pytest.param(
            {"selector": {}, "targetPorts": [{"number": p} for p in range(1, 10)]},
            "1 to 8",
            id="too-many",
        ),
        pytest.param({"selector": {}, "targetPorts": [{"number": 70000}]}, "range", id="range"),
        pytest.param(
            {"selector": {}, "targetPorts": [{"number": 1}], "appProtocol": "grpc"},
            "appProtocol",
            id="protocol",
        ),
    ],
)
def test_pool_decode_fails_when_the_spec_is_invalid(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_pool({"metadata": {"name": "p"}, "spec": spec})


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        pytest.param("app=vllm", {"app": "vllm"}, True, id="equals"),
        pytest.param("app=", {"app": ""}, True, id="equals-empty-value"),
        pytest.param("app==vllm", {"app": "x"}, False, id="double-equals"),
        pytest.param("app!=vllm", {}, True, id="not-equals-absent"),
        pytest.param("role in (decode, both)", {"role": "both"}, True, id="in"),
        pytest.param("role notin (prefill)", {"role": "prefill"}, False, id="notin"),
        pytest.param("gpu", {"gpu": ""}, True, id="exists"),
        pytest.param("!canary", {"canary": "1"}, False, id="absent"),
        pytest.param(
            "app=vllm,role in (a,b),!canary", {"app": "vllm", "role": "b"}, True, id="and"
        ),
    ],
)
def test_selector_matches_like_kubectl_when_parsed(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    assert parse_selector(selector).matches(labels) is matches


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty label selector"),
        ("a b", "cannot parse 'a b'"),
        ("x in ()", "lists no values"),
        ("=v", "cannot parse '=v'"),
        ("x in (a", "cannot parse"),
    ],
)
def test_selector_is_rejected_when_malformed(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_selector(text)

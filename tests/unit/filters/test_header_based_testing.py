from __future__ import annotations

import pytest

from epp.plugin import Filter, NoParams
from filters.header_based_testing import HeaderBasedTestingFilter
from tests.builders import handle, make_cycle, make_endpoint, make_request

# 0, 1: two data-parallel ranks of one IPv4 pod; 2: another pod; 3, 4: IPv6 pod ranks
ENDPOINTS = [
    make_endpoint(0, address="10.0.0.1", port=3000),
    make_endpoint(1, address="10.0.0.1", port=3002),
    make_endpoint(2, address="10.0.0.2", port=3000),
    make_endpoint(3, address="fd00::1", port=3000),
    make_endpoint(4, address="fd00::1", port=3002),
]


def _kept(headers: dict[str, str]) -> list[int]:
    plugin = HeaderBasedTestingFilter(name="", params=NoParams(), handle=handle())
    kept = plugin.filter(make_cycle(), make_request(headers=headers), ENDPOINTS)
    return [ENDPOINTS.index(ep) for ep in kept]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("10.0.0.2", [2], id="single-ip"),
        pytest.param("10.0.0.1", [0, 1], id="ip-matches-every-rank"),
        pytest.param("10.0.0.1:3002", [1], id="ip-port-exact"),
        pytest.param("10.0.0.1:9999", [], id="ip-port-no-such-port"),
        pytest.param("10.0.0.2,10.0.0.1:3000", [2, 0], id="header-order"),
        pytest.param(" 10.0.0.2 , 10.0.0.1:3002 ", [2, 1], id="spaces-trimmed"),
        pytest.param("10.0.0.2,10.0.0.2", [2], id="dedup-same-entry"),
        pytest.param("10.0.0.1:3002,10.0.0.1", [1, 0], id="dedup-ip-after-ip-port"),
        pytest.param("fd00::1", [3, 4], id="bare-ipv6"),
        pytest.param("[fd00::1]", [3, 4], id="bracketed-ipv6"),
        pytest.param("[fd00::1]:3002", [4], id="bracketed-ipv6-port"),
        pytest.param("fd00:0:0::1", [3, 4], id="ipv6-non-canonical"),
        pytest.param("256.256.256.256", [], id="unknown-ip"),
        pytest.param("10.0.0.1:abc,,10.0.0.2", [2], id="malformed-entries-skipped"),
        pytest.param("[fd00::1,10.0.0.2", [2], id="unclosed-bracket-skipped"),
        pytest.param("", [], id="empty-header"),
        pytest.param(" , ", [], id="only-separators"),
    ],
)
def test_filter_keeps_listed_endpoints_when_header_given(value: str, expected: list[int]) -> None:
    assert _kept({"test-epp-endpoint-selection": value}) == expected


def test_filter_keeps_nothing_when_header_missing() -> None:
    assert _kept({"x-other": "10.0.0.1"}) == []


def test_plugin_is_filter_when_constructed() -> None:
    plugin = HeaderBasedTestingFilter(name="", params=NoParams(), handle=handle())
    assert isinstance(plugin, Filter)
    assert plugin.typed_name.type == "header-based-testing-filter"

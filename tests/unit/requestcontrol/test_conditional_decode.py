"""Conditional decode: ``Prefer: if-available`` is routed only to an endpoint that already caches
part of the prompt, else answered 412 (epp.requestcontrol.exchange.conditional_decode)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from epp.plugin import (
    PREFIX_MATCH_INFO,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    PrefixMatchInfo,
    TypedName,
    wire,
)
from tests.unit.requestcontrol.test_director import BODY, HEADERS, director, pipeline

# the director's scheduler picks the last candidate, 192.168.1.3 (default/pod-2-rank-0)
CHOSEN, OTHER = "default/pod-2-rank-0", "default/pod-0-rank-0"


class PrefixProducer:
    """Publishes ``PrefixCacheMatchInfo/<name>`` with ``blocks`` matched on each endpoint."""

    def __init__(self, name: str, blocks: dict[str, int]) -> None:
        self.typed_name = TypedName("prefix-producer", name)
        self.blocks = blocks

    async def produce(self, request: InferenceRequest, pool: Sequence[Endpoint]) -> None:
        infos = {e.id: PrefixMatchInfo(self.blocks.get(e.id, 0), 4, 64) for e in pool}
        request.attributes[PREFIX_MATCH_INFO.key(self.typed_name.name)] = infos


@pytest.mark.parametrize(
    ("value", "conditional"),
    [
        ("if-available", True),
        ("If-Available", True),
        ("return=minimal, if-available", True),
        ("if-available;param=v", True),
        ("  if-available  ", True),
        ("return=minimal", False),
        ("if-available-but-different", False),
        ("", False),
    ],
)
def test_the_if_available_preference_is_an_rfc_7240_token(value: str, conditional: bool) -> None:
    assert wire.prefers_if_available({"prefer": value}) is conditional
    assert wire.prefers_if_available({}) is False


async def _decide(blocks: dict[str, int], *, prefer: str = "if-available", name: str = "p") -> str:
    producer = PrefixProducer(name, blocks)
    d = director(pipeline(producers=[producer], producer_timeouts=[1.0]))
    request = d.new_request({**HEADERS, "prefer": prefer})
    return (await d.decide(request, BODY, {})).destination


@pytest.mark.parametrize("name", ["approx-prefix-cache-producer", "precise-prefix-cache-producer"])
async def test_a_conditional_request_goes_to_an_endpoint_caching_its_prefix(name: str) -> None:
    assert await _decide({CHOSEN: 1}, name=name) == "192.168.1.3:8000"


@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param({}, id="cold everywhere"),
        pytest.param({OTHER: 5}, id="cached on another endpoint only"),
    ],
)
async def test_a_conditional_request_without_a_cached_prefix_is_412(blocks: dict[str, int]) -> None:
    with pytest.raises(InferenceError) as info:
        await _decide(blocks)
    err = info.value
    assert err.code is ErrorCode.PRECONDITION_FAILED and err.code.http_status == 412
    assert (
        err.body
        == "inference error: PreconditionFailed - no decode worker has the requested KV cache"
    )


async def test_without_prefix_match_info_a_conditional_request_is_412() -> None:
    d = director()
    with pytest.raises(InferenceError) as info:
        await d.decide(d.new_request({**HEADERS, "prefer": "if-available"}), BODY, {})
    assert info.value.code is ErrorCode.PRECONDITION_FAILED


async def test_other_requests_are_routed_whatever_the_cache() -> None:
    assert await _decide({}, prefer="return=minimal") == "192.168.1.3:8000"

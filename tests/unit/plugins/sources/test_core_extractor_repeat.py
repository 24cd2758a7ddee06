"""``core-metrics-extractor`` given the page its last ``Metrics`` was made of: the same values,
``update_time`` moved to now, and no parse; any other page, or other ``previous`` metrics, is
parsed as usual."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import Metrics
from epp.plugin.params import decode
from epp.plugins.sources import promtext
from epp.plugins.sources.core_extractor import CoreMetricsExtractor
from tests.builders import handle, make_endpoint

PAGE = b"vllm:num_requests_waiting 3\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"


class _CountingCache(promtext.LineCache):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def parse(self, text: bytes, wanted: frozenset[str]) -> promtext.Families:
        self.calls += 1
        return super().parse(text, wanted)


@pytest.fixture
def extractor() -> tuple[CoreMetricsExtractor, _CountingCache]:
    params: Any = decode(CoreMetricsExtractor.Params, {})
    ext = CoreMetricsExtractor(name="", params=params, handle=handle())
    cache = _CountingCache()
    ext._lines = cache
    return ext, cache


def test_the_same_page_again_moves_update_time_without_parsing(extractor) -> None:
    ext, cache = extractor
    endpoint = make_endpoint(0)
    first = ext.extract(PAGE, endpoint, Metrics(), now=1.0)
    second = ext.extract(bytes(PAGE), endpoint, first, now=2.0)
    assert cache.calls == 1
    assert second == dataclasses.replace(first, update_time=2.0)
    assert (second.waiting_queue_size, second.running_requests_size) == (3, 2)
    third = ext.extract(bytes(PAGE), endpoint, second, now=3.0)
    assert cache.calls == 1
    assert third.update_time == 3.0


def test_a_changed_page_is_parsed(extractor) -> None:
    ext, cache = extractor
    endpoint = make_endpoint(0)
    first = ext.extract(PAGE, endpoint, Metrics(), now=1.0)
    changed = PAGE.replace(b"waiting 3", b"waiting 4")
    second = ext.extract(changed, endpoint, first, now=2.0)
    assert cache.calls == 2
    assert second.waiting_queue_size == 4


def test_other_previous_metrics_are_parsed_into(extractor) -> None:
    ext, cache = extractor
    endpoint = make_endpoint(0)
    first = ext.extract(PAGE, endpoint, Metrics(), now=1.0)
    other = dataclasses.replace(first, attributes={"k/p": 1}, cache_block_size=32)
    second = ext.extract(PAGE, endpoint, other, now=2.0)
    assert cache.calls == 2
    assert second == dataclasses.replace(other, update_time=2.0)


def test_endpoints_with_the_same_page_are_kept_apart(extractor) -> None:
    ext, cache = extractor
    a, b = make_endpoint(0), make_endpoint(1)
    first_a = ext.extract(PAGE, a, Metrics(), now=1.0)
    ext.extract(PAGE, b, Metrics(), now=1.0)
    assert cache.calls == 2
    ext.extract(PAGE, a, first_a, now=2.0)
    assert cache.calls == 2
    ext.extract(PAGE, b, first_a, now=2.0)  # b's last result was another object
    assert cache.calls == 3

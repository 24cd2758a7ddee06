from __future__ import annotations

from epp.plugin import Metrics, Topology
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.params import decode
from epp.plugin.topology import topology_key
from epp.plugins.sources.core_extractor import CoreMetricsExtractor
from tests.builders import handle, make_endpoint

ATTRIBUTES = {GPU_UTILIZATION: 0.3, topology_key(): Topology(zone="z1")}


def _extract(payload: bytes, previous: Metrics) -> Metrics:
    extractor = CoreMetricsExtractor(
        name="", params=decode(CoreMetricsExtractor.Params, {}), handle=handle()
    )
    return extractor.extract(payload, make_endpoint(0), previous, now=42.0)


def test_core_extractor_keeps_attributes_published_by_other_extractors() -> None:
    out = _extract(b"vllm:num_requests_waiting 9\n", Metrics(attributes=dict(ATTRIBUTES)))
    assert out.waiting_queue_size == 9
    assert out.update_time == 42.0
    assert out.attributes == ATTRIBUTES


def test_core_extractor_keeps_attributes_when_payload_has_only_lora_info() -> None:
    previous = Metrics(attributes=dict(ATTRIBUTES))
    out = _extract(b'vllm:lora_requests_info{running_lora_adapters="a",max_lora="2"} 1\n', previous)
    assert out.active_models == frozenset({"a"})
    assert out.attributes == ATTRIBUTES

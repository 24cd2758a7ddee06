from __future__ import annotations

import dataclasses
import math

import pytest

from epp.plugin import DataKey, Endpoint, Metrics, endpoint_attribute, with_attribute
from epp.plugin.attributes import CORE_METRICS_EXTRACTOR, GPU_UTILIZATION, ScalarAttribute
from tests.builders import make_endpoint

KEY: DataKey[float] = DataKey("Load", "producer-a")
OTHER: DataKey[str] = DataKey("Note", "producer-b")


def _with(metrics: Metrics | None = None, **attrs: object) -> Endpoint:
    return dataclasses.replace(make_endpoint(0), metrics=metrics or Metrics(attributes=attrs))


def test_with_attribute_adds_value_and_keeps_other_keys_and_fields() -> None:
    base = Metrics(waiting_queue_size=3, update_time=5.0, attributes={OTHER: "x"})
    out = with_attribute(base, KEY, 0.5)
    assert out.attributes == {OTHER: "x", KEY: 0.5}
    assert (out.waiting_queue_size, out.update_time) == (3, 5.0)
    assert base.attributes == {OTHER: "x"}  # the given Metrics is not changed


def test_with_attribute_returns_same_object_when_value_unchanged() -> None:
    base = Metrics(attributes={KEY: 0.5})
    assert with_attribute(base, KEY, 0.5) is base


def test_with_attribute_none_removes_key_and_is_identity_when_absent() -> None:
    base = Metrics(attributes={KEY: 0.5, OTHER: "x"})
    assert with_attribute(base, KEY, None).attributes == {OTHER: "x"}
    bare = Metrics()
    assert with_attribute(bare, KEY, None) is bare


def test_endpoint_attribute_reads_value_or_none() -> None:
    assert endpoint_attribute(_with(attrs=None, **{KEY: 0.25}), KEY) == 0.25
    assert endpoint_attribute(_with(), KEY) is None
    assert endpoint_attribute(dataclasses.replace(make_endpoint(0), metrics=None), KEY) is None


def test_resolve_without_producer_selects_core_extractor_custom_metric() -> None:
    ref = ScalarAttribute.resolve("queue_depth", None, "test")
    assert ref.producer == CORE_METRICS_EXTRACTOR
    assert ref.read(_with(Metrics(custom={"queue_depth": 4.0}))) == 4.0
    assert ref.read(_with(Metrics(attributes={ref.key: 9.0}))) is None


def test_resolve_with_producer_reads_published_attribute() -> None:
    ref = ScalarAttribute.resolve("GPUUtilization", "dcgm-extractor", "test")
    assert ref.key == GPU_UTILIZATION
    assert ref.read(_with(Metrics(attributes={GPU_UTILIZATION: 0.7}))) == 0.7
    assert ref.read(_with(Metrics(custom={"GPUUtilization": 0.7}))) is None


def test_resolve_empty_producer_is_producer_agnostic_key() -> None:
    ref = ScalarAttribute.resolve("llm-d.ai/queue", "", "test")
    assert ref.key == "llm-d.ai/queue/"
    assert ref.read(_with(Metrics(attributes={"llm-d.ai/queue/": 2}))) == 2.0


def test_resolve_rejects_slash_without_producer_and_names_the_split() -> None:
    with pytest.raises(ValueError, match="attribute: 'GPUUtilization' and producer: 'dcgm"):
        ScalarAttribute.resolve("GPUUtilization/dcgm-extractor", None, "test")


@pytest.mark.parametrize("value", ["0.5", True, math.nan, math.inf, None])
def test_read_treats_non_numeric_or_non_finite_as_missing(value: object) -> None:
    ref = ScalarAttribute("Load", "producer-a")
    assert ref.read(_with(Metrics(attributes={KEY: value}))) is None

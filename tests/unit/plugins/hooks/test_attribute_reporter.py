"""``request-attribute-reporter``: CEL over the response's usage into dynamic metadata."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.loader import load_config
from epp.plugin import ResponseInfo, Usage
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugins.hooks.attribute_reporter import RequestAttributeReporter, usage_data
from tests.builders import FakeHandle, make_request


def reporter(expression: str, condition: str = "", **key: str) -> RequestAttributeReporter:
    attribute: dict[str, Any] = {"key": {"name": "x-cost", **key}, "expression": expression}
    if condition:
        attribute["condition"] = condition
    params = decode(RequestAttributeReporter.Params, {"attributes": [attribute]})
    return RequestAttributeReporter(name="cost", params=params, handle=FakeHandle())


def finished(prompt: int, completion: int, cached: int = 0, *, eos: bool = True) -> ResponseInfo:
    usage = Usage(prompt, completion, cached, prompt + completion)
    return ResponseInfo(request_id="r", headers={}, usage=usage, end_of_stream=eos)


def test_expression_value_is_written_under_its_namespace_at_the_end_of_the_response() -> None:
    r = reporter("usage.prompt_tokens + usage.completion_tokens")
    chunk = finished(10, 5, eos=False)
    r.response_streaming(make_request(), chunk)
    assert chunk.dynamic_metadata == {}  # not before the end
    response = finished(10, 5)
    r.response_streaming(make_request(), response)
    assert response.dynamic_metadata == {"envoy.lb": {"x-cost": 15.0}}
    custom = reporter("usage.total_tokens", namespace="billing")
    custom.response_streaming(make_request(), response)
    assert response.dynamic_metadata["billing"] == {"x-cost": 15.0}


@pytest.mark.parametrize(
    ("expression", "condition", "usage", "expected"),
    [
        pytest.param("usage.prompt_tokens * 1.5", "", (3, 1), 4, id="double-truncated"),
        pytest.param(
            "usage.completion_tokens",
            "usage.completion_tokens > 2.0",
            (1, 2),
            0,
            id="condition-false",
        ),
        pytest.param(
            "usage.completion_tokens",
            "usage.completion_tokens > 2.0",
            (1, 3),
            3,
            id="condition-true",
        ),
        pytest.param(
            "usage.prompt_tokens - usage.prompt_tokens", "", (4, 4), 0, id="zero-not-written"
        ),
        pytest.param(
            "has(usage.prompt_tokens_details) ? usage.prompt_tokens_details.cached_tokens : 0.0",
            "",
            (8, 1, 6),
            6,
            id="cached-tokens",
        ),
        pytest.param("usage.missing", "", (1, 1), 0, id="no-such-field"),
        pytest.param("'text'", "", (1, 1), 0, id="not-a-number"),
        pytest.param(
            "usage.prompt_tokens", "usage.prompt_tokens", (5, 1), 0, id="condition-not-bool"
        ),
    ],
)
def test_value_follows_upstreams_rules(
    expression: str, condition: str, usage: tuple[int, ...], expected: int
) -> None:
    response = finished(*usage)
    reporter(expression, condition).response_streaming(make_request(), response)
    assert response.dynamic_metadata == (
        {"envoy.lb": {"x-cost": float(expected)}} if expected else {}
    )


def test_usage_has_upstreams_shape_with_numbers_as_doubles() -> None:
    assert usage_data(Usage(3, 4, 0, 7)) == {
        "prompt_tokens": 3.0,
        "completion_tokens": 4.0,
        "total_tokens": 7.0,
    }
    assert usage_data(Usage(3, 4, 2, 7))["prompt_tokens_details"] == {"cached_tokens": 2.0}


@pytest.mark.parametrize(
    ("attributes", "match"),
    [
        pytest.param([], "exactly one", id="none"),
        pytest.param([{"key": {"name": "a"}, "expression": "1"}] * 2, "exactly one", id="two"),
        pytest.param(
            [{"key": {"name": ""}, "expression": "1"}], "name cannot be empty", id="no-name"
        ),
        pytest.param(
            [{"key": {"name": "a"}, "expression": ""}], "expression cannot be empty", id="no-expr"
        ),
    ],
)
def test_parameters_are_refused_as_upstream_refuses_them(attributes: Any, match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(RequestAttributeReporter.Params, {"attributes": attributes})


def test_a_bad_expression_stops_startup_with_the_plugin_name() -> None:
    config = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: request-attribute-reporter
  name: cost
  parameters:
    attributes:
    - key: {name: x-cost}
      expression: "usage.prompt_tokens +"
"""
    with pytest.raises(Exception, match=r"(?s)cost.*failed to compile expression"):
        load_config(config, registry=PluginRegistry.from_entry_points(), handle_for=FakeHandle)

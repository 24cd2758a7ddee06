"""The Director tells the metrics which model names the pool serves (epp.observability.labels):
LoRA adapters the endpoints list, InferenceModelRewrite names, and targets a model server
confirmed with a 2xx; any other client-chosen name is counted as ``unknown``."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from epp.observability.metrics import UNKNOWN, EppMetrics
from epp.observability.recorder import RequestStats
from epp.plugin import ErrorCode, InferenceError
from epp.requestcontrol.director import Director
from epp.requestcontrol.exchange import Exchange
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.rewrites import ModelRewrite, RewriteRule, RewriteStore, RewriteTarget
from tests.builders import make_endpoint, make_request

PIPELINE: Any = SimpleNamespace(
    parsers=[],
    producers=[],
    producer_timeouts=[],
    screeners=[],
    request_header=[],
    response_headers=[],
    response_streaming=[],
    response_complete=[],
    saturation_detector=None,
)


def director(stats: RequestStats, rewrites: RewriteStore | None = None) -> Director:
    endpoints = [
        make_endpoint(0, active=["lora-a"], waiting=["lora-b"]),
        dataclasses.replace(make_endpoint(1), metrics=None),
    ]
    return Director(
        pipeline=PIPELINE,
        scheduler=None,  # type: ignore[arg-type]
        endpoints=lambda: endpoints,
        objectives=ObjectiveStore(),
        clock=lambda: 0.0,
        rewrites=rewrites,
        stats=stats,
    )


def test_pool_models_are_the_listed_adapters_and_the_rewrite_names() -> None:
    rule = RewriteRule(models=("alias",), targets=(RewriteTarget("base-v2", 1),))
    d = director(RequestStats(EppMetrics()), RewriteStore([ModelRewrite("canary", (rule,))]))
    assert sorted(d.pool_models()) == ["alias", "base-v2", "lora-a", "lora-b"]


def test_labels_follow_the_pool_and_an_alias_needs_a_rewrite_object() -> None:
    metrics = EppMetrics()
    rule = RewriteRule(models=("alias",), targets=(RewriteTarget("base-v2"),))
    director(RequestStats(metrics), RewriteStore([ModelRewrite("canary", (rule,))]))
    assert metrics.models("lora-a", "lora-a") == ("lora-a", "lora-a")
    assert metrics.models("alias", "base-v2") == ("alias", "base-v2")
    assert metrics.models("chosen-by-a-client", "lora-b") == (UNKNOWN, "lora-b")
    assert metrics.models("x", "y") == (UNKNOWN, UNKNOWN)


def test_a_2xx_response_confirms_the_target_model() -> None:
    metrics = EppMetrics()
    d = director(RequestStats(metrics))
    for model, status in (("base", "200"), ("nope", "404")):
        ex = Exchange(make_request(), started=0.0)
        ex.request.incoming_model = ex.request.target_model = model
        d.on_response_headers(ex, {":status": status}, "")
    assert metrics.models("base", "base") == ("base", "base")
    assert metrics.models("nope", "nope") == (UNKNOWN, UNKNOWN)


def test_protocol_errors_are_counted_by_reason() -> None:
    metrics = EppMetrics()
    d = director(RequestStats(metrics))
    d.protocol_error("no_request")
    d.protocol_error("no_request")
    value = metrics.registry.get_sample_value(
        "llm_d_epp_extproc_protocol_errors_total", {"reason": "no_request"}
    )
    assert value == 2


def test_a_failed_request_is_logged_with_its_client_chosen_id_escaped_and_clipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = director(RequestStats(EppMetrics()))
    request = make_request()
    request.request_id = "id\nFORGED ERROR line" + "x" * 10_000
    err = InferenceError(ErrorCode.SERVICE_UNAVAILABLE, "no endpoints")
    with caplog.at_level(logging.WARNING):
        d.fail(Exchange(request, started=0.0), err)
    (record,) = caplog.records
    assert record.getMessage() == "request failed"
    logged = record.__dict__["request_id"]  # a field of the structured line, escaped and clipped
    assert "\n" not in logged
    assert logged.startswith("id\\nFORGED ERROR line")
    assert len(logged) < 300

"""Tracing configuration from ``--tracing`` and the ``OTEL_*`` variables."""

from __future__ import annotations

import logging
import sys

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from epp.observability.tracing import Tracing, exporter_from, sampler_from


@pytest.mark.parametrize(
    ("environ", "kind"),
    [
        pytest.param({}, None, id="nothing-configured"),
        pytest.param({"OTEL_TRACES_EXPORTER": "none"}, None, id="none"),
        pytest.param({"OTEL_TRACES_EXPORTER": "console"}, ConsoleSpanExporter, id="console"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp"}, OTLPSpanExporter, id="otlp"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"},
            OTLPSpanExporter,
            id="endpoint",
        ),
    ],
)
def test_exporter_follows_the_variables_when_set(
    environ: dict[str, str], kind: type | None
) -> None:
    exporter = exporter_from(environ)
    assert (exporter is None) if kind is None else isinstance(exporter, kind)
    tracing = Tracing.from_environment(enabled=True, plugin_threshold=0.001, environ=environ)
    assert (tracing is None) is (kind is None)
    if tracing is not None:
        tracing.shutdown()


def test_tracing_is_off_when_the_flag_says_so_whatever_the_variables() -> None:
    env = {"OTEL_TRACES_EXPORTER": "console"}
    assert Tracing.from_environment(enabled=False, plugin_threshold=0.0, environ=env) is None


def test_an_unknown_exporter_is_refused_when_configured() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        exporter_from({"OTEL_TRACES_EXPORTER": "zipkin"})


@pytest.mark.parametrize(
    ("environ", "ratio"),
    [
        pytest.param({}, 0.1, id="upstream-default"),
        pytest.param({"OTEL_TRACES_SAMPLER_ARG": "0.5"}, 0.5, id="arg"),
        pytest.param({"OTEL_TRACES_SAMPLER_ARG": "lots"}, 0.1, id="bad-arg"),
        pytest.param({"OTEL_TRACES_SAMPLER": "weird"}, 0.1, id="unknown-falls-back"),
    ],
)
def test_sampler_is_parent_based_ratio_when_not_overridden(
    environ: dict[str, str], ratio: float
) -> None:
    sampler = sampler_from(environ)
    assert isinstance(sampler, ParentBased)
    root = sampler._root  # the SDK keeps the delegate here
    assert isinstance(root, TraceIdRatioBased) and root.rate == ratio


def test_always_on_is_honoured_when_named() -> None:
    assert "AlwaysOn" in sampler_from({"OTEL_TRACES_SAMPLER": "always_on"}).get_description()


def test_an_otlp_exporter_that_cannot_load_turns_tracing_off_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When the exporter cannot be imported (another wheel's older copy of opentelemetry/proto
    installed over opentelemetry-proto's), the EPP still starts, with tracing off and a line
    saying how to fix it."""
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    with pytest.raises(ValueError, match="reinstall opentelemetry-proto"):
        exporter_from(env)
    with caplog.at_level(logging.ERROR):
        assert Tracing.from_environment(True, 0.001, env) is None
    assert "tracing is off" in caplog.text

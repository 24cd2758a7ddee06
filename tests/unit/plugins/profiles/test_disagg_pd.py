"""``pd-profile-handler`` (deprecated), which lives in ``epp.plugins.profiles.disagg``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from epp.plugin import (
    Consumer,
    InferenceError,
    Lifecycle,
    PluginConfigError,
    PreRequest,
    ProfileHandler,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.roles import PEER_ENDPOINT
from epp.plugin.spans import SPAN_SINK
from epp.plugin.testing import check_plugin_class
from epp.plugins.profiles.disagg import PdProfileHandler
from tests.builders import make_request
from tests.unit.plugins.profiles.disagg_helpers import (
    DECODE_EP,
    PREFILL_EP,
    PROFILES,
    PluginsHandle,
    SpanSink,
    StubDecider,
    schedule,
)

PD_PROFILES = {"decode": PROFILES["decode"], "prefill": PROFILES["prefill"]}


def _handler(
    params: dict[str, Any] | None = None, **plugins: Any
) -> tuple[PdProfileHandler, PluginsHandle]:
    h = PluginsHandle(plugins=dict(plugins))
    handler = PdProfileHandler(name="pd", params=decode(PdProfileHandler.Params, params), handle=h)
    return handler, h


def _decisions(h: PluginsHandle, decision: str) -> float:
    labels = {"plugin_name": "pd", "plugin_type": "pd-profile-handler"}
    labels |= {"model_name": "m", "decision_type": decision}
    value = h.registry.get_sample_value("llm_d_epp_pd_decision_total", labels)
    twin = h.registry.get_sample_value(
        "llm_d_inference_scheduler_pd_decision_total",
        {"model_name": "m", "decision_type": decision},
    )
    assert value == twin
    return value or 0.0


def test_roles_and_deprecation(caplog: pytest.LogCaptureFixture) -> None:
    check_plugin_class(PdProfileHandler, "pd-profile-handler")
    with caplog.at_level(logging.INFO):
        handler, _ = _handler()
    assert "pd-profile-handler is deprecated, use disagg-profile-handler" in caplog.text
    assert all(isinstance(handler, role) for role in (ProfileHandler, Consumer, Lifecycle))
    assert not isinstance(handler, PreRequest)  # upstream: headers come from prefill-header-handler
    assert handler.consumes() == {
        "PrefixCacheMatchInfo/approx-prefix-cache-producer",
        "TokenizedPrompt/token-producer",
    }
    named, _ = _handler({"prefixMatchInfoProducerName": "precise"})
    assert "PrefixCacheMatchInfo/precise" in named.consumes()


def test_default_decider_is_prefix_based_and_required_at_start() -> None:
    handler, _ = _handler()
    with pytest.raises(
        PluginConfigError, match="deciderPluginName: plugin not found: prefix-based"
    ):
        asyncio.run(handler.start())
    handler, _ = _handler(**{"prefix-based-pd-decider": StubDecider(True)})
    asyncio.run(handler.start())


def test_approved_runs_prefill_and_counts_a_pd_decision() -> None:
    decider = StubDecider(True)
    handler, h = _handler({"deciderPluginName": "d"}, d=decider)
    request = make_request(target_model="m")
    result, ran = schedule(handler, request, profiles=PD_PROFILES)
    assert ran == ["decode", "prefill"]
    assert decider.calls == [DECODE_EP]
    assert result.primary_profile == "decode"
    assert result.profile_results["prefill"].targets == (PREFILL_EP,)
    assert PEER_ENDPOINT not in request.attributes
    assert request.upstream_headers == {}
    assert _decisions(h, "prefill-decode") == 1


def test_declined_serves_decode_only() -> None:
    handler, h = _handler({"deciderPluginName": "d"}, d=StubDecider(False))
    result, ran = schedule(handler, make_request(target_model="m"), profiles=PD_PROFILES)
    assert ran == ["decode"]
    assert set(result.profile_results) == {"decode"}
    assert _decisions(h, "decode-only") == 1


def test_extra_profiles_do_not_rerun_prefill() -> None:
    handler, _ = _handler({"deciderPluginName": "d"}, d=StubDecider(True))
    _, ran = schedule(handler, make_request(target_model="m"))  # decode, prefill and encode
    assert ran == ["decode", "prefill"]


def test_no_decode_endpoint_fails() -> None:
    handler, _ = _handler({"deciderPluginName": "d"}, d=StubDecider(True))
    with pytest.raises(InferenceError, match="failed to find available decode workers"):
        schedule(handler, make_request(), endpoints=(PREFILL_EP,), profiles=PD_PROFILES)


def test_primary_port_sets_data_parallel_header_and_rewrites_decode_port() -> None:
    handler, _ = _handler({"deciderPluginName": "d", "primaryPort": 9000}, d=StubDecider(False))
    request = make_request()
    result, _ = schedule(handler, request, profiles=PD_PROFILES)
    assert request.upstream_headers == {"x-data-parallel-host-port": DECODE_EP.hostport}
    assert [ep.hostport for ep in result.primary.targets] == ["192.168.1.1:9000"]


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"primaryPort": 70000}, "invalid primaryPort: must be between 1 and 65535, got 70000"),
        ({"deciderPluginName": ""}, "decider plugin name is not defined"),
        ({"decodeProfile": ""}, "must not be empty"),
        ({"deciders": {"prefill": "x"}}, "deciders: unknown field"),
    ],
)
def test_bad_parameters(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(ParamError, match=problem):
        decode(PdProfileHandler.Params, params)


def test_deprecated_unused_parameters_are_accepted() -> None:
    params = decode(
        PdProfileHandler.Params,
        {"prefixPluginType": "prefix-cache-scorer", "prefixPluginName": "x"},
    )
    assert params.prefix_plugin_name == "x"


@pytest.mark.parametrize(
    ("approve", "decisions"),
    [(True, ["run_decode", "prefill_decode", "complete"]), (False, ["run_decode", "decode_only"])],
)
def test_traced_request_gets_a_pick_pd_profile_span_per_pick(
    approve: bool, decisions: list[str]
) -> None:
    handler, _ = _handler({"deciderPluginName": "d"}, d=StubDecider(approve))
    sink = SpanSink()
    request = make_request(target_model="m", attributes={SPAN_SINK: sink})
    schedule(handler, request, profiles=PD_PROFILES)
    picks = sink.named("pick_pd_profile")
    assert [p["llm_d.epp.profile_handler.decision"] for p in picks] == decisions
    assert picks[0]["llm_d.epp.profile_handler.selected_profile"] == "decode"
    assert picks[0]["llm_d.epp.profile_handler.total_profiles"] == 2
    assert [p["llm_d.epp.profile_handler.executed_profiles"] for p in picks] == list(
        range(len(decisions))
    )
    if approve:
        assert picks[1]["llm_d.epp.profile_handler.selected_profile"] == "prefill"
        assert picks[2]["llm_d.epp.profile_handler.decode_failed"] is False

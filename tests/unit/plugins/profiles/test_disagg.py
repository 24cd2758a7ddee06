from __future__ import annotations

import logging
from typing import Any

import pytest

from epp.plugin import (
    Consumer,
    ErrorCode,
    InferenceError,
    Lifecycle,
    PreRequest,
    ProfileHandler,
)
from epp.plugin.params import decode
from epp.plugin.roles import PEER_ENDPOINT
from epp.plugin.spans import SPAN_SINK
from epp.plugin.testing import check_plugin_class
from epp.plugins.profiles.disagg import DisaggProfileHandler
from tests.builders import make_request
from tests.unit.plugins.profiles.disagg_helpers import (
    DECODE_EP,
    ENCODE_EP,
    PREFILL_EP,
    PROFILES,
    PluginsHandle,
    SpanSink,
    StubDecider,
    schedule,
)


def _handler(
    params: dict[str, Any] | None = None, name: str = "disagg", **plugins: Any
) -> tuple[DisaggProfileHandler, PluginsHandle]:
    h = PluginsHandle(plugins=dict(plugins))
    handler = DisaggProfileHandler(
        name=name, params=decode(DisaggProfileHandler.Params, params), handle=h
    )
    return handler, h


def _decisions(h: PluginsHandle, decision: str, model: str = "m") -> float:
    labels = {"plugin_name": "disagg", "plugin_type": "disagg-profile-handler"}
    labels |= {"model_name": model, "decision_type": decision}
    value = h.registry.get_sample_value("llm_d_epp_disagg_decision_total", labels)
    twin = h.registry.get_sample_value(
        "llm_d_inference_scheduler_disagg_decision_total",
        {"model_name": model, "decision_type": decision},
    )
    assert value == twin
    return value or 0.0


def test_fills_its_roles() -> None:
    check_plugin_class(DisaggProfileHandler, "disagg-profile-handler")
    handler, _ = _handler()
    for role in (ProfileHandler, PreRequest, Consumer, Lifecycle):
        assert isinstance(handler, role)
    assert handler.consumes() == {
        "PrefixCacheMatchInfo/approx-prefix-cache-producer",
        "TokenizedPrompt/token-producer",
    }


def test_without_deciders_runs_decode_only() -> None:
    handler, h = _handler()
    request = make_request(target_model="m")
    result, ran = schedule(handler, request)
    assert ran == ["decode"]
    assert result.primary_profile == "decode"
    assert dict(result.profile_results) == {"decode": result.primary}
    assert result.primary.targets == (DECODE_EP,)
    assert PEER_ENDPOINT not in request.attributes
    handler.pre_request(request, result)
    assert request.upstream_headers == {}
    assert _decisions(h, "decode-only") == 1


def test_prefill_decider_approves_runs_prefill_after_decode() -> None:
    decider = StubDecider(True)
    handler, h = _handler({"deciders": {"prefill": "pd"}}, pd=decider)
    request = make_request(target_model="m", upstream_headers={"x-prefiller-host-port": "stale"})
    result, ran = schedule(handler, request)
    assert ran == ["decode", "prefill"]
    assert decider.calls == [DECODE_EP]
    assert request.attributes[PEER_ENDPOINT] == DECODE_EP
    assert result.primary_profile == "decode"
    assert result.profile_results["prefill"].targets == (PREFILL_EP,)
    handler.pre_request(request, result)
    assert request.upstream_headers == {"x-prefiller-host-port": PREFILL_EP.hostport}
    assert _decisions(h, "prefill-decode") == 1


def test_prefill_decider_declines_once_and_decode_serves_alone() -> None:
    decider = StubDecider(False)
    handler, h = _handler({"deciders": {"prefill": "pd"}}, pd=decider)
    request = make_request(target_model="m", upstream_headers={"x-prefiller-host-port": "forged"})
    result, ran = schedule(handler, request)
    assert ran == ["decode"]
    assert decider.calls == [DECODE_EP]
    handler.pre_request(request, result)
    assert request.upstream_headers == {}
    assert _decisions(h, "decode-only") == 1


@pytest.mark.parametrize(
    ("encode", "prefill", "ran", "decision"),
    [
        (True, True, ["decode", "encode", "prefill"], "encode-prefill-decode"),
        (True, False, ["decode", "encode"], "encode-decode"),
        (False, True, ["decode", "prefill"], "prefill-decode"),
        (False, False, ["decode"], "decode-only"),
    ],
)
def test_encode_and_prefill_stages(
    encode: bool, prefill: bool, ran: list[str], decision: str
) -> None:
    pd, ed = StubDecider(prefill), StubDecider(encode)
    handler, h = _handler({"deciders": {"prefill": "pd", "encode": "ed"}}, pd=pd, ed=ed)
    request = make_request(target_model="m")
    result, order = schedule(handler, request)
    assert order == ran
    assert (pd.calls, ed.calls) == ([DECODE_EP], [DECODE_EP])
    handler.pre_request(request, result)
    expected = {}
    if encode:
        expected["x-encoder-hosts-ports"] = ENCODE_EP.hostport
    if prefill:
        expected["x-prefiller-host-port"] = PREFILL_EP.hostport
    assert request.upstream_headers == expected
    assert _decisions(h, decision) == 1


def test_stage_whose_profile_picks_nothing_does_not_count() -> None:
    handler, h = _handler({"deciders": {"prefill": "pd"}}, pd=StubDecider(True))
    request = make_request(target_model="m")
    result, ran = schedule(handler, request, endpoints=(DECODE_EP, ENCODE_EP))  # no prefill pod
    assert ran == ["decode", "prefill"]
    assert "prefill" not in result.profile_results
    handler.pre_request(request, result)
    assert request.upstream_headers == {}
    assert _decisions(h, "decode-only") == 1


def test_no_decode_endpoint_fails_with_429_and_asks_no_decider() -> None:
    decider = StubDecider(True)
    handler, h = _handler({"deciders": {"prefill": "pd"}}, pd=decider)
    with pytest.raises(InferenceError) as err:
        schedule(handler, make_request(target_model="m"), endpoints=(PREFILL_EP, ENCODE_EP))
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "failed to find available decode workers" in err.value.message
    assert err.value.drop_reason == "rejected-saturated"
    assert decider.calls == []
    assert _decisions(h, "decode-only") == 0


def test_stage_without_a_profile_is_skipped_and_its_decider_not_asked() -> None:
    decider = StubDecider(True)
    handler, _ = _handler({"deciders": {"encode": "ed"}}, ed=decider)
    profiles = {"decode": PROFILES["decode"], "prefill": PROFILES["prefill"]}
    _, ran = schedule(handler, make_request(target_model="m"), profiles=profiles)
    assert ran == ["decode"]
    assert decider.calls == []


def test_missing_decode_profile_is_logged_and_nothing_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler, _ = _handler({"profiles": {"decode": "dec"}})
    with caplog.at_level(logging.ERROR), pytest.raises(InferenceError, match="no profile ran"):
        schedule(handler, make_request())
    assert "decode profile 'dec' is not configured" in caplog.text


def test_custom_profile_names() -> None:
    params = {
        "profiles": {"decode": "d", "prefill": "p", "encode": "e"},
        "deciders": {"prefill": "x"},
    }
    handler, _ = _handler(params, x=StubDecider(True))
    profiles = {"d": PROFILES["decode"], "p": PROFILES["prefill"], "e": PROFILES["encode"]}
    request = make_request()
    result, ran = schedule(handler, request, profiles=profiles)
    assert (ran, result.primary_profile) == (["d", "p"], "d")
    handler.pre_request(request, result)
    assert request.upstream_headers == {"x-prefiller-host-port": PREFILL_EP.hostport}


def test_prefill_first_runs_prefill_then_decode_with_the_prefill_pick_as_peer() -> None:
    encode = StubDecider(False)
    handler, h = _handler({"stageOrder": "prefill-first", "deciders": {"encode": "ed"}}, ed=encode)
    request = make_request(target_model="m")
    result, ran = schedule(handler, request)
    assert ran == ["prefill", "decode"]
    assert encode.calls == [None]
    assert request.attributes[PEER_ENDPOINT] == PREFILL_EP
    assert result.primary_profile == "decode"
    assert result.primary.targets == (DECODE_EP,)
    handler.pre_request(request, result)
    assert request.upstream_headers == {"x-prefiller-host-port": PREFILL_EP.hostport}
    assert _decisions(h, "prefill-decode") == 1


def test_prefill_first_without_prefill_pods_still_decodes() -> None:
    handler, h = _handler({"stageOrder": "PREFILL_FIRST"})
    request = make_request(target_model="")
    result, ran = schedule(handler, request, endpoints=(DECODE_EP,))
    assert ran == ["prefill", "decode"]
    assert PEER_ENDPOINT not in request.attributes
    assert set(result.profile_results) == {"decode"}
    assert _decisions(h, "decode-only", model="unknown") == 1


def test_prefill_first_decode_failure_fails_the_request() -> None:
    handler, h = _handler({"stageOrder": "prefill"})
    with pytest.raises(InferenceError, match="decode workers"):
        schedule(handler, make_request(target_model="m"), endpoints=(PREFILL_EP,))
    assert _decisions(h, "prefill-decode") == 0


def test_decisions_cap_model_labels() -> None:
    handler, h = _handler()
    handler._decisions._models = {f"m{i}" for i in range(1000)}
    schedule(handler, make_request(target_model="new"))
    assert _decisions(h, "decode-only", model="other") == 1


def test_traced_request_gets_a_pick_disagg_profile_span_per_pick() -> None:
    handler, _ = _handler({"deciders": {"prefill": "pd", "encode": "no"}}, pd=StubDecider(True),
                          no=StubDecider(False))  # fmt: skip
    sink = SpanSink()
    request = make_request(target_model="m", attributes={SPAN_SINK: sink})
    schedule(handler, request)
    picks = sink.named("pick_disagg_profile")
    decision = "llm_d.epp.profile_handler.decision"
    assert [p[decision] for p in picks] == ["run_decode", "run_prefill", "complete"]
    assert picks[-1]["llm_d.epp.profile_handler.decode_failed"] is False
    assert all(p["gen_ai.request.model"] == "m" and p["mm.modality"] == "none" for p in picks)


def test_pick_span_says_decode_failed_when_decode_picked_nothing() -> None:
    handler, _ = _handler()
    sink = SpanSink()
    request = make_request(target_model="m", attributes={SPAN_SINK: sink})
    with pytest.raises(InferenceError):
        schedule(handler, request, endpoints=(PREFILL_EP,))
    last = sink.named("pick_disagg_profile")[-1]
    assert last["llm_d.epp.profile_handler.decision"] == "complete"
    assert last["llm_d.epp.profile_handler.decode_failed"] is True

from __future__ import annotations

import asyncio
import logging

import pytest

from epp.plugin import ErrorCode, InferenceError, PluginConfigError, TypedName
from epp.plugin.params import decode
from epp.plugins.profiles.deciders import DeciderRef, RateLimitedLog
from epp.plugins.profiles.disagg import DecisionCounter, DisaggProfileHandler, decision_type
from tests.builders import handle, make_request
from tests.unit.plugins.profiles.disagg_helpers import PluginsHandle, StubDecider, schedule

OWNER = TypedName("disagg-profile-handler", "h")


def test_decider_declared_later_is_resolved_at_start() -> None:
    h = PluginsHandle()
    params = decode(DisaggProfileHandler.Params, {"deciders": {"prefill": "later"}})
    handler = DisaggProfileHandler(name="h", params=params, handle=h)
    decider = StubDecider(True, "later")
    h.plugins["later"] = decider
    asyncio.run(handler.start())
    _, ran = schedule(handler, make_request())
    assert ran == ["decode", "prefill"]


def test_unknown_decider_stops_startup_with_the_parameter_path() -> None:
    params = decode(DisaggProfileHandler.Params, {"deciders": {"encode": "nope"}})
    handler = DisaggProfileHandler(name="h", params=params, handle=PluginsHandle())
    with pytest.raises(PluginConfigError) as err:
        asyncio.run(handler.start())
    assert str(err.value) == (
        "plugin 'h' (type 'disagg-profile-handler'): parameters.deciders.encode: "
        "plugin not found: nope"
    )


def test_unknown_decider_fails_a_request_scheduled_before_start_with_a_500() -> None:
    params = decode(DisaggProfileHandler.Params, {"deciders": {"prefill": "nope"}})
    handler = DisaggProfileHandler(name="h", params=params, handle=PluginsHandle())
    with pytest.raises(InferenceError) as err:
        schedule(handler, make_request())
    assert err.value.code is ErrorCode.INTERNAL
    assert "parameters.deciders.prefill: plugin not found: nope" in err.value.message


def test_a_plugin_that_is_no_decider_is_refused() -> None:
    scorer = type("Q", (), {"typed_name": TypedName("queue-scorer", "q")})()
    h = PluginsHandle(plugins={"q": scorer})
    ref = DeciderRef(h, OWNER, "deciders.prefill", "q")
    with pytest.raises(PluginConfigError, match=r"plugin q \(queue-scorer\) is not a decider"):
        ref.resolve()


def test_decider_known_at_construction_is_used_and_empty_name_means_none() -> None:
    decider = StubDecider(False)
    assert DeciderRef(PluginsHandle(plugins={"d": decider}), OWNER, "f", "d").get() is decider
    assert DeciderRef(PluginsHandle(), OWNER, "f", "").resolve() is None


@pytest.mark.parametrize(
    ("encode", "prefill", "decision"),
    [
        (False, False, "decode-only"),
        (False, True, "prefill-decode"),
        (True, False, "encode-decode"),
        (True, True, "encode-prefill-decode"),
    ],
)
def test_decision_type(encode: bool, prefill: bool, decision: str) -> None:
    assert decision_type(encode, prefill) == decision


def test_rate_limited_log_repeats_after_the_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("t"), lambda: now[0])
    with caplog.at_level(logging.ERROR):
        for t in (0.0, 10.0, 29.0, 31.0):
            now[0] = t
            log(logging.ERROR, "boom %s", t)
    assert [r.getMessage() for r in caplog.records] == ["boom 0.0", "boom 31.0"]


def test_a_raising_decider_means_no_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    decider = StubDecider(True, "boom")
    decider.disaggregate = lambda *_: 1 / 0  # type: ignore[method-assign]
    params = decode(DisaggProfileHandler.Params, {"deciders": {"prefill": "boom"}})
    handler = DisaggProfileHandler(
        name="h", params=params, handle=PluginsHandle(plugins={"boom": decider})
    )
    with caplog.at_level(logging.ERROR):
        result, ran = schedule(handler, make_request())
    assert ran == ["decode"]
    assert set(result.profile_results) == {"decode"}
    assert "decider boom/stub-decider failed, stage skipped: ZeroDivisionError" in caplog.text


def test_decision_counter_folds_long_model_names_into_other() -> None:
    h = handle()
    counter = DecisionCounter(h, OWNER, "disagg", "decisions")
    counter.record("m" * 257, "decode-only")
    counter.record("m" * 256, "decode-only")
    name = "llm_d_epp_disagg_decision_total"
    labels = {"plugin_name": "h", "plugin_type": OWNER.type, "decision_type": "decode-only"}
    assert h.registry.get_sample_value(name, {**labels, "model_name": "other"}) == 1.0
    assert h.registry.get_sample_value(name, {**labels, "model_name": "m" * 256}) == 1.0

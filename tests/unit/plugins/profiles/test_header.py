"""``header-profile-handler``: the profile a request header names runs alone, and is primary."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from epp.plugin import (
    DropReason,
    ErrorCode,
    InferenceError,
    Profile,
    ProfileHandler,
    ProfileResult,
    Stability,
)
from epp.plugin.params import decode
from epp.plugin.testing import check_profile_handler, sample_endpoints, sample_request
from epp.plugins.pickers.common import PickerParams
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.profiles.header import HeaderProfileHandler
from tests.builders import handle, make_cycle, make_endpoint, make_request

PICKER = MaxScorePicker(name="", params=PickerParams(), handle=handle())
STAGES = {
    n: Profile(name=n, filters=(), scorers=(), picker=PICKER)
    for n in ("encode", "prefill", "decode")
}
RESULT = ProfileResult(targets=(make_endpoint(0),), scores={"default/pod-0-rank-0": 1.0})


def _handler(**params: Any) -> HeaderProfileHandler:
    return HeaderProfileHandler(
        name="h", params=decode(HeaderProfileHandler.Params, params), handle=handle()
    )


def _picked(
    handler: HeaderProfileHandler, headers: dict[str, str], profiles: dict[str, Profile] = STAGES
) -> list[str]:
    return list(handler.pick_profiles(make_cycle(), make_request(headers=headers), profiles, {}))


@pytest.mark.parametrize(
    ("headers", "picked"),
    [
        ({"epp-profile": "prefill"}, ["prefill"]),
        ({"epp-profile": "  encode "}, ["encode"]),  # trimmed
        ({}, ["decode"]),  # missing: defaultProfile
        ({"epp-profile": "   "}, ["decode"]),  # blank: defaultProfile
        ({"epp-profile": "Prefill"}, []),  # profile names are case-sensitive
        ({"epp-profile": "nope"}, []),  # unknown value: no profile, not the default
    ],
)
def test_the_header_names_the_one_profile_that_runs(
    headers: dict[str, str], picked: list[str]
) -> None:
    assert _picked(_handler(), headers) == picked


def test_header_name_and_default_profile_are_configurable() -> None:
    handler = _handler(headerName="  X-Stage ", defaultProfile="prefill")
    assert _picked(handler, {"x-stage": "encode"}) == ["encode"]
    assert _picked(handler, {"epp-profile": "encode"}) == ["prefill"]


def test_a_single_profile_always_runs() -> None:
    only = {"decode": STAGES["decode"]}
    assert _picked(_handler(), {"epp-profile": "nope"}, only) == ["decode"]
    assert _picked(_handler(defaultProfile="elsewhere"), {}, only) == ["decode"]


def test_nothing_more_runs_after_the_profile() -> None:
    handler = _handler()
    request = make_request(headers={"epp-profile": "prefill"})
    assert handler.pick_profiles(make_cycle(), request, STAGES, {"prefill": RESULT}) == {}


def test_the_profile_that_ran_is_primary() -> None:
    result = _handler().process_results(make_cycle(), make_request(), {"prefill": RESULT})
    assert result.primary_profile == "prefill" and result.primary is RESULT


def test_a_profile_without_endpoints_left_is_saturated() -> None:
    with pytest.raises(InferenceError) as info:
        _handler().process_results(make_cycle(), make_request(), {"prefill": None})
    err = info.value
    assert (err.code, err.drop_reason) == (ErrorCode.RESOURCE_EXHAUSTED, DropReason.SATURATED)


def test_why_no_profile_ran_is_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    handler = _handler(defaultProfile="missing")
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            _picked(handler, {"epp-profile": "nope"})
        _picked(handler, {})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "header value 'nope'" in lines[0] and "decode, encode, prefill" in lines[0]
    assert "defaultProfile 'missing' is not a configured" in lines[1]


def test_is_an_alpha_profile_handler_that_passes_the_contract_kit() -> None:
    handler = _handler()
    assert isinstance(handler, ProfileHandler)
    assert HeaderProfileHandler.STABILITY is Stability.ALPHA
    request = sample_request(headers={"epp-profile": "prefill"})
    check_profile_handler(handler, STAGES, request, sample_endpoints(5))

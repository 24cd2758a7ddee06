from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import (
    DropReason,
    ErrorCode,
    InferenceError,
    NoParams,
    Profile,
    ProfileHandler,
    ProfileResult,
)
from epp.plugins.pickers.common import PickerParams
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.profiles.single import SingleProfileHandler
from tests.builders import handle, make_cycle, make_endpoint, make_request

PROFILE = Profile(
    name="default",
    filters=(),
    scorers=(),
    picker=MaxScorePicker(name="", params=PickerParams(), handle=handle()),
)
RESULT = ProfileResult(targets=(make_endpoint(0),), scores={"default/pod-0-rank-0": 1.0})


def _handler() -> SingleProfileHandler:
    return SingleProfileHandler(name="", params=NoParams(), handle=handle())


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        pytest.param({}, {"default": PROFILE}, id="first-call-runs-profile"),
        pytest.param({"default": RESULT}, {}, id="after-success-stops"),
        pytest.param({"default": None}, {}, id="after-failure-stops"),
    ],
)
def test_pick_profiles_runs_profile_once_when_called_in_loop(
    results: dict[str, Any], expected: dict[str, Profile]
) -> None:
    picked = _handler().pick_profiles(make_cycle(), make_request(), {"default": PROFILE}, results)
    assert dict(picked) == expected


def test_process_results_marks_profile_primary_when_it_succeeded() -> None:
    result = _handler().process_results(make_cycle(), make_request(), {"default": RESULT})
    assert result.primary_profile == "default"
    assert result.profile_results == {"default": RESULT}
    assert result.primary is RESULT


def test_process_results_raises_saturated_when_profile_failed() -> None:
    with pytest.raises(InferenceError) as info:
        _handler().process_results(make_cycle(), make_request(), {"default": None})
    err = info.value
    assert (err.code, err.drop_reason) == (ErrorCode.RESOURCE_EXHAUSTED, DropReason.SATURATED)
    assert err.body == (
        "inference error: ResourceExhausted - "
        "failed to find target endpoint: no endpoints left after filters"
    )


@pytest.mark.parametrize(
    "results",
    [
        pytest.param({}, id="no-profile-ran"),
        pytest.param({"a": RESULT, "b": RESULT}, id="two-results"),
    ],
)
def test_process_results_raises_resource_exhausted_when_not_one_result(
    results: dict[str, Any],
) -> None:
    with pytest.raises(InferenceError) as info:
        _handler().process_results(make_cycle(), make_request(), results)
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert info.value.message.startswith("failed to find target endpoint:")


def test_plugin_is_profile_handler_when_constructed() -> None:
    plugin = _handler()
    assert isinstance(plugin, ProfileHandler)
    assert plugin.typed_name.type == "single-profile-handler"

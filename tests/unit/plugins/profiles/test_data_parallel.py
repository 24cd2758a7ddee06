from __future__ import annotations

import dataclasses
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
)
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class
from epp.plugin.wire import OWNED_REQUEST_HEADERS
from epp.plugins.pickers.common import PickerParams
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.profiles.data_parallel import DATA_PARALLEL_HEADER, DataParallelProfileHandler
from tests.builders import handle, make_cycle, make_endpoint, make_request

PROFILE = Profile(
    name="default",
    filters=(),
    scorers=(),
    picker=MaxScorePicker(name="", params=PickerParams(), handle=handle()),
)


def _rank(pod: int, rank: int, address: str | None = None) -> Any:
    ep = make_endpoint(pod, address=address, port=8000 + rank)
    return dataclasses.replace(ep, id=f"default/pod-{pod}-rank-{rank}", rank=rank)


def _handler(**params: Any) -> DataParallelProfileHandler:
    p = decode(DataParallelProfileHandler.Params, params)
    return DataParallelProfileHandler(name="dp", params=p, handle=handle())


def test_class_follows_the_contract_when_loaded() -> None:
    check_plugin_class(DataParallelProfileHandler, "data-parallel-profile-handler")
    assert isinstance(_handler(), ProfileHandler)
    assert DATA_PARALLEL_HEADER in OWNED_REQUEST_HEADERS


@pytest.mark.parametrize(
    ("params", "port"),
    [
        pytest.param({}, 8000, id="default-8000"),
        pytest.param({"primaryPort": 9000}, 9000, id="explicit"),
        pytest.param({"primaryPort": 1}, 1, id="minimum"),
        pytest.param({"primaryPort": 65535}, 65535, id="maximum"),
        pytest.param({"primaryPort": 0}, 0, id="zero-accepted-as-upstream"),
    ],
)
def test_primary_port_is_accepted_when_in_range(params: dict[str, Any], port: int) -> None:
    assert _handler(**params).params.primary_port == port


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"primaryPort": -1}, "between 1 and 65535, got -1", id="negative"),
        pytest.param({"primaryPort": 65536}, "between 1 and 65535, got 65536", id="too-high"),
        pytest.param({"primaryPort": "8000"}, "expected an integer", id="string"),
        pytest.param({"primaryPort": True}, "expected an integer", id="boolean"),
        pytest.param({"port": 8000}, "unknown field", id="unknown-key"),
    ],
)
def test_params_are_rejected_when_invalid(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(DataParallelProfileHandler.Params, params)


def test_construction_logs_the_deprecation_when_loaded(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        _handler(primaryPort=0)
    assert "Deprecated: Use simple-profile-handler with Istio >= 1.28.1" in caplog.text
    assert "primaryPort is 0" in caplog.text


@pytest.mark.parametrize(
    ("profiles", "results", "runs"),
    [
        pytest.param({"default": PROFILE}, {}, True, id="first-call-runs-the-profile"),
        pytest.param(
            {"default": PROFILE}, {"default": ProfileResult((make_endpoint(0),))}, False, id="done"
        ),
        pytest.param({"default": PROFILE}, {"default": None}, False, id="after-failure"),
        pytest.param({"a": PROFILE, "b": PROFILE}, {}, False, id="two-profiles"),
        pytest.param({}, {"x": None}, False, id="no-profile"),
    ],
)
def test_pick_profiles_runs_the_single_profile_once_when_exactly_one_is_configured(
    profiles: dict[str, Profile], results: dict[str, Any], runs: bool
) -> None:
    picked = _handler().pick_profiles(make_cycle(), make_request(), profiles, results)
    assert dict(picked) == (profiles if runs else {})


def test_pick_profiles_logs_rate_limited_when_several_profiles_are_configured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = _handler()
    with caplog.at_level(logging.ERROR):
        for _ in range(5):
            handler.pick_profiles(make_cycle(), make_request(), {"a": PROFILE, "b": PROFILE}, {})
    assert caplog.text.count("requires exactly one scheduling profile, got 2") == 1


def test_process_results_sets_rank_header_and_sends_to_primary_port_when_profile_picked() -> None:
    picked = (_rank(0, 1), _rank(1, 0))
    scores = {picked[0].id: 2.0, picked[1].id: 1.0}
    request = make_request()
    result = _handler(primaryPort=9000).process_results(
        make_cycle(), request, {"dp": ProfileResult(picked, scores)}
    )
    assert request.upstream_headers == {DATA_PARALLEL_HEADER: "192.168.1.1:8001"}
    assert result.primary_profile == "dp"
    targets = result.primary.targets
    assert [t.hostport for t in targets] == ["192.168.1.1:9000", "192.168.1.2:9000"]
    # The picked endpoints themselves, except for the port.
    for before, after in zip(picked, targets, strict=True):
        assert dataclasses.replace(after, port=before.port) == before
    assert result.primary.scores == scores
    assert picked[0].port == 8001  # the snapshot is not mutated


def test_process_results_brackets_ipv6_and_replaces_a_stale_header_when_picked() -> None:
    request = make_request()
    request.upstream_headers[DATA_PARALLEL_HEADER] = "10.9.9.9:1"
    target = _rank(0, 2, address="fd00::5")
    result = _handler().process_results(
        make_cycle(), request, {"default": ProfileResult((target,))}
    )
    assert request.upstream_headers[DATA_PARALLEL_HEADER] == "[fd00::5]:8002"
    assert result.primary.targets[0].hostport == "[fd00::5]:8000"


def test_process_results_raises_saturated_when_the_profile_found_nothing() -> None:
    request = make_request()
    with pytest.raises(InferenceError) as info:
        _handler().process_results(make_cycle(), request, {"default": None})
    assert (info.value.code, info.value.drop_reason) == (
        ErrorCode.RESOURCE_EXHAUSTED,
        DropReason.SATURATED,
    )
    assert request.upstream_headers == {}


@pytest.mark.parametrize(
    "results",
    [
        pytest.param({}, id="none"),
        pytest.param(
            {"a": ProfileResult((make_endpoint(0),)), "b": ProfileResult((make_endpoint(1),))},
            id="two",
        ),
    ],
)
def test_process_results_raises_resource_exhausted_when_not_one_result(
    results: dict[str, Any],
) -> None:
    with pytest.raises(InferenceError) as info:
        _handler().process_results(make_cycle(), make_request(), results)
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert info.value.message == (
        "failed to find target endpoint: data parallel profile handler is intended to be used "
        "with a single profile, failed to process multiple profiles"
    )

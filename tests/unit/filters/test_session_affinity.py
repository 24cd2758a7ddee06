from __future__ import annotations

import textwrap
from typing import Any

import pytest

from epp.config.loader import LoadOptions, load_config
from epp.plugin import (
    Consumer,
    Endpoint,
    Filter,
    PluginConfigError,
    PreRequest,
    ProfileResult,
    ResponseHeaders,
    ResponseInfo,
    SchedulingResult,
    Scorer,
    Stability,
)
from epp.plugin.params import decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_filter, check_plugin_class, sample_endpoints
from filters.session_affinity import SessionAffinityFilter
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

EPS = [make_endpoint(i) for i in range(4)]


def _filter(**params: Any) -> SessionAffinityFilter:
    return SessionAffinityFilter(
        name="saf", params=decode(SessionAffinityFilter.Params, params), handle=FakeHandle()
    )


def _token(endpoint: Endpoint) -> str:
    import base64

    return base64.b64encode(endpoint.id.encode()).decode()


def _kept(flt: SessionAffinityFilter, headers: dict[str, str], eps: list[Endpoint] = EPS):
    return [e.id for e in flt.filter(make_cycle(), make_request(headers=headers), eps)]


def _result(target: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult(targets=(target,))}, "default")


def test_contract_and_roles() -> None:
    check_plugin_class(SessionAffinityFilter, "session-affinity-filter")
    assert SessionAffinityFilter.STABILITY is Stability.ALPHA
    flt = _filter()
    for role in (Filter, PreRequest, ResponseHeaders, Consumer):
        assert isinstance(flt, role)
    assert not isinstance(flt, Scorer)  # a filter only: never slotted as a scorer
    eps = sample_endpoints(5)
    check_filter(flt, eps, make_request(headers={"x-session-token": _token(eps[4])}))
    check_filter(_filter(strategy="session_id"), eps)


def test_pins_to_the_session_endpoint_when_it_is_a_candidate() -> None:
    assert _kept(_filter(), {"x-session-token": _token(EPS[2])}) == [EPS[2].id]


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param({"x-session-token": "%%%"}, id="bad-base64"),
        pytest.param({"x-session-token": _token(EPS[2])[:-1]}, id="truncated"),
        pytest.param({"x-session-token": _token(make_endpoint(9))}, id="unknown-endpoint"),
    ],
)
def test_passes_every_candidate_when_no_usable_session(headers: dict[str, str]) -> None:
    assert _kept(_filter(), headers) == [e.id for e in EPS]


def test_passes_every_candidate_when_session_endpoint_left() -> None:
    headers = {"x-session-token": _token(EPS[3])}
    assert _kept(_filter(), headers, EPS[:3]) == [e.id for e in EPS[:3]]


def test_writes_the_token_of_the_pick_on_the_response() -> None:
    flt = _filter(encodedEndpointHeaderConfig={"header": "x-tok", "cookieName": "llm-d-session"})
    request = make_request()
    flt.pre_request(request, _result(EPS[1]))
    out: dict[str, str] = {}
    flt.response_headers(request, ResponseInfo(request_id="r", headers={}), out)
    assert out["x-tok"] == _token(EPS[1])
    assert out["set-cookie"].startswith(f"llm-d-session={_token(EPS[1])};")
    assert _kept(flt, {"cookie": f"llm-d-session={_token(EPS[1])}"}) == [EPS[1].id]


def test_session_id_strategy_pins_after_binding() -> None:
    flt = _filter(strategy="session_id", sessionIdConfig={"sources": [{"header": "x-conv"}]})
    first = make_request(headers={"x-conv": "c1"})
    assert len(flt.filter(make_cycle(), first, EPS)) == 4
    flt.pre_request(first, _result(EPS[3]))
    assert _kept(flt, {"x-conv": "c1"}) == [EPS[3].id]
    assert _kept(flt, {"x-conv": "c2"}) == [e.id for e in EPS]
    assert flt.dump_state()["bindings"] == 1


def test_bad_parameters_name_the_filter() -> None:
    with pytest.raises(PluginConfigError) as info:
        FakeHandle().create_plugin(
            "session-affinity-filter",
            "pin",
            {
                "strategy": "session_id",
                "sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]},
            },
        )
    message = str(info.value)
    assert "'pin' (type 'session-affinity-filter')" in message
    assert "sessionIdConfig.sources[0]: exactly one of header or attribute" in message
    with pytest.raises(PluginConfigError, match="unknown field"):
        FakeHandle().create_plugin("session-affinity-filter", "pin", {"profile": "x"})


def test_filter_in_a_profile_is_wired_into_every_role() -> None:
    text = textwrap.dedent("""\
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: session-affinity-filter
          parameters: {strategy: session_id, sessionIdConfig: {sources: [{attribute: SessionID}]}}
        - type: queue-scorer
        """)
    pipeline = load_config(
        text,
        registry=PluginRegistry.from_entry_points(),
        handle_for=FakeHandle,
        options=LoadOptions(allow_experimental=True),
    )
    flt = pipeline.instances["session-affinity-filter"]
    assert pipeline.profiles["default"].filters == (flt,)
    assert flt in pipeline.pre_request and flt in pipeline.response_headers
    assert "session-id-producer" in pipeline.instances  # the default producer of SessionID

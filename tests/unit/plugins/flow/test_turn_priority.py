from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import InferenceRequest, RequestBody
from epp.plugin.params import ParamError, decode
from epp.plugins.flow.turn_priority import TurnPriority
from tests.builders import handle
from tests.unit.flowcontrol.flow_builders import build_plugin, request


def _plugin(**params: Any) -> TurnPriority:
    plugin: TurnPriority = build_plugin(handle(), "turn-priority", **params)
    return plugin


def _turn(session: str = "", *, priority: int = 0, header: str = "x-session-affinity") -> Any:
    return request(priority=priority, headers={header: session} if session else {})


def _responses(previous: str | None, priority: int = 0) -> InferenceRequest:
    payload: dict[str, Any] = {"model": "m", "input": "hi"}
    if previous is not None:
        payload["previous_response_id"] = previous
    return request(priority=priority, body=RequestBody(kind="responses", payload=payload, raw=b""))


@pytest.mark.parametrize(
    ("priority", "boost", "expected"),
    [
        pytest.param(0, 1, 1, id="default-boost"),
        pytest.param(5, 10, 15, id="positive-priority"),
        pytest.param(-5, 2, -3, id="sheddable-moves-up"),
        pytest.param(-2, 5, -1, id="sheddable-stays-sheddable"),
        pytest.param(-1, 1, -1, id="sheddable-at-top-stays"),
        pytest.param(3, 0, 3, id="zero-boost-is-off"),
    ],
)
def test_live_session_turn_is_boosted_when_session_in_flight(
    priority: int, boost: int, expected: int
) -> None:
    plugin = _plugin(boost=boost)
    plugin.on_dispatch(_turn("s1"), 0.0)
    assert plugin.adjusted_priority(_turn("s1", priority=priority), 1.0) == expected


def test_first_turn_is_not_boosted_when_session_unknown() -> None:
    plugin = _plugin(boost=4)
    plugin.on_dispatch(_turn("other"), 0.0)
    assert plugin.adjusted_priority(_turn("s1", priority=2), 1.0) == 2


def test_request_without_session_is_not_boosted_when_no_headers() -> None:
    plugin = _plugin()
    plugin.on_dispatch(_turn(), 0.0)
    assert plugin.adjusted_priority(_turn(), 0.0) == 0


@pytest.mark.parametrize(
    ("idle", "elapsed", "boosted"),
    [
        pytest.param("60s", 59.0, True, id="within-idle-timeout"),
        pytest.param("60s", 60.0, True, id="at-idle-timeout"),
        pytest.param("60s", 60.5, False, id="past-idle-timeout"),
        pytest.param("0s", 0.0, True, id="zero-timeout-same-instant"),
        pytest.param("0s", 0.1, False, id="zero-timeout-later"),
    ],
)
def test_session_stays_live_when_last_turn_finished_recently(
    idle: str, elapsed: float, boosted: bool
) -> None:
    plugin = _plugin(sessionIdleTimeout=idle)
    plugin.on_dispatch(_turn("s1"), 0.0)
    plugin.on_done(_turn("s1"), 10.0)
    assert plugin.is_continuation(_turn("s1"), 10.0 + elapsed) is boosted


def test_session_stays_live_when_turn_in_flight_longer_than_timeout() -> None:
    plugin = _plugin(sessionIdleTimeout="1s")
    plugin.on_dispatch(_turn("s1"), 0.0)
    assert plugin.is_continuation(_turn("s1"), 3600.0)


@pytest.mark.parametrize(
    "header",
    ["x-claude-code-session-id", "x-session-affinity", "session-id", "session_id", "x-agent-run"],
)
def test_session_key_read_from_agent_identity_headers_when_present(header: str) -> None:
    plugin = _plugin(additionalSessionHeaders=["X-Agent-Run"])
    plugin.on_dispatch(_turn("abc", header=header), 0.0)
    assert plugin.adjusted_priority(_turn("abc", header=header), 0.0) == 1


def test_additional_header_wins_when_several_session_headers() -> None:
    plugin = _plugin(additionalSessionHeaders=["x-agent-run"])
    req = request(headers={"x-agent-run": "run-1", "session-id": "sess-9"})
    assert plugin.session_key(req) == "run-1"


@pytest.mark.parametrize(
    ("previous", "boosted"),
    [
        pytest.param("resp_123", True, id="follow-up-turn"),
        pytest.param("", False, id="empty-id"),
        pytest.param(None, False, id="first-turn"),
    ],
)
def test_responses_follow_up_is_boosted_when_previous_response_id_set(
    previous: str | None, boosted: bool
) -> None:
    plugin = _plugin(boost=2)
    assert plugin.adjusted_priority(_responses(previous), 0.0) == (2 if boosted else 0)


def test_chat_body_previous_response_id_is_ignored_when_not_responses_api() -> None:
    body = RequestBody(kind="chat", payload={"previous_response_id": "x"}, raw=b"")
    assert _plugin().adjusted_priority(request(body=body), 0.0) == 0


def test_oldest_idle_session_forgotten_when_over_max_sessions() -> None:
    plugin = _plugin(maxSessions=2, sessionIdleTimeout="1h")
    for i, name in enumerate(["a", "b"]):
        plugin.on_dispatch(_turn(name), float(i))
        plugin.on_done(_turn(name), float(i))
    plugin.on_dispatch(_turn("c"), 5.0)
    assert plugin.live_sessions(5.0) == 2
    assert not plugin.is_continuation(_turn("a"), 5.0)
    assert plugin.is_continuation(_turn("b"), 5.0)
    assert plugin.is_continuation(_turn("c"), 5.0)


def test_sessions_in_flight_kept_when_over_max_sessions() -> None:
    plugin = _plugin(maxSessions=1)
    plugin.on_dispatch(_turn("a"), 0.0)
    plugin.on_dispatch(_turn("b"), 0.0)
    assert plugin.live_sessions(0.0) == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"boost": -1}, "boost", id="negative-boost"),
        pytest.param({"maxSessions": 0}, "maxSessions", id="no-sessions"),
        pytest.param({"sessionIdleTimeout": "soon"}, "invalid duration", id="bad-duration"),
        pytest.param({"sessionIdleTimeout": "-1s"}, "sessionIdleTimeout", id="negative-duration"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(TurnPriority.Params, params)


def test_session_key_over_1024_characters_counts_as_no_session() -> None:
    plugin = _plugin()
    long_key = "s" * 1025
    plugin.on_dispatch(_turn(long_key), 0.0)
    assert plugin.session_key(_turn(long_key)) == ""
    assert plugin.adjusted_priority(_turn(long_key), 0.0) == 0
    assert plugin.session_key(_turn("s" * 1024)) == "s" * 1024

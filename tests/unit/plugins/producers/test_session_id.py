from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epp.plugin import (
    SESSION_ID,
    SESSION_LIMITS,
    DataProducer,
    RequestBody,
    SessionLimits,
    Stability,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class
from epp.plugins.producers.session_id import SessionIDProducer
from tests.builders import handle, make_request


def _producer(name: str = "session-id-producer", **params: Any) -> SessionIDProducer:
    return SessionIDProducer(
        name=name, params=decode(SessionIDProducer.Params, params), handle=handle()
    )


def _produce(producer: SessionIDProducer, headers: dict[str, str]) -> dict[str, Any]:
    request = make_request(headers=headers)
    asyncio.run(producer.produce(request, []))
    return request.attributes


def test_contract() -> None:
    check_plugin_class(SessionIDProducer, "session-id-producer")
    assert SessionIDProducer.STABILITY is Stability.BETA  # upstream registers it as beta
    assert isinstance(_producer(headerName="x"), DataProducer)


def test_publishes_under_its_own_name() -> None:
    assert _producer().produces() == frozenset({"SessionIDDataKey/session-id-producer"})
    assert _producer("sid", headerName="x").produces() == frozenset({SESSION_ID.key("sid")})


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"x-session-id": "user-42"}, "user-42", id="present"),
        pytest.param({"x-session-id": "  user-42  "}, "user-42", id="trimmed"),
        pytest.param({"other": "irrelevant"}, None, id="absent"),
        pytest.param({"x-session-id": ""}, None, id="empty"),
        pytest.param({"x-session-id": "   "}, None, id="blank"),
    ],
)
def test_header_mode(headers: dict[str, str], expected: str | None) -> None:
    attributes = _produce(_producer(headerName=" X-Session-ID "), headers)
    assert attributes.get("SessionIDDataKey/session-id-producer") == expected
    if expected is None:
        assert attributes == {}


@pytest.mark.parametrize(
    ("cookie", "expected"),
    [
        pytest.param("llm-d-session=abc123", "abc123", id="single"),
        pytest.param("csrf=xyz; llm-d-session=abc123; theme=dark", "abc123", id="among-others"),
        pytest.param("csrf=xyz; theme=dark", None, id="not-present"),
        pytest.param("", None, id="header-empty"),
        pytest.param("no-equals; llm-d-session=abc", "abc", id="malformed-pair"),
        pytest.param("llm-d-session=", None, id="value-empty"),
        pytest.param("llm-d-session= abc123 ; other=v", "abc123", id="trimmed"),
        pytest.param('llm-d-session="q=1"', "q=1", id="quoted"),
        pytest.param("llm-d-session=a; llm-d-session=b", "a", id="first-wins"),
        pytest.param("LLM-D-SESSION=a", None, id="name-is-case-sensitive"),
    ],
)
def test_cookie_mode(cookie: str, expected: str | None) -> None:
    attributes = _produce(_producer(cookieName="llm-d-session"), {"cookie": cookie})
    assert attributes.get("SessionIDDataKey/session-id-producer") == expected


def test_no_parameters_reads_the_default_header() -> None:
    producer = _producer()
    assert producer.header == "x-session-id"
    assert _produce(producer, {"x-session-id": "s"}) == {
        "SessionIDDataKey/session-id-producer": "s"
    }


def test_both_sources_are_rejected_as_upstream() -> None:
    with pytest.raises(ParamError, match="exactly one of headerName or cookieName"):
        decode(SessionIDProducer.Params, {"headerName": "x", "cookieName": "y"})
    with pytest.raises(ParamError, match="unknown field"):
        decode(SessionIDProducer.Params, {"bodyfield": "user"})
    with pytest.raises(ParamError, match="expected a string"):
        decode(SessionIDProducer.Params, {"headerName": 3})


def _body_request(payload: Any, headers: dict[str, str] | None = None) -> Any:
    body = RequestBody(kind="chat", payload=payload, raw=b"")
    return make_request(headers=headers or {}, body=body)


@pytest.mark.parametrize(
    ("field", "payload", "expected"),
    [
        pytest.param("user", {"user": "u-1"}, "u-1", id="top-level"),
        pytest.param("user", {"user": "  u-1 "}, "u-1", id="stripped"),
        pytest.param("user", {"user": 42}, "42", id="integer"),
        pytest.param("meta.sid", {"meta": {"sid": "s-9"}}, "s-9", id="dotted"),
        pytest.param("a.b", {"a.b": "literal", "a": {"b": "nested"}}, "literal", id="literal-key"),
        pytest.param("a.b.c", {"a": {"b": {"c": "deep"}}}, "deep", id="deep"),
        pytest.param("user", {"user": True}, None, id="bool"),
        pytest.param("user", {"user": 1.5}, None, id="float"),
        pytest.param("user", {"user": {"id": 1}}, None, id="object"),
        pytest.param("user", {"user": ["x"]}, None, id="list"),
        pytest.param("user", {"user": ""}, None, id="empty"),
        pytest.param("user", {"user": "x" * 1025}, None, id="too-long"),
        pytest.param("user", {"user": 10**1100}, None, id="huge-integer"),
        pytest.param("user", {}, None, id="absent"),
        pytest.param("a.b", {"a": "not-an-object"}, None, id="path-through-a-string"),
        pytest.param("a.b", {"a": {"c": "x"}}, None, id="path-missing"),
        pytest.param("user", None, None, id="raw-body"),
    ],
)
def test_body_field(field: str, payload: Any, expected: str | None) -> None:
    producer = _producer(bodyField=field)
    request = _body_request(payload)
    asyncio.run(producer.produce(request, []))
    assert request.attributes.get("SessionIDDataKey/session-id-producer") == expected


def test_body_field_is_read_only_when_no_header_or_cookie_carries_one() -> None:
    by_header = _producer(bodyField="user")  # the default header comes first
    assert by_header.session_id(_body_request({"user": "b"}, {"x-session-id": "h"})) == "h"
    assert by_header.session_id(_body_request({"user": "b"}, {"x-session-id": " "})) == "b"
    by_cookie = _producer(cookieName="sid", bodyField="user")
    assert by_cookie.session_id(_body_request({"user": "b"}, {"cookie": "sid=c"})) == "c"
    assert by_cookie.session_id(_body_request({"user": "b"}, {"cookie": "other=c"})) == "b"
    assert by_cookie.session_id(make_request(headers={})) == ""  # no body at all


def test_limits_are_published_beside_the_session_id() -> None:
    producer = _producer("sid", bodyField="user", lruSize=10, ttl="90s")
    key, limits_key = SESSION_ID.key("sid"), SESSION_LIMITS.key("sid")
    assert producer.produces() == frozenset({key, limits_key})
    request = _body_request({"user": "u"})
    asyncio.run(producer.produce(request, []))
    assert request.attributes == {key: "u", limits_key: SessionLimits(10, 90.0)}
    request = _body_request({})  # no session: no limits either
    asyncio.run(producer.produce(request, []))
    assert request.attributes == {}
    assert _producer(lruSize=5).limits == SessionLimits(5, 0.0)
    assert _producer(ttl="1m").limits == SessionLimits(0, 60.0)
    assert _producer().limits is None
    assert _producer().produces() == frozenset({SESSION_ID.key("session-id-producer")})


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"lruSize": -1}, "lruSize must be >= 0"),
        ({"ttl": "-5s"}, "ttl must not be negative"),
        ({"ttl": "soon"}, "duration"),
        ({"ttl": 30}, "expected a string"),
    ],
)
def test_bad_limits_are_rejected(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ParamError, match=fragment):
        decode(SessionIDProducer.Params, params)

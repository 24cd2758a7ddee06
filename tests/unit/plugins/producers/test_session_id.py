from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epp.plugin import SESSION_ID, DataProducer, Stability
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
        decode(SessionIDProducer.Params, {"bodyField": "user"})
    with pytest.raises(ParamError, match="expected a string"):
        decode(SessionIDProducer.Params, {"headerName": 3})

from __future__ import annotations

import base64
import dataclasses
import textwrap
from typing import Any

import pytest

from epp.config.loader import LoadOptions, load_config
from epp.plugin import (
    AGENT_IDENTITY,
    SESSION_ID,
    SESSION_LIMITS,
    Consumer,
    Endpoint,
    PreRequest,
    ProfileResult,
    ResponseHeaders,
    ResponseInfo,
    SchedulingResult,
    Scorer,
    ScorerCategory,
    SessionLimits,
    Stability,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_plugin_class, check_scorer, sample_endpoints
from scorers.session_affinity import SessionAffinityScorer, decode_token, encode_token
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

EPS = [make_endpoint(i) for i in range(4)]


def _scorer(h: FakeHandle | None = None, **params: Any) -> SessionAffinityScorer:
    return SessionAffinityScorer(
        name="sa", params=decode(SessionAffinityScorer.Params, params), handle=h or FakeHandle()
    )


def _scores(scorer: SessionAffinityScorer, headers: dict[str, str], **kw: Any) -> list[float]:
    scores = scorer.score(make_cycle(), make_request(headers=headers, **kw), EPS)
    return [scores[e.id] for e in EPS]


def _result(target: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    results = {"decode": ProfileResult(targets=(target,))}
    if prefill is not None:
        results["prefill"] = ProfileResult(targets=(prefill,))
    return SchedulingResult(profile_results=results, primary_profile="decode")


def _response_headers(scorer: SessionAffinityScorer, request: Any, **resp: str) -> dict[str, str]:
    out: dict[str, str] = {}
    scorer.response_headers(request, ResponseInfo(request_id="r", headers=resp), out)
    return out


def test_contract_and_roles() -> None:
    check_plugin_class(SessionAffinityScorer, "session-affinity-scorer")
    scorer = _scorer()
    assert SessionAffinityScorer.STABILITY is Stability.ALPHA
    assert scorer.category is ScorerCategory.AFFINITY
    for role in (Scorer, PreRequest, ResponseHeaders, Consumer):
        assert isinstance(scorer, role)
    eps = sample_endpoints(5)
    check_scorer(scorer, eps, make_request(headers={"x-session-token": encode_token(eps[3].id)}))
    check_scorer(_scorer(strategy="session_id"), eps)


# ---- encoded_endpoint_header ------------------------------------------------------------------


def test_token_is_padded_std_base64_of_the_endpoint_id() -> None:
    token = encode_token("default/pod-1-rank-0")
    assert token == base64.b64encode(b"default/pod-1-rank-0").decode()
    assert token.endswith("=") and decode_token(token) == "default/pod-1-rank-0"


def test_session_endpoint_scores_one_and_others_zero_when_token_matches() -> None:
    headers = {"x-session-token": encode_token(EPS[2].id)}
    assert _scores(_scorer(), headers) == [0.0, 0.0, 1.0, 0.0]


def test_no_preference_when_request_has_no_token() -> None:
    assert _scores(_scorer(), {}) == [0.0] * 4


@pytest.mark.parametrize(
    "token",
    [
        pytest.param("!!not base64!!", id="bad-alphabet"),
        pytest.param(encode_token(EPS[1].id).rstrip("="), id="unpadded"),
        pytest.param(encode_token(EPS[1].id) + " ", id="trailing-space"),
        pytest.param("ZGVmYXVsdC/wb2Q=", id="bad-padding-position"),
        pytest.param(base64.b64encode(b"\xff\xfe\xfd").decode(), id="not-utf8"),
        pytest.param("é" * 8, id="non-ascii"),
        pytest.param(encode_token("default/pod-9-rank-0"), id="unknown-endpoint"),
        pytest.param(encode_token("x" * 2000), id="too-long"),
        pytest.param(encode_token("default/pod-1"), id="pod-without-rank"),
    ],
)
def test_malformed_or_spoofed_token_gives_no_affinity_and_never_raises(token: str) -> None:
    assert _scores(_scorer(), {"x-session-token": token}) == [0.0] * 4


def test_token_is_rank_specific() -> None:
    ranks = [
        dataclasses.replace(EPS[0], id=f"default/pod-0-rank-{r}", port=8000 + r, rank=r)
        for r in range(3)
    ]
    request = make_request(headers={"x-session-token": encode_token(ranks[1].id)})
    scores = _scorer().score(make_cycle(), request, ranks)
    assert scores == {ranks[0].id: 0.0, ranks[1].id: 1.0, ranks[2].id: 0.0}


def test_response_carries_token_of_primary_pick_in_configured_header() -> None:
    scorer = _scorer(encodedEndpointHeaderConfig={"header": " X-My-Token ", "cookieName": ""})
    request = make_request()
    scorer.pre_request(request, _result(EPS[3]))
    assert _response_headers(scorer, request) == {"x-my-token": encode_token(EPS[3].id)}
    # the echoed token pins the next request
    assert _scores(scorer, {"x-my-token": encode_token(EPS[3].id)}) == [0.0, 0.0, 0.0, 1.0]


def test_profile_name_binds_that_profiles_pick() -> None:
    scorer = _scorer(
        profileName="prefill",
        encodedEndpointHeaderConfig={"header": "x-session-token-prefill", "cookieName": ""},
    )
    request = make_request()
    scorer.pre_request(request, _result(EPS[0], prefill=EPS[2]))
    assert _response_headers(scorer, request) == {
        "x-session-token-prefill": encode_token(EPS[2].id)
    }
    decode_only = make_request()
    scorer.pre_request(decode_only, _result(EPS[0]))  # the prefill profile did not run
    assert _response_headers(scorer, decode_only) == {}


def test_nothing_written_for_a_request_that_was_not_scheduled() -> None:
    assert _response_headers(_scorer(), make_request()) == {}


def test_cookie_carries_the_token_when_configured() -> None:
    scorer = _scorer(encodedEndpointHeaderConfig={"cookieName": "llm-d-session"})
    request = make_request()
    scorer.pre_request(request, _result(EPS[1]))
    token = encode_token(EPS[1].id)
    assert _response_headers(scorer, request) == {
        "x-session-token": token,
        "set-cookie": f"llm-d-session={token}; Path=/; HttpOnly; SameSite=Lax",
    }
    cookie = {"cookie": f"theme=dark; llm-d-session={token}"}
    assert _scores(scorer, cookie) == [0.0, 1.0, 0.0, 0.0]
    quoted = {"cookie": f'llm-d-session="{token}"'}
    assert _scores(scorer, quoted) == [0.0, 1.0, 0.0, 0.0]
    # the header wins over the cookie
    both = {**cookie, "x-session-token": encode_token(EPS[3].id)}
    assert _scores(scorer, both) == [0.0, 0.0, 0.0, 1.0]


def test_cookie_is_never_overwritten_and_on_by_default() -> None:
    scorer = _scorer(encodedEndpointHeaderConfig={"cookieName": "llm-d-session"})
    request = make_request()
    scorer.pre_request(request, _result(EPS[1]))
    assert "set-cookie" not in _response_headers(scorer, request, **{"set-cookie": "a=b"})
    out = {"set-cookie": "other=1"}
    scorer.response_headers(request, ResponseInfo(request_id="r", headers={}), out)
    assert out["set-cookie"] == "other=1"
    default = _scorer()
    default.pre_request(request, _result(EPS[1]))
    assert _response_headers(default, request)["set-cookie"].startswith("llm-d-session=")
    assert _scores(default, {"cookie": f"llm-d-session={encode_token(EPS[1].id)}"}) == [
        0.0,
        1.0,
        0.0,
        0.0,
    ]
    off = _scorer(encodedEndpointHeaderConfig={"cookieName": ""})
    off.pre_request(request, _result(EPS[1]))
    assert "set-cookie" not in _response_headers(off, request)
    assert _scores(off, {"cookie": f"llm-d-session={encode_token(EPS[1].id)}"}) == [0.0] * 4


# ---- session_id -------------------------------------------------------------------------------


def _turn(scorer: SessionAffinityScorer, headers: dict[str, str], picked: Endpoint, **kw: Any):
    """One request: score, then bind to ``picked``; returns the scores."""
    request = make_request(headers=headers, **kw)
    scores = scorer.score(make_cycle(), request, EPS)
    scorer.pre_request(request, _result(picked))
    return [scores[e.id] for e in EPS]


def test_session_id_binds_after_first_request_and_pins_afterwards() -> None:
    scorer = _scorer(strategy="session_id")
    assert _turn(scorer, {"x-session-id": "s1"}, EPS[2]) == [0.0] * 4
    assert _turn(scorer, {"x-session-id": " s1 "}, EPS[2]) == [0.0, 0.0, 1.0, 0.0]
    assert _turn(scorer, {"x-session-id": "s2"}, EPS[0]) == [0.0] * 4
    assert _turn(scorer, {}, EPS[1]) == [0.0] * 4  # no session: nothing bound
    assert scorer.dump_state()["bindings"] == 2
    assert _response_headers(scorer, make_request()) == {}  # nothing goes back to the client


def test_session_id_keeps_binding_when_picker_chose_another_present_endpoint() -> None:
    scorer = _scorer(strategy="session_id")
    _turn(scorer, {"x-session-id": "s"}, EPS[2])
    _turn(scorer, {"x-session-id": "s"}, EPS[0])  # EPS[2] was a candidate: no migration
    assert _turn(scorer, {"x-session-id": "s"}, EPS[2]) == [0.0, 0.0, 1.0, 0.0]


def test_session_id_rebinds_when_bound_endpoint_left_the_candidates() -> None:
    scorer = _scorer(strategy="session_id")
    _turn(scorer, {"x-session-id": "s"}, EPS[3])
    request = make_request(headers={"x-session-id": "s"})
    assert scorer.score(make_cycle(), request, EPS[:3]) == dict.fromkeys(
        (e.id for e in EPS[:3]), 0.0
    )
    scorer.pre_request(request, _result(EPS[1]))
    assert _turn(scorer, {"x-session-id": "s"}, EPS[1]) == [0.0, 1.0, 0.0, 0.0]


def test_session_id_binding_expires_after_ttl_and_is_swept() -> None:
    h = FakeHandle()
    scorer = _scorer(
        h,
        strategy="session_id",
        sessionIdConfig={"evictionTtlSeconds": 5, "evictionSweepSeconds": 1},
    )
    _turn(scorer, {"x-session-id": "old"}, EPS[0])
    h.now += 3
    _turn(scorer, {"x-session-id": "new"}, EPS[1])
    h.now += 3  # "old" unused for 6 s > TTL; "new" for 3 s
    assert _turn(scorer, {"x-session-id": "old"}, EPS[2]) == [0.0] * 4
    assert _turn(scorer, {"x-session-id": "new"}, EPS[1]) == [0.0, 1.0, 0.0, 0.0]
    h.now += 10
    _turn(scorer, {"x-session-id": "x"}, EPS[0])  # sweeps "old" and "new"
    assert scorer.dump_state()["bindings"] == 1


def test_session_id_bindings_are_capped_least_recently_used_first() -> None:
    scorer = _scorer(strategy="session_id")
    scorer._bindings.capacity = 3
    for i in range(5):
        _turn(scorer, {"x-session-id": f"s{i}"}, EPS[i % 4])
    assert scorer.dump_state()["bindings"] == 3
    assert _turn(scorer, {"x-session-id": "s0"}, EPS[3]) == [0.0] * 4
    assert _turn(scorer, {"x-session-id": "s4"}, EPS[0]) == [1.0, 0.0, 0.0, 0.0]


def test_session_id_sources_are_tried_in_order() -> None:
    scorer = _scorer(
        strategy="session_id",
        sessionIdConfig={"sources": [{"header": "X-Session-Id"}, {"attribute": "agent-identity"}]},
    )
    agent = {AGENT_IDENTITY: "agent-7"}
    _turn(scorer, {}, EPS[1], attributes=dict(agent))
    assert _turn(scorer, {}, EPS[0], attributes=dict(agent)) == [0.0, 1.0, 0.0, 0.0]
    # the header source comes first
    assert _turn(scorer, {"x-session-id": "h"}, EPS[3], attributes=dict(agent)) == [0.0] * 4
    assert scorer.session_id(make_request(attributes={AGENT_IDENTITY: 5})) == ""


def _producer_turn(
    scorer: SessionAffinityScorer, session: str, picked: Endpoint, limits: SessionLimits
) -> list[float]:
    attributes = {SESSION_ID.key("sid"): session, SESSION_LIMITS.key("sid"): limits}
    return _turn(scorer, {}, picked, attributes=attributes)


def test_producer_limits_bound_the_bindings() -> None:
    h = FakeHandle()
    source = {"sources": [{"attribute": "SessionIDDataKey", "producer": "sid"}]}
    scorer = _scorer(h, strategy="session_id", sessionIdConfig=source)
    limits = SessionLimits(lru_size=2, ttl_seconds=1000.0)
    for i in range(3):
        _producer_turn(scorer, f"s{i}", EPS[i], limits)
    assert scorer.dump_state()["bindings"] == 2  # lruSize: s0, the least recently used, is gone
    assert scorer.dump_state()["ttlSeconds"] == 1000.0
    assert _producer_turn(scorer, "s0", EPS[3], limits) == [0.0] * 4
    assert _producer_turn(scorer, "s2", EPS[0], limits) == [0.0, 0.0, 1.0, 0.0]
    h.now += 999  # within the producer's ttl, beyond the default 300 s
    assert _producer_turn(scorer, "s2", EPS[0], limits) == [0.0, 0.0, 1.0, 0.0]
    h.now += 1001
    assert _producer_turn(scorer, "s2", EPS[0], limits) == [0.0] * 4


def test_evictiontttlseconds_set_on_the_scorer_wins_over_the_producer_ttl() -> None:
    h = FakeHandle()
    config = {
        "sources": [{"attribute": "SessionIDDataKey", "producer": "sid"}],
        "evictionTtlSeconds": 10,
    }
    scorer = _scorer(h, strategy="session_id", sessionIdConfig=config)
    _producer_turn(scorer, "s", EPS[1], SessionLimits(0, 1000.0))
    assert scorer.dump_state()["ttlSeconds"] == 10
    assert scorer.dump_state()["capacity"] == 100_000  # lruSize 0: the default
    h.now += 11
    assert _producer_turn(scorer, "s", EPS[0], SessionLimits(0, 1000.0)) == [0.0] * 4


def test_without_producer_limits_the_defaults_hold() -> None:
    source = {"sources": [{"attribute": "SessionIDDataKey", "producer": "sid"}]}
    scorer = _scorer(strategy="session_id", sessionIdConfig=source)
    _turn(scorer, {}, EPS[1], attributes={SESSION_ID.key("sid"): "s"})
    state = scorer.dump_state()
    assert (state["capacity"], state["ttlSeconds"]) == (100_000, 300.0)


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ({"attribute": "SessionIDDataKey", "producer": "sid"}, "SessionIDDataKey/sid"),
        ({"attribute": "SessionIDDataKey"}, "SessionIDDataKey/session-id-producer"),
        ({"attribute": "SessionID"}, "SessionIDDataKey/session-id-producer"),
    ],
)
def test_session_id_attribute_of_the_producer_is_read_and_consumed(
    source: dict[str, str], key: str
) -> None:
    scorer = _scorer(strategy="session_id", sessionIdConfig={"sources": [source]})
    assert scorer.consumes() == frozenset({key})
    assert key == SESSION_ID.key(key.partition("/")[2])
    assert scorer.session_id(make_request(attributes={key: "abc"})) == "abc"


def test_only_session_id_attributes_are_consumed() -> None:
    sources = [{"header": "x-session-id"}, {"attribute": "agent-identity"}]
    scorer = _scorer(strategy="session_id", sessionIdConfig={"sources": sources})
    assert scorer.consumes() == frozenset()
    assert _scorer().consumes() == frozenset()


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"strategy": "sticky"}, "strategy must be"),
        ({"strategy": ""}, "strategy must be"),
        ({"strategy": "session_id", "sessionIdConfig": {"sources": [{}]}}, "exactly one"),
        (
            {
                "strategy": "session_id",
                "sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]},
            },
            "sources[0]: exactly one of header or attribute",
        ),
        ({"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": -1}}, "> 0"),
        ({"strategy": "session_id", "sessionIdConfig": {"evictionSweepSeconds": -2}}, "> 0"),
        ({"encodedEndpointHeaderConfig": {"headr": "x"}}, "unknown field"),
        ({"sessionIdConfig": {"sources": [{"cookie": "x"}]}}, "unknown field"),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ParamError, match=None) as info:
        decode(SessionAffinityScorer.Params, params)
    assert fragment in str(info.value)


def test_defaults_and_the_other_strategys_block_is_not_validated() -> None:
    # as upstream: only the chosen strategy's block is defaulted and validated
    scorer = _scorer(sessionIdConfig={"sources": [{}], "evictionTtlSeconds": -1})
    assert scorer.header == "x-session-token"
    stateful = _scorer(
        strategy="session_id",
        sessionIdConfig={"evictionTtlSeconds": 0, "evictionSweepSeconds": 0},
        encodedEndpointHeaderConfig={"header": ""},
    )
    assert (stateful.ttl, stateful.sweep_every) == (300.0, 10.0)
    assert [s.header for s in stateful.sources] == ["x-session-id"]


def test_loader_adds_the_session_id_producer_a_scorer_consumes() -> None:
    text = textwrap.dedent("""\
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: session-affinity-scorer
          parameters:
            strategy: session_id
            sessionIdConfig:
              sources: [{attribute: SessionIDDataKey, producer: session-id-producer}]
        """)
    pipeline = load_config(
        text,
        registry=PluginRegistry.from_entry_points(),
        handle_for=FakeHandle,
        options=LoadOptions(allow_experimental=True),
    )
    assert "session-id-producer" in [p.typed_name.type for p in pipeline.producers]
    scorer = pipeline.instances["session-affinity-scorer"]
    assert scorer in pipeline.pre_request


def test_alpha_plugin_needs_experimental_flag() -> None:
    text = "plugins:\n- type: session-affinity-scorer\n"
    with pytest.raises(Exception, match="alpha"):
        load_config(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n" + text,
            registry=PluginRegistry.from_entry_points(),
            handle_for=FakeHandle,
            options=LoadOptions(),
        )

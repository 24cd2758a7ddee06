from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from epp.plugin import ErrorCode, InferenceError, Parser, TypedName
from epp.plugins.parsers.anthropic import AnthropicParser
from epp.plugins.parsers.openai import OpenAIParser
from epp.plugins.parsers.passthrough import PassthroughParser
from epp.plugins.parsers.sglanghttp import SGLangHttpParser
from epp.plugins.parsers.vertexai import VertexAIParser
from epp.plugins.parsers.vllmgrpc import VllmGrpcParser
from epp.plugins.parsers.vllmhttp import VllmHttpParser
from epp.requestcontrol.parsers import ParserRouter, request_path


def build(cls: Any, name: str = "") -> Parser:
    return cast(Parser, cls(name=name or cls.TYPE, params=cls.Params(), handle=None))


def claiming(name: str, *claims: str) -> Parser:
    """A stand-in with arbitrary claims; the router only reads ``typed_name`` and ``claims``."""
    return cast(Parser, SimpleNamespace(typed_name=TypedName(name, name), claims=lambda: claims))


OPENAI = build(OpenAIParser)
ANTHROPIC = build(AnthropicParser)
VLLM = build(VllmHttpParser)
PASSTHROUGH = build(PassthroughParser)
DEFAULT = ParserRouter([OPENAI, ANTHROPIC, VLLM, PASSTHROUGH])


@pytest.mark.parametrize(
    ("headers", "path"),
    [
        pytest.param(
            {":path": "/a?x=1", "x-original-path": "/b", "x-forwarded-path": "/c"},
            "/a",
            id="pseudo-header-first-query-stripped",
        ),
        pytest.param(
            {":path": "", "x-original-path": "/b", "x-forwarded-path": "/c"},
            "/b",
            id="empty-path-falls-to-original",
        ),
        pytest.param({"x-forwarded-path": "/c?"}, "/c", id="forwarded-last"),
        pytest.param({}, "/v1/completions", id="default"),
    ],
)
def test_request_path_uses_header_precedence_when_headers_given(
    headers: dict[str, str], path: str
) -> None:
    assert request_path(headers) == path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/v1/chat/completions", OPENAI, id="chat"),
        pytest.param("/v1/completions/render", OPENAI, id="render"),
        pytest.param("/v1/images/generations", OPENAI, id="images"),
        pytest.param("/v1/messages", ANTHROPIC, id="messages"),
        pytest.param("/v1/messages/count_tokens", ANTHROPIC, id="count-tokens"),
        pytest.param("/inference/v1/generate", VLLM, id="vllm-generate"),
        pytest.param("/v1/chat/completions/", OPENAI, id="trailing-slash"),
        pytest.param("chat/completions", OPENAI, id="no-leading-slash"),
        pytest.param("/v1/models", PASSTHROUGH, id="unclaimed-goes-to-fallback"),
        pytest.param("/v1/xcompletions", PASSTHROUGH, id="partial-segment-is-no-match"),
        pytest.param("/", PASSTHROUGH, id="root"),
    ],
)
def test_resolve_picks_claiming_parser_when_path_matches(path: str, expected: Parser) -> None:
    assert DEFAULT.resolve({":path": path}) == (path, expected)


def test_resolve_prefers_longest_suffix_when_parsers_overlap() -> None:
    short = claiming("short", "completions")
    long = claiming("long", "/chat/completions/")
    for order in ([short, long], [long, short]):
        router = ParserRouter(order)
        assert router.resolve({":path": "/v1/chat/completions"})[1] is long
        assert router.resolve({":path": "/v1/completions"})[1] is short
        assert router.resolve({":path": "/v1/text/completions"})[1] is short


def test_resolve_keeps_first_claim_when_two_parsers_claim_same_suffix() -> None:
    first = claiming("first", "generate")
    second = claiming("second", "generate")
    assert ParserRouter([first, second]).resolve({":path": "/generate"})[1] is first


def test_registration_stops_at_fallback_when_parsers_follow_it() -> None:
    router = ParserRouter([ANTHROPIC, PASSTHROUGH, OPENAI, VLLM])
    assert router.parsers == (ANTHROPIC, PASSTHROUGH)
    assert router.fallback is PASSTHROUGH
    assert [p for p, _ in router.skipped] == [OPENAI, VLLM]
    assert router.resolve({":path": "/v1/chat/completions"})[1] is PASSTHROUGH
    assert router.resolve({":path": "/v1/messages"})[1] is ANTHROPIC


def test_registration_ignores_duplicate_type_when_configured_twice() -> None:
    other = build(OpenAIParser, name="second-openai")
    router = ParserRouter([OPENAI, other])
    assert router.parsers == (OPENAI,)
    assert router.skipped[0][0] is other
    assert "already registered" in router.skipped[0][1]


@pytest.mark.parametrize(
    ("parsers", "headers", "message"),
    [
        pytest.param(
            [OPENAI],
            {":path": "/v1/models?limit=1"},
            "no parser found for path /v1/models",
            id="unclaimed-without-fallback",
        ),
        pytest.param(
            [ANTHROPIC],
            {},
            "no parser found for path /v1/completions",
            id="default-path-unclaimed",
        ),
        pytest.param([], {":path": "/x"}, "no parser found for path /x", id="no-parsers"),
    ],
)
def test_resolve_raises_bad_request_when_no_parser_matches(
    parsers: list[Parser], headers: dict[str, str], message: str
) -> None:
    with pytest.raises(InferenceError) as info:
        ParserRouter(parsers).resolve(headers)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message == message


def test_resolve_uses_default_completions_path_when_no_path_header() -> None:
    assert ParserRouter([OPENAI]).resolve({"content-type": "application/json"}) == (
        "/v1/completions",
        OPENAI,
    )


def test_resolve_ignores_empty_claims_when_claim_is_only_slashes() -> None:
    blank = claiming("blank", "/", "real")
    router = ParserRouter([blank, PASSTHROUGH])
    assert router.resolve({":path": "/other"})[1] is PASSTHROUGH
    assert router.resolve({":path": "/v1/real"})[1] is blank


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/google.cloud.aiplatform.v1.PredictionService/ChatCompletions", "vertex"),
        pytest.param("/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict", "vertex"),
        pytest.param("/PredictionService/RawPredict", "vertex", id="unqualified-service"),
        pytest.param("/vllm.grpc.engine.VllmEngine/Generate", "vllm", id="full-service-name"),
        pytest.param("/engine.VllmEngine/Generate", "fallback", id="package-differs"),
        pytest.param("/x.PredictionServiceX/RawPredict", "fallback", id="other-service"),
        pytest.param("/v1/x.ChatCompletions", "fallback", id="last-segment-compared-whole"),
        pytest.param("/a.b/chat/completions", "openai", id="dotted-segment-not-before-method"),
    ],
)
def test_resolve_matches_grpc_service_by_unqualified_name(path: str, expected: str) -> None:
    router = ParserRouter(
        [
            claiming("vertex", "PredictionService/ChatCompletions", "PredictionService/RawPredict"),
            claiming("vllm", "vllm.grpc.engine.VllmEngine/Generate"),
            claiming("openai", "chat/completions"),
            claiming("fallback"),
        ]
    )
    assert router.resolve({":path": path})[1].typed_name.name == expected


def test_every_built_in_parser_routes_its_own_paths() -> None:
    sglang, vertex, grpc = build(SGLangHttpParser), build(VertexAIParser), build(VllmGrpcParser)
    router = ParserRouter([OPENAI, ANTHROPIC, VLLM, sglang, vertex, grpc])
    for path, expected in [
        ("/generate", sglang),
        ("/inference/v1/generate", VLLM),
        ("/vllm.grpc.engine.VllmEngine/Generate", grpc),
        ("/vllm.grpc.engine.VllmEngine/Embed", grpc),
        ("/google.cloud.aiplatform.v1.PredictionService/StreamRawPredict", vertex),
        ("/v1/chat/completions", OPENAI),
    ]:
        assert router.resolve_path(path) is expected, path

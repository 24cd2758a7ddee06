from __future__ import annotations

import logging
from typing import Any

import pytest

from epp.plugin import (
    Decider,
    Endpoint,
    InferenceRequest,
    NoParams,
    PrefixMatchInfo,
    RequestBody,
    TokenizedPrompt,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class
from epp.plugins.profiles.deciders import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
    PrefixBasedPDDecider,
)
from tests.builders import handle, make_cycle, make_endpoint, make_request

DECODE = make_endpoint(0)
OTHER = make_endpoint(1)


def _prefix(**params: Any) -> PrefixBasedPDDecider:
    return PrefixBasedPDDecider(
        name="prefix-based-pd-decider",
        params=decode(PrefixBasedPDDecider.Params, params),
        handle=handle(),
    )


def _request(tokens: int | None, matched_blocks: int | None, block: int = 16) -> InferenceRequest:
    request = make_request(body=RequestBody(kind="completions", payload={}, raw=b""))
    if tokens is not None:
        request.attributes["TokenizedPrompt/token-producer"] = TokenizedPrompt.from_token_ids(
            [range(tokens)]
        )
    if matched_blocks is not None:
        total = -(-(tokens or 0) // block)
        request.attributes["PrefixCacheMatchInfo/approx-prefix-cache-producer"] = {
            DECODE.id: PrefixMatchInfo(matched_blocks, total, block),
            OTHER.id: PrefixMatchInfo(0, total, block),
        }
    return request


@pytest.mark.parametrize(
    ("params", "tokens", "matched", "expected"),
    [
        pytest.param({}, 1000, 0, False, id="nonCachedTokens-0-disables"),
        pytest.param({"nonCachedTokens": 16}, 1000, 0, True, id="uncached-long-prompt"),
        pytest.param({"nonCachedTokens": 16}, 15, 0, False, id="prompt-shorter-than-threshold"),
        pytest.param({"nonCachedTokens": 16}, 16, 0, True, id="equal-to-threshold-disaggregates"),
        # 1000 - 62*16 = 8 uncached tokens < 16
        pytest.param({"nonCachedTokens": 16}, 1000, 62, False, id="mostly-cached"),
        # 1000 - 61*16 = 24 uncached tokens >= 16
        pytest.param({"nonCachedTokens": 16}, 1000, 61, True, id="just-enough-uncached"),
        pytest.param({"nonCachedTokens": 16, "promptTokens": 2000}, 1000, 0, False, id="gate"),
        pytest.param({"nonCachedTokens": 16, "promptTokens": 1000}, 1000, 0, True, id="gate-met"),
        pytest.param({"nonCachedTokens": 16}, None, 0, False, id="no-tokenized-prompt"),
    ],
)
def test_prefix_based_decision(
    params: dict[str, Any], tokens: int | None, matched: int, expected: bool
) -> None:
    decider = _prefix(**params)
    assert decider.disaggregate(make_cycle(), _request(tokens, matched), DECODE) is expected


def test_prefix_based_reads_the_decode_picks_own_match_info() -> None:
    decider = _prefix(nonCachedTokens=16)
    request = _request(1000, 62)  # DECODE caches almost everything, OTHER nothing
    assert decider.disaggregate(make_cycle(), request, DECODE) is False
    assert decider.disaggregate(make_cycle(), request, OTHER) is True


def test_prefix_based_reads_only_the_default_producers_keys() -> None:
    decider = _prefix(nonCachedTokens=16)
    request = _request(1000, None)
    request.attributes["PrefixCacheMatchInfo/precise-prefix-cache-producer"] = {
        DECODE.id: PrefixMatchInfo(0, 63, 16)
    }
    assert decider.disaggregate(make_cycle(), request, DECODE) is False


@pytest.mark.parametrize(
    ("request_", "endpoint", "message"),
    [
        pytest.param(_request(1000, None), DECODE, "unable to read prefix cache state", id="info"),
        pytest.param(_request(1000, 0), None, "endpoint is nil", id="endpoint"),
        pytest.param(make_request(), DECODE, "request body is nil", id="body"),
    ],
)
def test_prefix_based_says_no_and_logs_when_inputs_are_missing(
    request_: InferenceRequest,
    endpoint: Endpoint | None,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    decider = _prefix(nonCachedTokens=16)
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            assert decider.disaggregate(make_cycle(), request_, endpoint) is False
    assert [r.getMessage() for r in caplog.records].count(f"prefix decider: {message}") == 1


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"nonCachedTokens": -1}, "nonCachedTokens parameter of prefix disaggregation decider"),
        ({"promptTokens": -1}, "promptTokens parameter of prefix disaggregation decider"),
        ({"nonCachedToken": 1}, "unknown field"),
    ],
)
def test_prefix_based_rejects_bad_parameters(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(ParamError, match=problem):
        decode(PrefixBasedPDDecider.Params, params)


def test_prefix_based_disabled_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        _prefix()
    assert "Prefix-based PD disabled (nonCachedTokens=0)" in caplog.text


def test_always_disagg_pd() -> None:
    decider = AlwaysDisaggPDDecider(name="a", params=NoParams(), handle=handle())
    assert decider.disaggregate(make_cycle(), make_request(), None) is True
    assert decider.disaggregate(make_cycle(), make_request(), DECODE) is True


def _body(kind: str, messages: Any) -> InferenceRequest:
    payload = {"model": "m", "messages": messages}
    return make_request(body=RequestBody(kind=kind, payload=payload, raw=b""))


def _chat(*blocks: dict[str, Any]) -> InferenceRequest:
    return _body("chat", [{"role": "user", "content": list(blocks)}])


TEXT = {"type": "text", "text": "describe"}


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        pytest.param(_chat(TEXT), False, id="text-only"),
        pytest.param(_body("chat", [{"role": "user", "content": "hi"}]), False, id="string"),
        pytest.param(
            _chat(TEXT, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}),
            True,
            id="image_url",
        ),
        pytest.param(_chat({"type": "video_url", "video_url": {"url": "v"}}), True, id="video"),
        pytest.param(_chat({"type": "input_audio", "input_audio": {"data": "AA"}}), True, id="aud"),
        pytest.param(_chat({"type": "audio_url", "audio_url": {"url": "a"}}), True, id="aud-url"),
        pytest.param(
            _body(
                "chat",
                [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
                ],
            ),
            True,
            id="later-message",
        ),
        pytest.param(
            _body(
                "anthropic-messages",
                [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "u"}}],
                    }
                ],
            ),
            True,
            id="anthropic-image",
        ),
        pytest.param(
            _body(
                "anthropic-messages",
                [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [
                                    {"type": "image", "source": {"type": "base64", "data": "AA"}}
                                ],
                            }
                        ],
                    }
                ],
            ),
            True,
            id="anthropic-tool-result-image",
        ),
        pytest.param(
            _body(
                "anthropic-messages",
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
            ),
            False,
            id="anthropic-has-no-image_url-block",
        ),
        pytest.param(
            make_request(body=RequestBody("completions", {"prompt": "image_url"}, b"")),
            False,
            id="completions",
        ),
        pytest.param(make_request(), False, id="no-body"),
        pytest.param(_body("chat", "not-a-list"), False, id="malformed"),
    ],
)
def test_multimodal_decider(request_: InferenceRequest, expected: bool) -> None:
    decider = AlwaysDisaggMultimodalDecider(name="mm", params=NoParams(), handle=handle())
    assert decider.disaggregate(make_cycle(), request_, DECODE) is expected


@pytest.mark.parametrize(
    ("cls", "type_name"),
    [
        (PrefixBasedPDDecider, "prefix-based-pd-decider"),
        (AlwaysDisaggPDDecider, "always-disagg-pd-decider"),
        (AlwaysDisaggMultimodalDecider, "always-disagg-multimodal-decider"),
    ],
)
def test_deciders_fill_the_decider_role(cls: type[Any], type_name: str) -> None:
    check_plugin_class(cls, type_name)
    plugin = cls(name=type_name, params=decode(cls.Params, None), handle=handle())
    assert isinstance(plugin, Decider)

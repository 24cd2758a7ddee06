from __future__ import annotations

import logging
from typing import Any

import pytest

from epp.plugin.params import ParamError, decode
from epp.plugins.profiles.disagg import DisaggProfileHandler
from epp.plugins.profiles.disagg_params import DisaggParams, Effective, parse_stage_order
from tests.unit.plugins.profiles.disagg_helpers import PluginsHandle


def _effective(params: dict[str, Any] | None) -> Effective:
    p: DisaggParams = decode(DisaggParams, params)
    return p.effective()


@pytest.mark.parametrize(
    ("text", "order"),
    [
        ("", "decode-first"),
        ("decode-first", "decode-first"),
        ("Decode_First", "decode-first"),
        ("decode", "decode-first"),
        ("prefill-first", "prefill-first"),
        ("PREFILLFIRST", "prefill-first"),
        ("prefill", "prefill-first"),
    ],
)
def test_stage_order_spellings(text: str, order: str) -> None:
    assert parse_stage_order(text) == order


def test_defaults() -> None:
    assert _effective(None) == Effective("decode-first", "decode", "prefill", "encode", "", "")


def test_nested_format() -> None:
    params = {
        "stageOrder": "decode-first",
        "profiles": {"decode": "d", "prefill": "p"},
        "deciders": {"prefill": "pd", "encode": "ed"},
    }
    assert _effective(params) == Effective("decode-first", "d", "p", "encode", "pd", "ed")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"decodeProfile": "d", "prefillProfile": "p", "encodeProfile": "e"},
            Effective("decode-first", "d", "p", "e", "", ""),
        ),
        (
            {"prefillDeciderPluginName": "a", "encodeDeciderPluginName": "b"},
            Effective("decode-first", "decode", "prefill", "encode", "a", "b"),
        ),
        (
            {"deciderPluginName": "legacy"},
            Effective("decode-first", "decode", "prefill", "encode", "legacy", ""),
        ),
        (
            {"deciderPluginName": "legacy", "prefillDeciderPluginName": "wins"},
            Effective("decode-first", "decode", "prefill", "encode", "wins", ""),
        ),
        (
            {"decodeProfile": "", "stageOrder": "prefill-first"},
            Effective("prefill-first", "decode", "prefill", "encode", "", ""),
        ),
    ],
)
def test_flat_format_maps_to_nested(params: dict[str, Any], expected: Effective) -> None:
    assert _effective(params) == expected


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"stageOrder": "sideways"}, "invalid stage order 'sideways'"),
        ({"profiles": {}, "decodeProfile": "d"}, "use one format exclusively"),
        ({"deciders": {"prefill": "x"}, "deciderPluginName": "y"}, "use one format exclusively"),
        (
            {"stageOrder": "prefill-first", "deciders": {"prefill": "x"}},
            "prefill decider is not supported in prefill-first stage order",
        ),
        (
            {"stageOrder": "prefill-first", "deciderPluginName": "x"},
            "prefill decider is not supported",
        ),
        ({"profiles": {"verify": "x"}}, r"profiles.verify: unknown field \(known: decode, encode"),
        ({"primaryPort": 8000}, "primaryPort: unknown field"),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(ParamError, match=problem):
        decode(DisaggParams, params)


def test_flat_format_is_logged_as_deprecated(caplog: pytest.LogCaptureFixture) -> None:
    params = decode(
        DisaggParams,
        {"decodeProfile": "d", "deciderPluginName": "a", "prefillDeciderPluginName": "b"},
    )
    with caplog.at_level(logging.INFO):
        DisaggProfileHandler(name="h", params=params, handle=PluginsHandle())
    lines = [r.getMessage() for r in caplog.records]
    assert "Deprecated parameter 'decodeProfile', use 'profiles.decode' instead" in lines
    assert (
        "Deprecated parameter 'prefillDeciderPluginName', use 'deciders.prefill' instead" in lines
    )
    assert not any("'deciderPluginName'" in line for line in lines)  # shadowed alias
    assert any("flat parameter format" in line for line in lines)

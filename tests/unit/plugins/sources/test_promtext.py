from __future__ import annotations

import math
from pathlib import Path

import pytest

from epp.plugins.sources.promtext import Sample, parse, parse_line

TESTDATA = Path(__file__).parent / "testdata"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("up 1", Sample("up", {}, 1.0), id="bare-name"),
        pytest.param("up\t2.5", Sample("up", {}, 2.5), id="tab-separated"),
        pytest.param('a{x="1"} 3 1700', Sample("a", {"x": "1"}, 3.0, 1700), id="timestamp"),
        pytest.param('a{x="1",} 3', Sample("a", {"x": "1"}, 3.0), id="trailing-comma"),
        pytest.param('a{ x = "1" , y="2" } 3', Sample("a", {"x": "1", "y": "2"}, 3.0), id="spaces"),
        pytest.param("a{} 4", Sample("a", {}, 4.0), id="empty-labels"),
        pytest.param('a{x="q\\"uote"} 1', Sample("a", {"x": 'q"uote'}, 1.0), id="escaped-quote"),
        pytest.param('a{x="back\\\\slash"} 1', Sample("a", {"x": "back\\slash"}, 1.0), id="bslash"),
        pytest.param('a{x="two\\nlines"} 1', Sample("a", {"x": "two\nlines"}, 1.0), id="newline"),
        pytest.param('a{x="has } and ,"} 1', Sample("a", {"x": "has } and ,"}, 1.0), id="punct"),
        pytest.param("a +Inf", Sample("a", {}, math.inf), id="plus-inf"),
        pytest.param("a -Inf", Sample("a", {}, -math.inf), id="minus-inf"),
        pytest.param("a 1e-3", Sample("a", {}, 0.001), id="exponent"),
        pytest.param("vllm:x_total 7", Sample("vllm:x_total", {}, 7.0), id="colon-name"),
        pytest.param("a 1\r", Sample("a", {}, 1.0), id="crlf"),
        pytest.param("  a 1", Sample("a", {}, 1.0), id="indented"),
    ],
)
def test_parse_line_reads_sample_when_line_is_valid(line: str, expected: Sample) -> None:
    assert parse_line(line) == expected


def test_parse_line_reads_nan_when_value_is_nan() -> None:
    sample = parse_line('a{x="1"} NaN')
    assert sample is not None
    assert math.isnan(sample.value)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("# HELP a some help", id="help"),
        pytest.param("# TYPE a gauge", id="type"),
        pytest.param("# a free comment", id="comment"),
    ],
)
def test_parse_line_returns_none_when_line_has_no_sample(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("line", "match"),
    [
        pytest.param("a", "expected 'value \\[timestamp\\]' in 'a'", id="no-value"),
        pytest.param("a one", "bad value or timestamp in 'a one'", id="word-value"),
        pytest.param(
            "a 1 2 3", "expected 'value \\[timestamp\\]' in 'a 1 2 3'", id="too-many-fields"
        ),
        pytest.param("a 1 1.5", "bad value or timestamp in 'a 1 1\\.5'", id="float-timestamp"),
        pytest.param("a 1_000", "bad value in 'a 1_000'", id="digit-separator"),
        pytest.param('a{x="1" 2', "expected ',' or '\\}' after label 'x'", id="unclosed-brace"),
        pytest.param('a{x="1} 2', "unterminated label value", id="unclosed-quote"),
        pytest.param("a{x=1} 2", "label 'x' value is not quoted", id="unquoted-value"),
        pytest.param(
            'a{x="1"y="2"} 2', "expected ',' or '\\}' after label 'x'", id="missing-comma"
        ),
        pytest.param('a{x="\\t"} 2', "invalid escape '\\\\t'", id="bad-escape"),
        pytest.param('a{x="1",x="2"} 2', "duplicate label 'x'", id="duplicate-label"),
        pytest.param('a{1x="1"} 2', "bad label name in 'a\\{1x=\"1\"\\} 2'", id="bad-label-name"),
        pytest.param("1a 2", "bad metric name in '1a 2'", id="bad-metric-name"),
        pytest.param("a-b 2", "bad metric name in 'a\\-b 2'", id="dash-in-name"),
    ],
)
def test_parse_line_raises_when_line_is_malformed(line: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_line(line)


def test_parse_counts_skipped_lines_when_payload_has_malformed_lines() -> None:
    payload = b'# TYPE a gauge\na 1\nbroken line here\na{x="2"} 2\nb{ 3\n\n'
    families = parse(payload)
    assert families.skipped == 2
    assert families == {"a": [Sample("a", {}, 1.0), Sample("a", {"x": "2"}, 2.0)]}


@pytest.mark.parametrize(
    ("wanted", "expected_names"),
    [
        pytest.param(None, {"a", "ab", "a_bucket", "c"}, id="all"),
        pytest.param(frozenset({"a"}), {"a"}, id="prefix-of-other-names"),
        pytest.param(frozenset({"a_bucket"}), {"a_bucket"}, id="histogram-suffix"),
        pytest.param(frozenset({"c", "zz"}), {"c"}, id="absent-name-ignored"),
        pytest.param(frozenset(), set(), id="nothing"),
    ],
)
def test_parse_keeps_only_wanted_series_when_wanted_given(
    wanted: frozenset[str] | None, expected_names: set[str]
) -> None:
    payload = b'a 1\nab 2\na_bucket{le="+Inf"} 3\n# TYPE c gauge\nc 4'
    assert set(parse(payload, wanted)) == expected_names


def test_parse_skips_only_wanted_malformed_lines_when_wanted_given() -> None:
    payload = b"a 1\na oops\nb oops\nb nope\n"
    families = parse(payload, frozenset({"a"}))
    assert families == {"a": [Sample("a", {}, 1.0)]}
    assert families.skipped == 1


def test_parse_matches_first_and_last_line_when_wanted_given() -> None:
    payload = b"first 1\nmiddle 2\nlast 3"
    families = parse(payload, frozenset({"first", "last"}))
    assert families == {"first": [Sample("first", {}, 1.0)], "last": [Sample("last", {}, 3.0)]}


@pytest.mark.parametrize(
    "name",
    ["vllm.prom", "sglang.prom", "trtllm.prom", "triton-tensorrt-llm.prom", "triton.prom"],
)
def test_parse_fast_path_agrees_with_full_parse_when_reading_golden_scrapes(name: str) -> None:
    payload = (TESTDATA / name).read_bytes()
    full = parse(payload)
    assert full.skipped == 0
    wanted = frozenset(full)
    assert dict(parse(payload, wanted)) == dict(full)


def test_parse_keeps_histogram_series_apart_when_reading_vllm_scrape() -> None:
    families = parse((TESTDATA / "vllm.prom").read_bytes())
    buckets = families["vllm:time_to_first_token_seconds_bucket"]
    assert [s.labels["le"] for s in buckets] == ["0.001", "0.005", "+Inf"]
    assert families["vllm:time_to_first_token_seconds_count"][0].value == 412.0
    assert families["vllm:time_to_first_token_seconds_sum"][0].value == 37.52

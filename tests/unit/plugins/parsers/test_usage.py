from __future__ import annotations

import random
from typing import Any

import pytest

from epp.plugin import ParsedResponse, Usage
from epp.plugins.parsers import usage as usage_mod
from epp.plugins.parsers.usage import (
    AnthropicDialect,
    Dialect,
    NullResponseState,
    OpenAIDialect,
    ResponseUsageState,
    SGLangDialect,
    is_event_stream,
    openai_usage,
    parse_whole,
    to_int,
)

SSE = {"content-type": "text/event-stream; charset=utf-8"}
JSON = {"content-type": "application/json"}

OPENAI_STREAM = (
    b'data: {"id":"1","choices":[{"delta":{"content":"Hel"}}],"usage":null}\n\n'
    b'data: {"id":"1","choices":[{"delta":{"content":"lo"}}],"usage":null}\n\n'
    b'data: {"id":"1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":10,'
    b'"total_tokens":17,"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
    b"data: [DONE]\n\n"
)
OPENAI_STREAM_USAGE = Usage(prompt_tokens=7, completion_tokens=10, cached_tokens=4, total_tokens=17)

ANTHROPIC_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":25,'
    b'"cache_read_input_tokens":5,"output_tokens":1}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"hi"}}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":15}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(5, 5, id="int"),
        pytest.param(5.9, 5, id="float-truncates"),
        pytest.param("12", 12, id="numeric-string"),
        pytest.param("3.7", 3, id="float-string"),
        pytest.param("abc", 0, id="non-numeric-string"),
        pytest.param("nan", 0, id="nan-string"),
        pytest.param(float("inf"), 0, id="infinity"),
        pytest.param(True, 0, id="boolean"),
        pytest.param(None, 0, id="null"),
        pytest.param([1], 0, id="array"),
    ],
)
def test_to_int_coerces_number_like_values_when_value_given(value: Any, expected: int) -> None:
    assert to_int(value) == expected


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param(
            {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
            id="chat-names",
        ),
        pytest.param(
            {
                "input_tokens": 31,
                "output_tokens": 9,
                "total_tokens": 40,
                "input_tokens_details": {"cached_tokens": 16},
            },
            Usage(prompt_tokens=31, completion_tokens=9, cached_tokens=16, total_tokens=40),
            id="responses-names",
        ),
        pytest.param(
            {"prompt_tokens": "3", "completion_tokens": "4", "total_tokens": "7"},
            Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
            id="numeric-strings",
        ),
        pytest.param(
            {"prompt_tokens": None, "input_tokens": 8, "output_tokens": 2},
            Usage(prompt_tokens=8, completion_tokens=2),
            id="null-falls-through-to-alternate-name",
        ),
        pytest.param(
            {"prompt_tokens": "x", "input_tokens": 8},
            Usage(),
            id="malformed-first-name-decides",
        ),
        pytest.param(
            {"prompt_tokens": 8, "total_tokens": 8, "prompt_tokens_details": None},
            Usage(prompt_tokens=8, total_tokens=8),
            id="embeddings-null-details",
        ),
    ],
)
def test_openai_usage_reads_both_namings_when_usage_object_given(
    usage: dict[str, Any], expected: Usage
) -> None:
    assert openai_usage(usage) == expected


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        pytest.param(
            b'{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}',
            JSON,
            ParsedResponse(Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)),
            id="json-body",
        ),
        pytest.param(
            b'  \n{"usage":{"prompt_tokens":3}}',
            {},
            ParsedResponse(Usage(prompt_tokens=3)),
            id="json-detected-without-content-type",
        ),
        pytest.param(b'{"id":"x"}', JSON, ParsedResponse(), id="json-without-usage"),
        pytest.param(b'{"usage":5}', JSON, ParsedResponse(), id="usage-not-object"),
        pytest.param(b'{"usage":{"prompt', JSON, ParsedResponse(), id="truncated-json"),
        pytest.param(b"", JSON, ParsedResponse(), id="empty"),
        pytest.param(
            OPENAI_STREAM,
            SSE,
            ParsedResponse(OPENAI_STREAM_USAGE, streamed_events=3),
            id="sse-transcript",
        ),
        pytest.param(
            OPENAI_STREAM,
            {},
            ParsedResponse(OPENAI_STREAM_USAGE, streamed_events=3),
            id="sse-detected-without-content-type",
        ),
        pytest.param(
            b'event: response.created\ndata: {"type":"response.created"}\n\n'
            b'event: response.completed\ndata: {"type":"response.completed","response":'
            b'{"usage":{"input_tokens":31,"output_tokens":9,"total_tokens":40}}}\n\n',
            SSE,
            ParsedResponse(
                Usage(prompt_tokens=31, completion_tokens=9, total_tokens=40), streamed_events=2
            ),
            id="responses-api-completed-event",
        ),
        pytest.param(
            b'data: {"type":"response.in_progress","response":{"usage":{"input_tokens":1}}}\n',
            SSE,
            ParsedResponse(streamed_events=1),
            id="responses-usage-ignored-before-completed",
        ),
        pytest.param(
            b'data:{"usage":{"prompt_tokens":1}}\n data: {"usage":{"prompt_tokens":2}}\n'
            b"data: [DONE]\r\n",
            SSE,
            ParsedResponse(),
            id="only-exact-data-prefix-counts",
        ),
        pytest.param(
            b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\r\n'
            b"\r\ndata: [DONE]\r\n\r\n",
            SSE,
            ParsedResponse(
                Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2), streamed_events=1
            ),
            id="crlf-lines",
        ),
        pytest.param(
            b'data: {"usage": {broken\n\ndata: not json\n\n',
            SSE,
            ParsedResponse(streamed_events=2),
            id="malformed-events-counted-without-usage",
        ),
        pytest.param(
            b'data: {"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n'
            b'data: {"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n',
            SSE,
            ParsedResponse(
                Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8), streamed_events=2
            ),
            id="running-totals-latest-wins",
        ),
        pytest.param(
            b'{"not":"sse"}',
            SSE,
            ParsedResponse(),
            id="event-stream-header-wins-over-json-look",
        ),
    ],
)
def test_parse_whole_extracts_openai_usage_when_body_complete(
    body: bytes, headers: dict[str, str], expected: ParsedResponse
) -> None:
    assert parse_whole(OpenAIDialect, body, headers) == expected


def _feed_all(dialect: Dialect, chunks: list[bytes], headers: Any = None) -> ParsedResponse:
    """Feed chunks into one state and accumulate as the server does."""
    state = ResponseUsageState(dialect, headers)
    total: Usage | None = None
    events = 0
    for i, chunk in enumerate(chunks):
        parsed = state.feed(chunk, i == len(chunks) - 1)
        events += parsed.streamed_events
        if parsed.usage is not None:
            total = total or Usage()
            total.merge(parsed.usage)
    return ParsedResponse(total, events)


def _split(data: bytes, cut: int) -> list[bytes]:
    return [data[:cut], data[cut:], b""]


@pytest.mark.parametrize(
    ("dialect", "transcript", "expected"),
    [
        pytest.param(
            OpenAIDialect,
            OPENAI_STREAM,
            ParsedResponse(OPENAI_STREAM_USAGE, streamed_events=3),
            id="openai",
        ),
        pytest.param(
            AnthropicDialect,
            ANTHROPIC_STREAM,
            ParsedResponse(
                Usage(prompt_tokens=25, completion_tokens=15, cached_tokens=5, total_tokens=40)
            ),
            id="anthropic",
        ),
    ],
)
def test_feed_gives_whole_stream_result_when_split_at_every_offset(
    dialect: Dialect, transcript: bytes, expected: ParsedResponse
) -> None:
    assert parse_whole(dialect, transcript, SSE) == expected
    for cut in range(len(transcript) + 1):
        assert _feed_all(dialect, _split(transcript, cut), SSE) == expected, cut


def test_feed_gives_whole_stream_result_when_fed_one_byte_at_a_time() -> None:
    chunks = [OPENAI_STREAM[i : i + 1] for i in range(len(OPENAI_STREAM))] + [b""]
    expected = ParsedResponse(OPENAI_STREAM_USAGE, streamed_events=3)
    assert _feed_all(OpenAIDialect, chunks) == expected


def test_feed_reports_usage_in_chunk_that_completes_event_when_event_split() -> None:
    state = ResponseUsageState(OpenAIDialect, SSE)
    first = state.feed(b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_tok', False)
    second = state.feed(b'ens":7,"completion_tokens":10,"total_tokens":17}}\n\n', False)
    third = state.feed(b"data: [DONE]\n\n", True)
    assert first == ParsedResponse(streamed_events=1)
    assert second == ParsedResponse(
        Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17), streamed_events=1
    )
    assert third == ParsedResponse()


def test_feed_parses_last_line_when_stream_ends_without_newline() -> None:
    state = ResponseUsageState(OpenAIDialect)
    assert state.feed(b'data: {"usage":{"prompt_tokens":2,', False) == ParsedResponse()
    assert state.feed(b'"total_tokens":2}}', True) == ParsedResponse(
        Usage(prompt_tokens=2, total_tokens=2), streamed_events=1
    )


@pytest.mark.parametrize(
    ("dialect", "chunks", "expected"),
    [
        pytest.param(
            OpenAIDialect,
            [b"", b"  ", b'{"usage":{"prompt_tokens":3,', b'"completion_tokens":4}}', b""],
            ParsedResponse(Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)),
            id="openai-json-in-chunks-after-blanks",
        ),
        pytest.param(
            AnthropicDialect,
            [b'{"usage":{"input_tokens":10,', b'"output_tokens":5}}'],
            ParsedResponse(Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)),
            id="anthropic-json-in-chunks",
        ),
        pytest.param(
            OpenAIDialect,
            [b'{"usage":{"prompt_tokens":3}', b""],
            ParsedResponse(),
            id="truncated-json-body",
        ),
        pytest.param(OpenAIDialect, [b""], ParsedResponse(), id="empty-response"),
    ],
)
def test_feed_parses_json_once_at_end_when_body_not_event_stream(
    dialect: Dialect, chunks: list[bytes], expected: ParsedResponse
) -> None:
    state = ResponseUsageState(dialect, JSON)
    for chunk in chunks[:-1]:
        assert state.feed(chunk, False) == ParsedResponse()
    assert _feed_all(dialect, chunks, JSON) == expected


def test_feed_drops_oversized_line_but_counts_it_when_line_exceeds_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(usage_mod, "MAX_SSE_LINE", 32)
    chunks = [
        b"data: " + b"x" * 40,
        b"y" * 40,
        b'yyy\ndata: {"usage":{"prompt_tokens":1,"total_tokens":1}}\n',
        b"data: [DONE]\n",
    ]
    expected = ParsedResponse(Usage(prompt_tokens=1, total_tokens=1), streamed_events=2)
    assert _feed_all(OpenAIDialect, chunks, SSE) == expected


def test_feed_stops_buffering_json_when_body_exceeds_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(usage_mod, "MAX_JSON_BODY", 16)
    chunks = [b'{"usage":{"prompt_tokens":3},', b'"pad":"' + b"z" * 20 + b'"}', b""]
    assert _feed_all(OpenAIDialect, chunks, JSON) == ParsedResponse()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"content-type": "text/event-stream"}, True, id="plain"),
        pytest.param({"content-type": "Text/Event-Stream; charset=utf-8"}, True, id="params"),
        pytest.param({"Content-Type": "text/event-stream"}, True, id="mixed-case-name"),
        pytest.param({"content-type": "application/json"}, False, id="json"),
        pytest.param({}, False, id="missing"),
        pytest.param(None, False, id="none"),
    ],
)
def test_is_event_stream_reads_content_type_when_headers_given(
    headers: dict[str, str] | None, expected: bool
) -> None:
    assert is_event_stream(headers) is expected


def test_null_state_reports_nothing_when_fed_usage() -> None:
    assert NullResponseState().feed(OPENAI_STREAM, True) == ParsedResponse()


# ---- Responses API response ids ----------------------------------------------------------------

RESPONSES_STREAM = (
    b"event: response.created\n"
    b'data: {"type": "response.created", "response": {"id": "resp_abc", "object": "response",'
    b' "status": "in_progress", "usage": null}}\n\n'
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","delta":"Hi"}\n\n'
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"id":"resp_abc","object":"response",'
    b'"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}}\n\n'
)


@pytest.mark.parametrize("cut", [1, 17, 60, 150, len(RESPONSES_STREAM) - 1])
def test_response_id_read_from_created_event_when_stream_is_split_anywhere(cut: int) -> None:
    state = ResponseUsageState(OpenAIDialect, SSE)
    first = state.feed(RESPONSES_STREAM[:cut], False)
    second = state.feed(RESPONSES_STREAM[cut:], True)
    assert (first.response_id or second.response_id) == "resp_abc"
    usage = Usage()
    for parsed in (first, second):
        if parsed.usage is not None:
            usage.merge(parsed.usage)
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 2)


def test_response_id_read_from_json_body_only_for_stored_responses() -> None:
    body = b'{"id":"resp_9","object":"response","usage":{"input_tokens":3,"output_tokens":1}}'
    assert parse_whole(OpenAIDialect, body, JSON).response_id == "resp_9"
    chat = b'{"id":"chatcmpl-1","object":"chat.completion","usage":{"prompt_tokens":3}}'
    assert parse_whole(OpenAIDialect, chat, JSON).response_id == ""
    assert parse_whole(AnthropicDialect, b'{"id":"msg_1","type":"message"}', JSON).response_id == ""


def test_token_deltas_are_never_decoded_when_scanning_a_responses_stream(monkeypatch: Any) -> None:
    decoded: list[bytes] = []
    real = usage_mod._decode

    def spy(data: bytes) -> Any:
        decoded.append(data)
        return real(data)

    monkeypatch.setattr(usage_mod, "_decode", spy)
    parse_whole(OpenAIDialect, RESPONSES_STREAM, SSE)
    assert len(decoded) == 2  # response.created and response.completed only


ONE_EVENT_CHUNKS = [
    b'data: {"id":"1","choices":[{"delta":{"content":"Hel"}}]}\n\n',
    b'data: {"id":"1","choices":[{"delta":{"content":"Hel"}}],"usage":null}\n\n',
    b"data: [DONE]\n\n",
    b"data: [DONE]\r\n\n",
    b"data: \n\n",
    b'data: {"type":"response.created","response":{"id":"resp_1","store":true}}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":10}}\n\n',
    b'data: {"a":1}\r\n\r\n',
    b'data: {"a":1}\n\ndata: {"b":2}\n\n',
    b'event: x\ndata: {"a":1}\n\n',
    b'data: {"a":1}\n',
    b'data: {"a":1}',
    b": comment\n\n",
    b"data: [DONE]x\n\n",
    b"data: x\n\n",
    b"data: \r\n\n",
    b"data:\n\n",
    b"\n\n",
    b'data: {"text":"Hi","meta_info":{"finish_reason":null}}\n\n',
    b'data: {"text":"Hi","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":5}}\n\n',
]


@pytest.mark.parametrize("dialect", [OpenAIDialect, AnthropicDialect, SGLangDialect])
@pytest.mark.parametrize("end", [False, True])
@pytest.mark.parametrize("chunk", ONE_EVENT_CHUNKS)
def test_a_chunk_fed_on_its_own_gives_what_the_line_scan_gives(
    dialect: Dialect, end: bool, chunk: bytes
) -> None:
    # The one-event shortcut and the general line scan agree on every chunk shape, and on the
    # chunk that follows (no tail is left behind by either).
    state = ResponseUsageState(dialect, SSE)
    fed = state.feed(chunk, end)
    if end or chunk.endswith(b"\n"):
        assert fed == parse_whole(dialect, chunk, SSE)
    follow = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    if not end:
        expected = parse_whole(dialect, chunk + follow, SSE)
        total = state.feed(follow, True)
        assert fed.streamed_events + total.streamed_events == expected.streamed_events
        assert (fed.usage or total.usage) == expected.usage


def test_a_one_token_chunk_is_not_line_scanned(monkeypatch: Any) -> None:
    def scan(*_: Any) -> ParsedResponse:
        raise AssertionError("line-scanned")

    state = ResponseUsageState(OpenAIDialect, SSE)
    monkeypatch.setattr(usage_mod, "_scan_lines", scan)
    token = b'data: {"id":"1","choices":[{"delta":{"content":"x"}}]}\n\n'
    assert state.feed(token, False) == ParsedResponse(streamed_events=1)
    assert state.feed(b"data: [DONE]\n\n", False) == ParsedResponse()


_SSE_LINES = [
    b'data: {"id":"1","choices":[{"delta":{"content":"a"}}]}\n\n',
    b'data: {"id":"1","choices":[{"delta":{"content":"b"}}]}\r\n\r\n',
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","delta":"c"}\n\n',
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_9"}}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n',
    b'data: {"text":"x","meta_info":{"finish_reason":null,"prompt_tokens":2}}\n\n',
    b'data: {"text":"y","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":2,'
    b'"completion_tokens":5}}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":6}}\n\n',
    b": keep-alive\n\n",
    b"data: [DONE]\n\n",
]


@pytest.mark.parametrize("dialect", [OpenAIDialect, AnthropicDialect, SGLangDialect])
def test_random_streams_cut_anywhere_read_as_the_line_scan_reads_them(dialect: Dialect) -> None:
    # chunks of one token, of several events, and of events cut anywhere, as a model server's
    # writes and Envoy's reads bring them: each chunk reads as the general path (split into
    # lines, the last kept until it ends, each line scanned) reads it
    rng = random.Random(11)
    for _ in range(400):
        transcript = b"".join(rng.choice(_SSE_LINES) for _ in range(rng.randrange(1, 12)))
        cuts = sorted(rng.sample(range(len(transcript) + 1), rng.randrange(0, 6)))
        ends = [*cuts, len(transcript)]
        chunks = [transcript[a:b] for a, b in zip([0, *cuts], ends, strict=True)]
        state = ResponseUsageState(dialect, SSE)
        tail = b""
        for i, chunk in enumerate(chunks):
            end = i == len(chunks) - 1
            lines = (tail + chunk).split(b"\n")
            tail = b"" if end else lines.pop()
            assert state.feed(chunk, end) == usage_mod._scan_lines(dialect, lines), chunks

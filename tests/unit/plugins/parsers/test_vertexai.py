from __future__ import annotations

import orjson
import pytest

from epp._proto import epp_vertexai_v1_pb2 as vertex
from epp.plugin import APP_PROTOCOL_H2C, ErrorCode, InferenceError, Parser, Usage
from epp.plugin.testing import check_parser
from epp.plugins.parsers.grpcwire import frame
from epp.plugins.parsers.vertexai import VertexAIParser

PARSER = VertexAIParser(name=VertexAIParser.TYPE, params=VertexAIParser.Params(), handle=None)
SERVICE = "/google.cloud.aiplatform.v1.PredictionService"
CHAT_PATH = f"{SERVICE}/ChatCompletions"
RAW_PATH = f"{SERVICE}/RawPredict"
STREAM_PATH = "/google.cloud.aiplatform.v1beta1.PredictionService/StreamRawPredict"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
RESPONSES = {"model": "m", "input": "hello", "max_output_tokens": 5}
GRPC = {"content-type": "application/grpc"}


def request(message: type, data: bytes | None, endpoint: str = "projects/p/endpoints/e") -> bytes:
    msg = message(endpoint=endpoint)
    if data is not None:
        msg.http_body.CopyFrom(vertex.HttpBody(content_type="application/json", data=data))
    return frame(msg.SerializeToString())


def body(data: bytes, content_type: str = "application/json") -> bytes:
    return frame(vertex.HttpBody(content_type=content_type, data=data).SerializeToString())


def test_parser_satisfies_contract_when_built_without_handle() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "vertexai-parser"
    assert PARSER.supports_model_rewrite is False
    assert PARSER.claims() == (
        "PredictionService/ChatCompletions",
        "PredictionService/StreamRawPredict",
        "PredictionService/RawPredict",
    )
    assert PARSER.app_protocols() == (APP_PROTOCOL_H2C,)
    valid = request(vertex.ChatCompletionsRequest, orjson.dumps(CHAT))
    check_parser(PARSER, CHAT_PATH, valid, valid[:-3], GRPC)


def test_chat_completions_unwraps_http_body_as_openai_chat() -> None:
    raw = request(vertex.ChatCompletionsRequest, orjson.dumps({**CHAT, "stream": True}))
    result = PARSER.parse_request(CHAT_PATH, raw, GRPC)
    b = result.body
    assert (result.model, b.kind, b.stream, b.max_output_tokens) == ("m", "chat", True, 8)
    assert b.payload == {**CHAT, "stream": True}
    assert b.raw is raw
    assert result.skip_response_processing is False
    assert PARSER.rewrite_model(b, "other") is raw


@pytest.mark.parametrize(
    ("path", "message", "stream"),
    [
        pytest.param(RAW_PATH, vertex.RawPredictRequest, False, id="raw-predict"),
        pytest.param(STREAM_PATH, vertex.StreamRawPredictRequest, True, id="stream-raw-predict"),
    ],
)
def test_raw_predict_unwraps_http_body_as_openai_responses(
    path: str, message: type, stream: bool
) -> None:
    raw = request(message, orjson.dumps({**RESPONSES, "cache_salt": "s"}))
    result = PARSER.parse_request(path, raw, GRPC)
    b = result.body
    assert (result.model, b.kind, b.stream, b.max_output_tokens) == ("m", "responses", stream, 5)
    assert b.cache_salt == "s"


def test_other_methods_are_forwarded_raw_without_response_processing() -> None:
    raw = b"\x00\x00\x00\x00\x02\x08\x01"
    result = PARSER.parse_request(f"{SERVICE}/Predict", raw, GRPC)
    assert (result.model, result.body.kind, result.body.payload) == ("", "raw", None)
    assert result.body.raw is raw
    assert result.skip_response_processing is True


CHAT_JSON = orjson.dumps(CHAT)


@pytest.mark.parametrize(
    ("path", "raw", "message"),
    [
        pytest.param(
            CHAT_PATH,
            b"\x00\x00\x00",
            "invalid Vertex AI ChatCompletionsRequest: invalid gRPC frame: expected at least 5 "
            "bytes, got 3",
            id="short-frame",
        ),
        pytest.param(
            CHAT_PATH,
            b"\x01" + request(vertex.ChatCompletionsRequest, CHAT_JSON)[1:],
            "invalid Vertex AI ChatCompletionsRequest: compressed gRPC messages are not supported",
            id="compressed",
        ),
        pytest.param(
            CHAT_PATH,
            b"\x07\x00\x00\x00\x00",
            "invalid Vertex AI ChatCompletionsRequest: invalid gRPC frame: compressed flag 7",
            id="bad-flag",
        ),
        pytest.param(
            CHAT_PATH,
            request(vertex.ChatCompletionsRequest, CHAT_JSON)[:-1],
            "invalid Vertex AI ChatCompletionsRequest: incomplete gRPC message: its header says",
            id="truncated",
        ),
        pytest.param(
            CHAT_PATH,
            request(vertex.ChatCompletionsRequest, CHAT_JSON) + b"\x00",
            "invalid Vertex AI ChatCompletionsRequest: 1 bytes after the gRPC message",
            id="trailing-bytes",
        ),
        pytest.param(
            CHAT_PATH,
            frame(b"\x12\xff\xff"),
            "invalid Vertex AI ChatCompletionsRequest: malformed ChatCompletionsRequest",
            id="bad-protobuf",
        ),
        pytest.param(
            RAW_PATH,
            request(vertex.RawPredictRequest, None),
            "invalid Vertex AI RawPredictRequest: http_body is missing",
            id="no-http-body",
        ),
        pytest.param(
            CHAT_PATH,
            request(vertex.ChatCompletionsRequest, b"{not json"),
            "invalid Vertex AI ChatCompletionsRequest: error unmarshaling request bodyMap",
            id="bad-json",
        ),
        pytest.param(
            CHAT_PATH,
            request(vertex.ChatCompletionsRequest, b'{"model":"m","messages":[]}'),
            "invalid Vertex AI ChatCompletionsRequest: invalid chat completions request: must "
            "have at least one message",
            id="no-messages",
        ),
        pytest.param(
            STREAM_PATH,
            request(vertex.StreamRawPredictRequest, b'{"model":"m"}'),
            "invalid Vertex AI StreamRawPredictRequest: invalid responses request: must have "
            "input field",
            id="responses-without-input",
        ),
    ],
)
def test_parse_request_raises_bad_request_when_request_invalid(
    path: str, raw: bytes, message: str
) -> None:
    with pytest.raises(InferenceError) as info:
        PARSER.parse_request(path, raw, GRPC)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message.startswith(message), info.value.message


USAGE = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=2, total_tokens=10)
JSON_ANSWER = orjson.dumps(
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "total_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }
)
SSE_EVENTS = [
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
    b"data: " + JSON_ANSWER + b"\n\n",
    b"data: [DONE]\n\n",
]


def test_parse_response_reads_json_http_body() -> None:
    parsed = PARSER.parse_response(body(JSON_ANSWER), GRPC, streaming=False, end_of_stream=True)
    assert parsed.usage == USAGE


def test_streamed_sse_read_across_http_bodies_and_chunks() -> None:
    # the usage event is cut in two HttpBody messages, and the gRPC stream in 7-byte chunks
    events = b"".join(SSE_EVENTS)
    cut = events.index(b"usage")
    stream = body(events[:cut], "text/event-stream") + body(events[cut:], "text/event-stream")
    state = PARSER.new_response_state(GRPC)
    found, events_seen = Usage(), 0
    for i in range(0, len(stream), 7):
        parsed = state.feed(stream[i : i + 7], False)
        events_seen += parsed.streamed_events
        if parsed.usage is not None:
            found.merge(parsed.usage)
    events_seen += state.feed(b"", True).streamed_events
    assert (found, events_seen) == (USAGE, 2)


def test_responses_answer_gives_usage_and_response_id() -> None:
    answer = orjson.dumps(
        {
            "id": "resp_1",
            "object": "response",
            "usage": {"input_tokens": 4, "output_tokens": 1, "total_tokens": 5},
        }
    )
    parsed = PARSER.parse_response(body(answer), GRPC, streaming=False, end_of_stream=True)
    assert parsed.usage == Usage(prompt_tokens=4, completion_tokens=1, total_tokens=5)
    assert parsed.response_id == "resp_1"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00\x00\x00", id="partial-header"),
        pytest.param(frame(b"\x12\xff"), id="bad-protobuf"),
        pytest.param(b"\x01" + body(JSON_ANSWER)[1:], id="compressed-skipped"),
        pytest.param(body(b"not json"), id="not-json"),
        pytest.param(frame(b""), id="empty-http-body"),
    ],
)
def test_parse_response_never_raises_on_malformed_answers(raw: bytes) -> None:
    parsed = PARSER.parse_response(raw, GRPC, streaming=False, end_of_stream=True)
    assert parsed.usage is None


def test_skipped_compressed_message_does_not_hide_the_next_one() -> None:
    raw = b"\x01" + body(b"x" * 100)[1:] + body(JSON_ANSWER)
    state = PARSER.new_response_state(GRPC)
    found = [state.feed(raw[i : i + 3], False).usage for i in range(0, len(raw), 3)]
    assert [u for u in found if u is not None] == [] and state.feed(b"", True).usage == USAGE

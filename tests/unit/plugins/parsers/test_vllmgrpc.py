from __future__ import annotations

import pytest

from epp._proto import epp_vllmgrpc_v1_pb2 as vllm
from epp.plugin import APP_PROTOCOL_H2C, ErrorCode, InferenceError, Parser, Usage
from epp.plugin.testing import check_parser
from epp.plugins.parsers.grpcwire import frame
from epp.plugins.parsers.vllmgrpc import VllmGrpcParser

PARSER = VllmGrpcParser(name=VllmGrpcParser.TYPE, params=VllmGrpcParser.Params(), handle=None)
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED = "/vllm.grpc.engine.VllmEngine/Embed"
GRPC = {"content-type": "application/grpc"}


def generate(**fields: object) -> bytes:
    return frame(vllm.GenerateRequest(request_id="r1", **fields).SerializeToString())  # type: ignore[arg-type]


def tokenized(*ids: int) -> vllm.TokenizedInput:
    return vllm.TokenizedInput(original_text="", input_ids=list(ids))


def test_parser_satisfies_contract_when_built_without_handle() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "vllmgrpc-parser"
    assert PARSER.supports_model_rewrite is False
    assert PARSER.claims() == (
        "vllm.grpc.engine.VllmEngine/Generate",
        "vllm.grpc.engine.VllmEngine/Embed",
    )
    assert PARSER.app_protocols() == (APP_PROTOCOL_H2C,)
    check_parser(PARSER, GENERATE, generate(text="hello"), b"\x01\x00\x00\x00\x00", GRPC)


def test_generate_with_token_ids() -> None:
    raw = generate(
        tokenized=tokenized(1, 2, 4294967295),
        sampling_params=vllm.SamplingParams(max_tokens=16, temperature=0.5),
        stream=True,
    )
    result = PARSER.parse_request(GENERATE, raw, GRPC)
    b = result.body
    assert (result.model, b.kind, b.token_ids, b.stream) == (
        "",
        "completions",
        (1, 2, 4294967295),
        True,
    )
    assert (b.max_output_tokens, b.payload, b.cache_salt) == (
        16,
        {"prompt": [1, 2, 4294967295]},
        "",
    )
    assert b.raw is raw
    assert result.skip_response_processing is False
    assert PARSER.rewrite_model(b, "other") is raw


def test_generate_with_text_and_no_cap() -> None:
    result = PARSER.parse_request(GENERATE, generate(text="The capital of France is"), GRPC)
    b = result.body
    assert (b.kind, b.token_ids, b.stream, b.max_output_tokens) == (
        "completions",
        None,
        False,
        None,
    )
    assert b.payload == {"prompt": "The capital of France is"}


def test_generate_max_tokens_zero_is_a_cap() -> None:
    raw = generate(text="x", sampling_params=vllm.SamplingParams(max_tokens=0))
    assert PARSER.parse_request(GENERATE, raw, GRPC).body.max_output_tokens == 0


def test_embed_with_token_ids() -> None:
    raw = frame(vllm.EmbedRequest(request_id="e", tokenized=tokenized(5, 6)).SerializeToString())
    b = PARSER.parse_request(EMBED + "?q=1", raw, GRPC).body
    assert (b.kind, b.token_ids, b.payload) == ("embeddings", (5, 6), {"input": [5, 6]})


@pytest.mark.parametrize(
    "path",
    [
        "/vllm.grpc.engine.VllmEngine/HealthCheck",
        "/vllm.grpc.engine.VllmEngine/GetModelInfo",
        "/vllm.grpc.engine.VllmEngine/Abort",
    ],
)
def test_other_methods_are_forwarded_raw_without_response_processing(path: str) -> None:
    result = PARSER.parse_request(path, b"\x00\x00\x00\x00\x00", GRPC)
    assert (result.model, result.body.kind, result.body.payload) == ("", "raw", None)
    assert result.skip_response_processing is True


@pytest.mark.parametrize(
    ("path", "raw", "message"),
    [
        pytest.param(
            GENERATE,
            b"",
            "invalid vLLM GenerateRequest: invalid gRPC frame: expected at least 5 bytes, got 0",
            id="empty",
        ),
        pytest.param(
            GENERATE,
            b"\x01" + generate(text="x")[1:],
            "invalid vLLM GenerateRequest: compressed gRPC messages are not supported",
            id="compressed",
        ),
        pytest.param(
            GENERATE,
            generate(text="hello")[:-2],
            "invalid vLLM GenerateRequest: incomplete gRPC message: its header says 11 bytes, "
            "9 arrived",
            id="truncated",
        ),
        pytest.param(
            GENERATE,
            generate(text="x") + generate(text="y"),
            "invalid vLLM GenerateRequest: 12 bytes after the gRPC message",
            id="two-messages",
        ),
        pytest.param(
            GENERATE,
            frame(b"\x1a\x10abc"),
            "invalid vLLM GenerateRequest: malformed GenerateRequest: not a valid protobuf message",
            id="bad-protobuf",
        ),
        pytest.param(
            GENERATE,
            generate(),
            "invalid vLLM GenerateRequest: must have a tokenized or text input",
            id="no-input",
        ),
        pytest.param(
            GENERATE,
            generate(tokenized=tokenized()),
            "invalid vLLM GenerateRequest: tokenized.input_ids is empty",
            id="empty-ids",
        ),
        pytest.param(
            GENERATE, generate(text=""), "invalid vLLM GenerateRequest: text is empty", id="no-text"
        ),
        pytest.param(
            EMBED,
            frame(vllm.EmbedRequest(request_id="e").SerializeToString()),
            "invalid vLLM EmbedRequest: must have a tokenized input",
            id="embed-no-input",
        ),
        pytest.param(
            EMBED,
            frame(vllm.EmbedRequest(tokenized=tokenized()).SerializeToString()),
            "invalid vLLM EmbedRequest: tokenized.input_ids is empty",
            id="embed-empty-ids",
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


def chunk(prompt: int, completion: int, cached: int = 0) -> bytes:
    c = vllm.GenerateStreamChunk(
        token_ids=[9], prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached
    )
    return frame(vllm.GenerateResponse(chunk=c).SerializeToString())


def complete(prompt: int, completion: int, cached: int = 0) -> bytes:
    done = vllm.GenerateComplete(
        output_ids=[9, 9],
        finish_reason="length",
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
    )
    return frame(vllm.GenerateResponse(complete=done).SerializeToString())


def embedded(prompt: int, values: list[float]) -> bytes:
    msg = vllm.EmbedResponse(embedding=values, prompt_tokens=prompt, embedding_dim=len(values))
    return frame(msg.SerializeToString())


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            complete(5, 2, 3),
            Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=3, total_tokens=7),
            id="complete",
        ),
        pytest.param(
            chunk(5, 1) + chunk(5, 2, 4) + complete(5, 3, 4),
            Usage(prompt_tokens=5, completion_tokens=3, cached_tokens=4, total_tokens=8),
            id="stream-last-wins",
        ),
        pytest.param(chunk(0, 0), None, id="chunk-without-counts"),
        pytest.param(
            embedded(6, [0.25, -1.5, 3.0]),
            Usage(prompt_tokens=6, total_tokens=6),
            id="embed",
        ),
        pytest.param(
            embedded(4, []), Usage(prompt_tokens=4, total_tokens=4), id="embed-empty-vector"
        ),
        pytest.param(b"", None, id="empty"),
        pytest.param(frame(b"\xff\xff"), None, id="garbage"),
        pytest.param(b"\x01" + complete(5, 2)[1:], None, id="compressed-skipped"),
    ],
)
def test_parse_response_reads_generate_and_embed_counts(raw: bytes, expected: Usage | None) -> None:
    parsed = PARSER.parse_response(raw, GRPC, streaming=False, end_of_stream=True)
    assert parsed.usage == expected


def test_streamed_messages_split_across_chunks() -> None:
    raw = chunk(7, 1) + chunk(7, 2) + complete(7, 3, 2)
    state = PARSER.new_response_state(GRPC)
    found = Usage()
    for i in range(0, len(raw), 4):
        parsed = state.feed(raw[i : i + 4], i + 4 >= len(raw))
        if parsed.usage is not None:
            found.merge(parsed.usage)
    assert found == Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=2, total_tokens=10)

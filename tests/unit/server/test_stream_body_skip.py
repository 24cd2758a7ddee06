"""``RequestStream`` when the Director reads no response body: where the response body mode may be
overridden the response-headers reply asks Envoy (``mode_override``) for none, and the stream's
end completes the request; in FULL_DUPLEX_STREAMED, or without ``protocol_config``, no override
is sent and the chunks are answered as they come."""

from __future__ import annotations

import pytest

from epp.plugin import TerminationCause
from epp.requestcontrol.exchange import Forward
from epp.server.stream import RequestStream
from tests.unit.server.test_stream import (
    MODE,
    Director,
    body,
    headers,
    new_stream,
    pb,
    response_body,
    response_headers,
    send,
    set_of,
)


def with_modes(request_mode: int, response_mode: int) -> pb.ProcessingRequest:
    msg = headers()
    msg.protocol_config.request_body_mode = request_mode
    msg.protocol_config.response_body_mode = response_mode
    return msg


async def answered(request_mode: int, response_mode: int) -> tuple[RequestStream, Director]:
    stream, director = new_stream()
    director.skip_body = True
    await send(stream, with_modes(request_mode, response_mode))
    await send(stream, body(b"{}"))
    return stream, director


@pytest.mark.parametrize("response_mode", [MODE.STREAMED, MODE.BUFFERED, MODE.BUFFERED_PARTIAL])
@pytest.mark.parametrize("request_mode", [MODE.BUFFERED, MODE.STREAMED])
async def test_a_body_nobody_needs_is_switched_off_in_the_response_headers_reply(
    request_mode: int, response_mode: int
) -> None:
    stream, director = await answered(request_mode, response_mode)
    (reply,) = await send(stream, response_headers())
    assert set_of(reply.response_headers.response.header_mutation) == {"x-resp": "r"}
    override = reply.mode_override
    assert reply.HasField("mode_override")
    assert (override.request_body_mode, override.response_body_mode) == (request_mode, MODE.NONE)
    # header and trailer modes DEFAULT: Envoy keeps the configured ones
    assert override.request_header_mode == override.response_header_mode == 0
    assert override.request_trailer_mode == override.response_trailer_mode == 0
    stream.close(error=False)  # Envoy ends the stream when the response has ended
    assert director.calls[-1] == ("complete", TerminationCause.NATURAL)


async def test_the_common_reply_is_the_same_message_serialized_once() -> None:
    raws = []
    for _ in range(2):
        stream, director = await answered(MODE.BUFFERED, MODE.STREAMED)
        director.response_set_headers = {"x-went-into-resp-headers": "true"}
        (raw,) = await stream.on_message(response_headers())
        raws.append(raw)
    assert isinstance(raws[0], bytes) and raws[1] is raws[0]
    reply = pb.ProcessingResponse.FromString(raws[0])
    assert reply.mode_override.request_body_mode == MODE.BUFFERED
    assert set_of(reply.response_headers.response.header_mutation) == {
        "x-went-into-resp-headers": "true"
    }


async def test_no_override_in_full_duplex_where_envoy_ignores_it() -> None:
    stream, director = new_stream()
    director.skip_body = True
    await send(stream, headers(mode=MODE.FULL_DUPLEX_STREAMED))
    await send(stream, body(b"{}"))
    (reply,) = await send(stream, response_headers())
    assert not reply.HasField("mode_override")
    (chunk,) = await send(stream, response_body(b"tok", eos=False))  # every chunk still comes
    assert chunk.response_body.response.body_mutation.streamed_response.body == b"out"
    assert director.copy_held == [False]
    stream.close(error=False)  # a client gone before the end
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


async def test_no_override_without_protocol_config_nor_for_a_response_without_body() -> None:
    stream, director = new_stream()  # no protocol_config: the modes are unknown
    director.skip_body = True
    await send(stream, headers())
    await send(stream, body(b"{}"))
    (reply,) = await send(stream, response_headers())
    assert not reply.HasField("mode_override")
    stream, director = await answered(MODE.BUFFERED, MODE.STREAMED)
    (reply,) = await send(stream, response_headers(eos=True))
    assert not reply.HasField("mode_override")
    assert director.calls[-1] == ("complete", TerminationCause.NATURAL)


async def test_chunks_that_come_anyway_are_answered_and_end_like_any_response() -> None:
    # an Envoy that refused the override (no allow_mode_override, or an allow-list without it)
    stream, director = await answered(MODE.BUFFERED, MODE.STREAMED)
    await send(stream, response_headers())
    director.forward = Forward(b"tok", whole=False, changed=False)
    (reply,) = await send(stream, response_body(b"tok", eos=False))
    assert reply == pb.ProcessingResponse(response_body=pb.BodyResponse(response={}))
    assert director.copy_held == [True]  # STREAMED: Envoy forwards each chunk once answered
    stream.close(error=False)  # and the client left before the end
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


async def test_a_stream_error_after_the_override_is_an_error() -> None:
    stream, director = await answered(MODE.BUFFERED, MODE.STREAMED)
    await send(stream, response_headers())
    stream.close(error=True)
    assert director.calls[-1] == ("complete", TerminationCause.ERROR)


async def test_a_read_body_gets_no_override() -> None:
    stream, director = await answered(MODE.BUFFERED, MODE.STREAMED)
    director.skip_body = False
    (reply,) = await send(stream, response_headers())
    assert not reply.HasField("mode_override")

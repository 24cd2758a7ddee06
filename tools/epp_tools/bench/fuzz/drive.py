"""Drive one fuzz ``Case`` over a real ext_proc stream and judge how the EPP answered.

The driver behaves like Envoy: it sends a message, and when Envoy would wait for the answer to
it, waits (up to ``Timeouts.reply``) for a reply of the matching kind (or an ImmediateResponse,
or the end of the stream) before it sends the next one. What Envoy waits for, given the body
modes of the stream's first message (``protocol_config``; FULL_DUPLEX_STREAMED without it):

* request headers: in FULL_DUPLEX_STREAMED only with ``end_of_stream``, else always;
* request/response body: in FULL_DUPLEX_STREAMED the chunk with ``end_of_stream`` (answered by
  the streamed piece that carries ``end_of_stream``), in the other modes every chunk;
* request/response trailers and response headers: always;
* a message with no ``request`` field, or bytes that do not decode: any reply or a gRPC error.

At the end the driver half-closes (or cancels, when the case says so) and waits up to
``Timeouts.end`` for the stream to end. Verdicts, first match wins:

* ``crash``: the stream ended with UNKNOWN or INTERNAL (an exception escaped the servicer), or
  an ImmediateResponse 500 for an unexpected error;
* ``hung``: the stream did not end after the half-close, or a write blocked;
* ``silent``: no answer where Envoy would wait, or the stream ended OK without answering (unless
  the request skips response processing, where the EPP closes after routing);
* ``leak``: a request-headers or body reply let a client-sent ``wire.OWNED_REQUEST_HEADERS``
  header through (neither removed nor replaced by the EPP), or set one the EPP does not own;
* ``bad_route``: a destination (header or ``envoy.lb`` metadata) that is not a pool endpoint;
* ``rejected_legal``: a conforming sequence ended in a gRPC error;
* ``ok``: anything else. A gRPC error must carry details.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import grpc

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import wire
from epp.server import extproc_rpc
from epp_tools.bench.fuzz.gen import CANCEL, DUPLEX, HALF_CLOSE, Case, Step

VERDICTS: Final = ("ok", "crash", "hung", "silent", "leak", "bad_route", "rejected_legal")
ANY: Final = "any"
_CLIENT_RACE: Final = "Internal error from Core"
_UNEXPECTED: Final = b"Internal - unexpected error"  # the EPP's answer to an exception it caught
_CLEAN_ERRORS: Final = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


@dataclass(frozen=True, slots=True)
class Timeouts:
    reply: float = 2.0
    end: float = 5.0


@dataclass(slots=True)
class Result:
    verdict: str
    detail: str = ""
    status: str = ""
    replies: list[pb.ProcessingResponse] = field(default_factory=list)

    @property
    def kinds(self) -> list[str]:
        return [r.WhichOneof("response") or "?" for r in self.replies]


def _identity(data: bytes) -> bytes:
    return data


def parse(data: bytes) -> pb.ProcessingRequest | None:
    msg = pb.ProcessingRequest()
    try:
        msg.ParseFromString(data)
    except Exception:
        return None
    return msg


def demand(msg: pb.ProcessingRequest | None, req_mode: int, resp_mode: int) -> str | None:
    """The reply kind Envoy would wait for after sending ``msg`` (None: it would not wait)."""
    if msg is None:
        return ANY
    kind: str | None = msg.WhichOneof("request")
    if kind is None:
        return ANY
    if kind == "request_headers":
        eos = msg.request_headers.end_of_stream
        return "request_headers" if eos or req_mode != DUPLEX else None
    if kind in ("request_body", "response_body"):
        mode = req_mode if kind == "request_body" else resp_mode
        if mode != DUPLEX:
            return kind
        return kind if bool(getattr(msg, kind).end_of_stream) else None
    return kind


def answers(reply: pb.ProcessingResponse, want: str) -> bool:
    kind = reply.WhichOneof("response")
    if want == ANY or kind == "immediate_response":
        return True
    if kind != want:
        return False
    if kind in ("request_body", "response_body"):
        mutation = getattr(reply, kind).response.body_mutation
        if mutation.HasField("streamed_response"):
            return bool(mutation.streamed_response.end_of_stream)
    return True


class _Stream:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        method = channel.stream_stream(
            extproc_rpc.METHOD,
            request_serializer=_identity,
            response_deserializer=pb.ProcessingResponse.FromString,
        )
        self.call = method()
        self.replies: list[pb.ProcessingResponse] = []
        self.ended = asyncio.Event()
        self.write_failed = False
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    break
                self.replies.append(reply)
                self._changed.set()
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            self.ended.set()
            self._changed.set()

    async def until(self, done: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if done():
                return True
            self._changed.clear()
            if done() or self.ended.is_set():
                return done()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def immediate(self) -> bool:
        return any(r.WhichOneof("response") == "immediate_response" for r in self.replies)

    async def status(self) -> tuple[grpc.StatusCode | None, str]:
        if not self.ended.is_set():
            return None, ""
        with contextlib.suppress(Exception):
            return await self.call.code(), (await self.call.details()) or ""
        return None, ""

    async def close(self) -> None:
        self.call.cancel()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


async def drive(
    channel: grpc.aio.Channel, case: Case, pool: Sequence[str], timeouts: Timeouts
) -> Result:
    stream = _Stream(channel)
    try:
        early = await _send_all(stream, case, timeouts)
        if early is not None:
            return _with_kinds(early, stream)
        return _with_kinds(await _judge(stream, case, pool), stream)
    finally:
        await stream.close()


def _with_kinds(result: Result, stream: _Stream) -> Result:
    result.replies = list(stream.replies)
    return result


async def _send_all(stream: _Stream, case: Case, timeouts: Timeouts) -> Result | None:
    """Send the case's steps; a Result when it is decided before the end (silent, hung)."""
    req_mode = resp_mode = DUPLEX
    first = True
    for step in case.steps:
        if step.action == CANCEL:
            stream.call.cancel()
            if not await stream.until(stream.ended.is_set, timeouts.end):
                return Result("hung", "the stream did not end after a cancel")
            return None
        if step.action == HALF_CLOSE or stream.ended.is_set() or stream.immediate():
            break
        msg = parse(step.data)
        if first and msg is not None and msg.HasField("protocol_config"):
            req_mode = msg.protocol_config.request_body_mode
            resp_mode = msg.protocol_config.response_body_mode
        first = False
        want = demand(msg, req_mode, resp_mode)
        start = len(stream.replies)
        try:
            await asyncio.wait_for(stream.call.write(step.data), timeouts.reply)
        except TimeoutError:
            return Result("hung", f"writing {step.note} blocked for {timeouts.reply}s")
        except Exception:
            stream.write_failed = True
            break  # the stream already ended; Envoy would stop sending too
        if want is None:
            continue
        outcome = await _await_answer(stream, case, step, want, start, timeouts)
        if outcome is not None:
            return outcome if isinstance(outcome, Result) else None
    return None


async def _await_answer(
    stream: _Stream, case: Case, step: Step, want: str, start: int, timeouts: Timeouts
) -> Result | bool | None:
    """None: answered, go on; False: the stream ended cleanly, stop sending; a Result: silent."""

    def answered() -> bool:
        return any(answers(r, want) for r in stream.replies[start:])

    if await stream.until(answered, timeouts.reply):
        if case.may_close and "request" in step.note:
            # The EPP closes the stream after routing such a request; Envoy reads the close
            # before its response phase would start.
            await stream.until(stream.ended.is_set, 0.5)
        return None
    if not stream.ended.is_set():
        return Result("silent", f"no {want} reply to {step.note} in {timeouts.reply}s")
    code, _ = await stream.status()
    if code == grpc.StatusCode.OK and not (stream.immediate() or case.may_close):
        return Result("silent", f"stream ended OK without answering {step.note}")
    return False


async def _judge(stream: _Stream, case: Case, pool: Sequence[str]) -> Result:
    with contextlib.suppress(Exception):
        await stream.call.done_writing()
    if not await stream.until(stream.ended.is_set, 5.0):
        return Result("hung", "the stream did not end after the half-close")
    code, details = await stream.status()
    status = code.name if code is not None else ""
    if stream.write_failed and code == grpc.StatusCode.INTERNAL and details == _CLIENT_RACE:
        # Our write raced the server's end of the stream: grpc's client replaces the server's
        # status with its own. An exception in the EPP would still show in its ERROR log.
        code, status = None, "ENDED_BY_SERVER"
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return Result("crash", details[:300], status)
    for reply in stream.replies:
        body = reply.immediate_response.body
        if reply.WhichOneof("response") == "immediate_response" and _UNEXPECTED in body:
            return Result("crash", body.decode(errors="replace")[:300], status)
    problem = check_replies(stream.replies, case.spoofed, pool)
    if problem is not None:
        return Result(problem[0], problem[1], status)
    if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED, None):
        if code not in _CLEAN_ERRORS or not details:
            return Result("crash", f"unclean gRPC error {status}: {details[:200]}", status)
        if case.legal:
            return Result("rejected_legal", f"{status}: {details[:200]}", status)
    return Result("ok", "", status)


def _destinations_ok(value: str, pool: Sequence[str]) -> bool:
    return all(part in pool for part in value.split(","))


def check_replies(
    replies: Sequence[pb.ProcessingResponse], spoofed: dict[str, str], pool: Sequence[str]
) -> tuple[str, str] | None:
    """``(verdict, detail)`` for the first reply that leaks a control header or routes outside
    the pool."""
    for reply in replies:
        lb = reply.dynamic_metadata.fields.get(wire.LB_NAMESPACE)
        if lb is not None:
            dest = lb.struct_value.fields.get(wire.DESTINATION_HEADER)
            if dest is not None and not _destinations_ok(dest.string_value, pool):
                return "bad_route", f"envoy.lb destination {dest.string_value!r}"
        kind = reply.WhichOneof("response")
        if kind not in ("request_headers", "request_body"):
            continue
        common = getattr(reply, kind).response
        if kind == "request_body" and not common.HasField("header_mutation"):
            continue  # a body reply that changes no header (the headers reply did the work)
        mutation = common.header_mutation
        sets = {
            h.header.key.lower(): h.header.raw_value.decode(errors="replace")
            for h in mutation.set_headers
        }
        removed = {name.lower() for name in mutation.remove_headers}
        for name in wire.OWNED_REQUEST_HEADERS:
            if name not in sets:
                continue
            if name != wire.DESTINATION_HEADER:
                return "leak", f"{kind} reply sets {name}={sets[name]!r}"
            if not _destinations_ok(sets[name], pool):
                return "bad_route", f"destination header {sets[name]!r}"
        for name in spoofed:
            if name not in sets and name not in removed:
                return "leak", f"{kind} reply lets the client's {name} through"
    return None

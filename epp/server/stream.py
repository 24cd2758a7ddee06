"""One ext_proc stream = one HTTP request: protocol messages in, Director calls, replies out.

FULL_DUPLEX_STREAMED (the upstream contract): request headers get no reply; body chunks are
buffered (bounded) until end of stream or trailers; then the EPP sends the request-headers reply
(destination header + ``envoy.lb`` metadata, ``clear_route_cache``) followed by the body in pieces
of at most 62,000 bytes. Other request body modes: the headers are answered at once (the reply
removes every ``wire.OWNED_REQUEST_HEADERS`` header the client sent); BUFFERED (and
BUFFERED_PARTIAL) decide on the body message, whether or not trailers follow, and the decision
rides on the body reply; STREAMED (and GRPC) answer every chunk at once and decide at the end of
the body (the decision on the last body reply, or as ``envoy.lb`` metadata on the trailers
reply). Request trailers are always answered. Response chunks go through the Director, which
passes streamed (SSE) responses on at once and holds the others until their end (up to the body
limit in FULL_DUPLEX_STREAMED); outside FULL_DUPLEX_STREAMED every response chunk is answered
with a plain body reply (``streamed_response`` is a FULL_DUPLEX_STREAMED-only mutation); in
STREAMED, where Envoy forwards each chunk once answered, a non-streamed response is only copied.
``protocol_config`` is read from the first message (on a later one it is misuse, below).

A response body nobody needs (``epp.requestcontrol.bodyneed``): in the response body modes Envoy
lets a reply override (STREAMED, BUFFERED, BUFFERED_PARTIAL) the response-headers reply carries
``mode_override {request_body_mode: <from protocol_config>, response_body_mode: NONE}``; Envoy
1.40 then sends no body message and ends the ext_proc stream with the HTTP stream, which completes
the request as ``NATURAL`` (a client leaving during that body too). FULL_DUPLEX_STREAMED ignores
``mode_override`` (none is sent); there, and where Envoy refuses it, each chunk goes back unread
and its end of stream completes the request. No ``protocol_config`` (Envoy < 1.34): no override.

Protocol misuse. Envoy sends one stream per HTTP request, in the order request headers → body →
trailers, then response headers → body → trailers. A message outside that order never comes from
a conforming data plane, and Envoy would wait for an answer to it until its message timeout
(``message_timeout`` does not even fire in FULL_DUPLEX_STREAMED). Such a message ends the stream
at once with gRPC status ``INVALID_ARGUMENT``, the details naming the case; it is counted in
``llm_d_epp_extproc_protocol_errors_total{reason}`` and logged (rate-limited, see
``epp.server.misuse``, which tables the cases and says why this is no ImmediateResponse).

Everything a request means (routing, usage, hooks, completion, metrics) is the Director's
(``epp.requestcontrol.director``); this module only maps messages to its calls and back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any, Final

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.flowcontrol.eviction import EVICTION_ATTRIBUTE, Eviction
from epp.plugin import ErrorCode, InferenceError, InferenceRequest, TerminationCause, wire
from epp.requestcontrol.director import Decision, Exchange
from epp.server import messages
from epp.server import misuse as m
from epp.server.context import ServerContext
from epp.server.misuse import ProtocolError

log = logging.getLogger(__name__)

_MODE = pb.ProcessingMode
_FULL_DUPLEX = _MODE.FULL_DUPLEX_STREAMED
_PER_CHUNK = (_MODE.STREAMED, _MODE.GRPC)  # every body chunk is answered
_OVERRIDABLE = (_MODE.STREAMED, _MODE.BUFFERED, _MODE.BUFFERED_PARTIAL)
"""Response body modes Envoy lets a response-headers reply override (FULL_DUPLEX_STREAMED not)."""
Replies = list[messages.Reply]


class RequestStream:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.director = ctx.director
        self.request_mode = _FULL_DUPLEX
        self.response_mode = _FULL_DUPLEX
        self.exchange: Exchange | None = None
        self.generated_id = False
        self.metadata: dict[str, Any] = {}
        # the request body's chunks, joined once when it routes (a one-chunk body: not copied)
        self.body: list[bytes] = []
        self.body_size = 0
        self.done = False
        self.first = True
        self.request_ended = False  # EOS seen on request headers or body, or request trailers
        self.answered = False  # the request headers got their reply (or the decision went out)
        self.response_headers = False
        self.response_body = False
        self.response_ended = False
        self.was_evicted = False
        self.skip_asked = False  # the response-headers reply told Envoy not to send the body
        self.response_metadata: dict[str, dict[str, Any]] = {}  # dynamic metadata sent so far
        # clock readings of the first and last response message; time spent handling them
        self.response_started = self.response_finished = self.response_busy = 0.0

    # ---- dispatch ---------------------------------------------------------------------------

    async def on_message(self, msg: pb.ProcessingRequest) -> Replies:
        out = self.dispatch(msg)
        return out if isinstance(out, list) else await out

    def dispatch(self, msg: pb.ProcessingRequest) -> Replies | Coroutine[Any, Any, Replies]:
        """The replies to ``msg``, or for a message that may route (request body and trailers) a
        coroutine returning them (and for a header-only request that comes before the first
        discovery sync): every other message is answered without a task switch."""
        if self.first:
            self.first = False
            if msg.HasField("protocol_config"):
                self.request_mode = msg.protocol_config.request_body_mode
                self.response_mode = msg.protocol_config.response_body_mode
        elif msg.HasField("protocol_config"):  # Envoy sends it on the first message only
            raise ProtocolError(m.PROTOCOL_CONFIG_NOT_FIRST, "protocol_config on a later message")
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            return self._on_request_headers(msg)
        if kind == "request_body":
            return self._on_request_body(msg)
        if kind == "request_trailers":
            return self._on_request_trailers()
        if kind in _RESPONSE_KINDS:
            return self._on_response(kind, msg)
        raise ProtocolError(
            m.NO_REQUEST,
            "ProcessingRequest sets none of request_headers, request_body, request_trailers, "
            "response_headers, response_body, response_trailers",
        )

    def _on_response(self, kind: str, msg: pb.ProcessingRequest) -> Replies:
        """A response message, timed for ``response_processing_duration_seconds``."""
        if kind == "response_body":
            chunk = msg.response_body
            return self.response_chunk(chunk.body, chunk.end_of_stream)
        t0 = time.perf_counter()
        self.response_started = self.response_started or time.monotonic()
        try:
            if kind == "response_headers":
                return self._on_response_headers(msg)
            return self._on_response_trailers()
        finally:
            self._response_timed(t0)

    def response_chunk(self, body: bytes, eos: bool) -> Replies:
        """A ``response_body`` message that is not the stream's first, as ``dispatch`` handles
        it; the server calls this directly with what ``messages.response_chunk`` decoded. Timed
        for ``response_processing_duration_seconds`` like the other response messages, inline:
        this is one call per streamed token."""
        t0 = time.perf_counter()
        if not self.response_started:
            self.response_started = time.monotonic()
        try:
            ex = self.exchange
            if ex is None or not self.answered or self.response_ended:
                ex = self._response_exchange()  # raises, naming the case
            self.response_body = True
            self.response_ended = eos
            replies: Replies
            if self.response_mode == _FULL_DUPLEX:
                limit = self.ctx.max_body_bytes
                forward = self.director.on_response_chunk(ex, body, eos, limit)
                if forward is None:  # held until the end of the response
                    return []
                replies = messages.streamed_body(forward.body, response=True, end_of_stream=eos)
            else:  # Envoy takes ``streamed_response`` only in FULL_DUPLEX_STREAMED
                per_chunk = self.response_mode in _PER_CHUNK
                forward = self.director.on_response_chunk(ex, body, eos, None, per_chunk)
                changed = forward.body if forward is not None and forward.changed else None
                replies = [messages.buffered_response_body_reply(changed)]
            info = ex.response
            if info is not None and info.dynamic_metadata:
                self._attach_metadata(ex, replies)
            return replies
        finally:
            self.response_busy += time.perf_counter() - t0
            if eos and not self.response_finished:
                self.response_finished = time.monotonic()

    def _response_timed(self, t0: float) -> None:
        self.response_busy += time.perf_counter() - t0
        if self.response_ended and not self.response_finished:
            self.response_finished = time.monotonic()

    # ---- request phase ----------------------------------------------------------------------

    def _on_request_headers(
        self, msg: pb.ProcessingRequest
    ) -> Replies | Coroutine[Any, Any, Replies]:
        if self.exchange is not None:
            raise ProtocolError(
                m.REQUEST_HEADERS_REPEATED,
                "request_headers a second time on one stream (one stream carries one request)",
            )
        headers = messages.header_map(msg.request_headers)
        self.generated_id = not headers.get(wire.REQUEST_ID_HEADER)
        self.exchange = self.director.begin(headers)
        if self.ctx.tracing is not None:
            self.exchange.trace = self.ctx.tracing.begin(headers, self.exchange.request.request_id)
        self.metadata = messages.metadata_namespaces(msg, (wire.SUBSET_NAMESPACE,))
        if msg.request_headers.end_of_stream:
            self.request_ended = True
            if self.director.discovering:
                return self._header_only_once_discovered(self.exchange.request)
            return self._header_only(self.exchange.request)
        if self.request_mode != _FULL_DUPLEX:
            # The headers go on now (NONE, STREAMED) or stay held (BUFFERED): either way a
            # client-sent control header must not go with them.
            self.answered = True
            removal = messages.request_headers_reply({}, wire.OWNED_REQUEST_HEADERS, None)
            return [removal]
        return []

    async def _header_only_once_discovered(self, request: InferenceRequest) -> Replies:
        await self.director.first_discovery()  # a restarted EPP: as a body's route waits
        return self._header_only(request)

    def _header_only(self, request: InferenceRequest) -> Replies:
        # The stream stays open: Envoy still sends the response phase (closing here races with
        # Envoy's FULL_DUPLEX response streaming and can drop the response body).
        try:
            endpoint = self.director.pick_random(self.metadata, request)
        except InferenceError as err:
            return [self._fail(err)]
        dest = endpoint.hostport
        self.answered = True
        return [
            messages.encoded_headers_reply(
                self._set_headers(dest, None),
                wire.OWNED_REQUEST_HEADERS,
                {wire.DESTINATION_HEADER: dest},
            )
        ]

    def _on_request_body(self, msg: pb.ProcessingRequest) -> Replies | Coroutine[Any, Any, Replies]:
        chunk = msg.request_body
        ex = self.exchange
        if ex is None:
            raise ProtocolError(m.BODY_BEFORE_HEADERS, "request_body before request_headers")
        if self.request_ended or ex.decision is not None:
            raise ProtocolError(m.BODY_AFTER_END, "request_body after the request body ended")
        data = chunk.body
        if self.body_size + len(data) > self.ctx.max_body_bytes:
            limit = self.ctx.max_body_bytes
            too_large = f"request body exceeds the {limit}-byte limit"
            return [self._fail(InferenceError(ErrorCode.PAYLOAD_TOO_LARGE, too_large))]
        if data:
            self.body.append(data)
            self.body_size += len(data)
        if msg.HasField("metadata_context"):
            self.metadata.update(messages.metadata_namespaces(msg, (wire.SUBSET_NAMESPACE,)))
        self.request_ended = chunk.end_of_stream
        if self.request_mode in _PER_CHUNK and not chunk.end_of_stream:
            return [messages.EMPTY_REQUEST_BODY]
        if chunk.end_of_stream or self.request_mode != _FULL_DUPLEX:
            return self._decide(ex, trailers=False)
        return []

    def _on_request_trailers(self) -> Replies | Coroutine[Any, Any, Replies]:
        # Upstream never answers request trailers, which stalls such requests until Envoy's
        # message timeout. Trailers end the body: decide now, then answer them.
        ex = self.exchange
        if ex is None:
            raise ProtocolError(
                m.TRAILERS_BEFORE_HEADERS, "request_trailers before request_headers"
            )
        if self.request_ended:
            raise ProtocolError(m.TRAILERS_AFTER_END, "request_trailers after the request ended")
        self.request_ended = True
        if ex.decision is not None:
            return [messages.EMPTY_REQUEST_TRAILERS]
        return self._decide(ex, trailers=True)

    async def _decide(self, ex: Exchange, *, trailers: bool) -> Replies:
        """The body is complete: route, and answer in the form the body mode needs."""
        try:
            return await self._route(ex, trailers=trailers)
        finally:
            if self.ctx.metrics is not None:  # request receipt until the body is handled
                self.ctx.metrics.request_processing.observe(time.monotonic() - ex.started)

    async def _route(self, ex: Exchange, *, trailers: bool) -> Replies:
        try:
            decision = await self.director.route(ex, b"".join(self.body), self.metadata)
        except InferenceError as err:
            if ex.trace is not None:
                ex.trace.routed(err)
            return [self._fail(err)]
        except Exception as exc:
            if ex.trace is not None:
                ex.trace.routed(exc)
            log.exception(
                "unexpected error while scheduling", extra={"request_id": ex.request.request_id}
            )
            unexpected = "unexpected error while scheduling the request; see the EPP log"
            return [self._fail(InferenceError(ErrorCode.INTERNAL, unexpected))]
        if ex.trace is not None:
            ex.trace.routed()
        self.body = []  # the decision holds the body to forward
        self.answered = True
        dest = decision.destination
        lb: dict[str, Any] = {wire.DESTINATION_HEADER: dest}
        if self.ctx.emit_scores:
            lb[wire.SCORES_KEY] = decision.scores_by_hostport()
        set_headers = self._set_headers(dest, decision.body)
        if decision.parsed.skip_response_processing:
            self.done = True
        replies = self._routed_replies(decision, set_headers, lb, trailers)
        self.director.sent(ex)  # the replies carry the body now; the request lets it go
        return replies

    def _routed_replies(
        self, decision: Decision, set_headers: dict[str, str], lb: dict[str, Any], trailers: bool
    ) -> Replies:
        """The replies that send a routed request on, in the form the body mode needs."""
        owned = wire.OWNED_REQUEST_HEADERS
        if self.request_mode == _FULL_DUPLEX:
            replies: Replies = [
                messages.encoded_headers_reply(set_headers, owned, lb),
                *messages.streamed_body(decision.body, response=False),
            ]
            return [*replies, messages.EMPTY_REQUEST_TRAILERS] if trailers else replies
        if trailers:  # the body replies already went out: the decision rides as metadata
            return [messages.trailers_reply(lb)]
        rewritten = decision.model_rewritten and self.request_mode not in _PER_CHUNK
        new_body = decision.body if rewritten else None
        return [messages.buffered_body_reply(set_headers, owned, lb, new_body)]

    def _set_headers(self, dest: str, body: bytes | None) -> dict[str, str]:
        out = dict(self.exchange.request.upstream_headers) if self.exchange is not None else {}
        out[wire.DESTINATION_HEADER] = dest
        if body:
            out["content-length"] = str(len(body))
        if self.generated_id and self.exchange is not None:
            out[wire.REQUEST_ID_HEADER] = self.exchange.request.request_id
        if self.exchange is not None and self.exchange.trace is not None:
            out.update(self.exchange.trace.headers())  # W3C traceparent to the model server
        return out

    def _fail(self, err: InferenceError) -> pb.ProcessingResponse:
        """Answer the request with ``err``; the stream ends after this reply."""
        self.done = True
        self.director.fail(self.exchange, err)
        self._trace_error(err.code.http_status, str(err))
        return messages.immediate(err)

    def _trace_error(self, status: int, text: str) -> None:
        trace = self.exchange.trace if self.exchange is not None else None
        if trace is not None:
            trace.error, trace.status = f"{status} {text}", status

    @property
    def eviction(self) -> Eviction | None:
        """The request's eviction signal while an eviction can still reach the client: routed
        by flow control as an evictable (sheddable) request, and the response not ended."""
        ex = self.exchange
        if ex is None or ex.decision is None or self.response_ended or self.done:
            return None
        signal = ex.request.attributes.get(EVICTION_ATTRIBUTE)
        return signal if isinstance(signal, Eviction) else None

    def abandoned_on_half_close(self) -> bool:
        """A half-close now means the client wants no answer, and routing may be waiting in a
        flow-control queue: stop waiting (see ``epp.server.extproc``)."""
        ex = self.exchange
        return (
            self.director.flow_controlled
            and ex is not None
            and ex.decision is None
            and self.request_ended
        )

    def evict(self, err: InferenceError) -> pb.ProcessingResponse:
        """Flow control evicted the request: upstream's 429 reply ends the stream, and completion
        (``TerminationCause.EVICTED``) frees its flow-control slot."""
        self.done = self.was_evicted = True
        self._trace_error(err.code.http_status, err.message)
        return messages.evicted(err)

    # ---- response phase ---------------------------------------------------------------------

    def _response_exchange(self) -> Exchange:
        if not self.answered or self.exchange is None:
            raise ProtocolError(
                m.RESPONSE_BEFORE_REQUEST, "a response message before the request was answered"
            )
        if self.response_ended:
            raise ProtocolError(m.RESPONSE_AFTER_END, "a response message after the response ended")
        return self.exchange

    def _on_response_headers(self, msg: pb.ProcessingRequest) -> Replies:
        ex = self._response_exchange()
        if self.response_headers or self.response_body:
            raise ProtocolError(
                m.RESPONSE_HEADERS_REPEATED,
                "response_headers a second time, or after response body",
            )
        self.response_headers = True
        served = messages.served_endpoint(msg)
        headers = messages.header_map(msg.response_headers)
        set_headers = self.director.on_response_headers(ex, headers, served)
        if msg.response_headers.end_of_stream:
            self.response_ended = True
            self.director.complete(ex, TerminationCause.NATURAL)
        elif ex.skip_body and self.response_mode in _OVERRIDABLE:
            self.skip_asked = True
            return [messages.response_headers_reply(set_headers, skip_body=self.request_mode)]
        return [messages.response_headers_reply(set_headers)]

    def _attach_metadata(self, ex: Exchange, replies: Replies) -> None:
        """Response hooks wrote dynamic metadata (e.g. ``request-attribute-reporter`` at the end
        of the response): the last reply carries what is new since it was last sent."""
        assert ex.response is not None
        current = {ns: dict(fields) for ns, fields in ex.response.dynamic_metadata.items()}
        if not replies or current == self.response_metadata:
            return
        self.response_metadata = current
        replies[-1] = messages.with_dynamic_metadata(replies[-1], current)

    def _on_response_trailers(self) -> Replies:
        ex = self._response_exchange()
        self.response_ended = True
        replies: Replies = []
        per_chunk = self.response_mode in _PER_CHUNK
        forward = self.director.on_response_trailers(ex, copy_held=per_chunk)
        if forward is not None:
            if self.response_mode == _FULL_DUPLEX:
                replies.extend(
                    messages.streamed_body(forward.body, response=True, end_of_stream=False)
                )
            else:
                body = forward.body if forward.changed else None
                replies.append(messages.buffered_response_body_reply(body))
        replies.append(messages.EMPTY_RESPONSE_TRAILERS)
        if ex.response is not None and ex.response.dynamic_metadata:
            self._attach_metadata(ex, replies)
        return replies

    def _record_response(self, ex: Exchange) -> None:
        """``response_processing_duration_seconds`` (upstream's): handling time of a streamed
        response's messages, else response headers to the response's end."""
        if self.ctx.metrics is None or not self.response_started:
            return
        streamed = ex.response is not None and ex.response.streaming
        end = self.response_finished or time.monotonic()
        seconds = self.response_busy if streamed else end - self.response_started
        self.ctx.metrics.response_processing.observe(seconds)

    def close(self, *, error: bool) -> None:
        """Stream ended (normally, by client disconnect or by error)."""
        if self.exchange is not None:
            cause = TerminationCause.ERROR if error else TerminationCause.CLIENT_DISCONNECT
            if self.skip_asked and not error and not self.response_body:
                cause = TerminationCause.NATURAL  # Envoy ends the stream when the response ends
            if self.was_evicted:
                cause = TerminationCause.EVICTED
            self.director.complete(self.exchange, cause)
            self._record_response(self.exchange)
            trace = self.exchange.trace
            if trace is not None:
                response = self.exchange.response
                trace.end(response.status if response is not None else trace.status)
                self.exchange.trace = None


_RESPONSE_KINDS: Final = frozenset({"response_headers", "response_body", "response_trailers"})

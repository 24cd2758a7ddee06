"""One ext_proc stream = one HTTP request: protocol messages in, Director calls, replies out.

FULL_DUPLEX_STREAMED (the upstream contract): request headers get no reply; body chunks are
buffered (bounded) until end of stream or trailers; then the EPP sends the request-headers reply
(destination header + ``envoy.lb`` metadata, ``clear_route_cache``) followed by the body in pieces
of at most 62,000 bytes. BUFFERED (and STREAMED) request bodies: the headers are answered at once
with an empty reply and the decision rides on the body reply. Request trailers are always
answered. Response chunks go through the Director, which passes streamed (SSE) responses on at
once and holds the others until their end (up to the body limit in FULL_DUPLEX_STREAMED).

Everything a request means (routing, usage, hooks, completion, metrics) is the Director's
(``epp.requestcontrol.director``); this module only maps messages to its calls and back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.plugin import ErrorCode, InferenceError, TerminationCause, wire
from epp.requestcontrol.director import Decision, Exchange
from epp.server import messages
from epp.server.context import ServerContext

log = logging.getLogger(__name__)

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
Replies = list[pb.ProcessingResponse]


class RequestStream:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.director = ctx.director
        self.request_mode = _FULL_DUPLEX
        self.response_mode = _FULL_DUPLEX
        self.exchange: Exchange | None = None
        self.generated_id = False
        self.metadata: dict[str, Any] = {}
        self.body = bytearray()
        self.done = False

    # ---- dispatch ---------------------------------------------------------------------------

    async def on_message(self, msg: pb.ProcessingRequest) -> Replies:
        if msg.HasField("protocol_config"):
            self.request_mode = msg.protocol_config.request_body_mode
            self.response_mode = msg.protocol_config.response_body_mode
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            return self._on_request_headers(msg)
        if kind == "request_body":
            return await self._on_request_body(msg)
        if kind == "request_trailers":
            return await self._on_request_trailers()
        if kind == "response_headers":
            return self._on_response_headers(msg)
        if kind == "response_body":
            return self._on_response_body(msg.response_body)
        if kind == "response_trailers":
            return self._on_response_trailers()
        log.warning("ignoring ext_proc message of unknown kind %r", kind)
        return []

    # ---- request phase ----------------------------------------------------------------------

    def _on_request_headers(self, msg: pb.ProcessingRequest) -> Replies:
        headers = messages.header_map(msg.request_headers)
        self.generated_id = not headers.get(wire.REQUEST_ID_HEADER)
        self.exchange = self.director.begin(headers)
        self.metadata = messages.metadata_namespaces(msg, (wire.SUBSET_NAMESPACE,))
        if msg.request_headers.end_of_stream:
            return self._header_only()
        if self.request_mode != _FULL_DUPLEX:
            return [messages.EMPTY_REQUEST_HEADERS]
        return []

    def _header_only(self) -> Replies:
        # The stream stays open: Envoy still sends the response phase (closing here races with
        # Envoy's FULL_DUPLEX response streaming and can drop the response body).
        try:
            endpoint = self.director.pick_random(self.metadata)
        except InferenceError as err:
            self.done = True
            return [self._fail(err)]
        dest = endpoint.hostport
        return [
            messages.request_headers_reply(
                self._set_headers(dest, None),
                wire.OWNED_REQUEST_HEADERS,
                {wire.DESTINATION_HEADER: dest},
            )
        ]

    async def _on_request_body(self, msg: pb.ProcessingRequest) -> Replies:
        chunk = msg.request_body
        ex = self.exchange
        if ex is None or ex.decision is not None:
            return []  # late chunks after a decision are not expected; nothing to answer
        if len(self.body) + len(chunk.body) > self.ctx.max_body_bytes:
            self.done = True
            return [
                self._fail(
                    InferenceError(
                        ErrorCode.PAYLOAD_TOO_LARGE,
                        f"request body exceeds the {self.ctx.max_body_bytes}-byte limit",
                    )
                )
            ]
        self.body += chunk.body
        if msg.HasField("metadata_context"):
            self.metadata.update(messages.metadata_namespaces(msg, (wire.SUBSET_NAMESPACE,)))
        if chunk.end_of_stream:
            return await self._decide(ex)
        return []

    async def _on_request_trailers(self) -> Replies:
        # Upstream never answers request trailers, which stalls such requests until Envoy's
        # message timeout. Trailers end the body: decide now, then answer them.
        replies: Replies = []
        ex = self.exchange
        if ex is not None and ex.decision is None and not self.done:
            replies = await self._decide(ex)
        if not self.done:
            replies.append(messages.EMPTY_REQUEST_TRAILERS)
        return replies

    async def _decide(self, ex: Exchange) -> Replies:
        try:
            decision = await self.director.route(ex, bytes(self.body), self.metadata)
        except InferenceError as err:
            self.done = True
            return [self._fail(err)]
        except Exception:
            log.exception("request %s: unexpected error while scheduling", ex.request.request_id)
            self.done = True
            return [
                self._fail(
                    InferenceError(
                        ErrorCode.INTERNAL,
                        "unexpected error while scheduling the request; see the EPP log",
                    )
                )
            ]
        self.body = bytearray()  # the decision holds the body to forward
        dest = decision.destination
        lb: dict[str, Any] = {wire.DESTINATION_HEADER: dest}
        if self.ctx.emit_scores:
            lb[wire.SCORES_KEY] = _scores(decision)
        set_headers = self._set_headers(dest, decision.body)
        if decision.parsed.skip_response_processing:
            self.done = True
        if self.request_mode == _FULL_DUPLEX:
            return [
                messages.request_headers_reply(set_headers, wire.OWNED_REQUEST_HEADERS, lb),
                *messages.streamed_body(decision.body, response=False),
            ]
        new_body = decision.body if decision.model_rewritten else None
        return [messages.buffered_body_reply(set_headers, wire.OWNED_REQUEST_HEADERS, lb, new_body)]

    def _set_headers(self, dest: str, body: bytes | None) -> dict[str, str]:
        out = dict(self.exchange.request.upstream_headers) if self.exchange is not None else {}
        out[wire.DESTINATION_HEADER] = dest
        if body:
            out["content-length"] = str(len(body))
        if self.generated_id and self.exchange is not None:
            out[wire.REQUEST_ID_HEADER] = self.exchange.request.request_id
        return out

    def _fail(self, err: InferenceError) -> pb.ProcessingResponse:
        self.director.fail(self.exchange, err)
        return messages.immediate(err)

    # ---- response phase ---------------------------------------------------------------------

    def _on_response_headers(self, msg: pb.ProcessingRequest) -> Replies:
        ex = self.exchange
        if ex is None:  # a response without a request: nothing to track, pass it on
            return [messages.response_headers_reply({wire.WENT_INTO_RESP_HEADERS: "true"})]
        lb = messages.metadata_namespaces(msg, (wire.LB_NAMESPACE,)).get(wire.LB_NAMESPACE, {})
        served = str(lb.get(wire.SERVED_HEADER, ""))
        headers = messages.header_map(msg.response_headers)
        set_headers = self.director.on_response_headers(ex, headers, served)
        if msg.response_headers.end_of_stream:
            self.director.complete(ex, TerminationCause.NATURAL)
        return [messages.response_headers_reply(set_headers)]

    def _on_response_body(self, chunk: pb.HttpBody) -> Replies:
        duplex = self.response_mode == _FULL_DUPLEX
        eos = chunk.end_of_stream
        ex = self.exchange
        if ex is None:
            return list(messages.streamed_body(chunk.body, response=True, end_of_stream=eos))
        limit = self.ctx.max_body_bytes if duplex else None
        forward = self.director.on_response_chunk(ex, chunk.body, eos, hold_limit=limit)
        if forward is None:  # held until the end of the response
            return [] if duplex else [messages.buffered_response_body_reply(None)]
        if forward.whole and not duplex:
            return [
                messages.buffered_response_body_reply(forward.body if forward.changed else None)
            ]
        return list(messages.streamed_body(forward.body, response=True, end_of_stream=eos))

    def _on_response_trailers(self) -> Replies:
        replies: Replies = []
        if self.exchange is not None:
            forward = self.director.on_response_trailers(self.exchange)
            if forward is not None:
                if self.response_mode == _FULL_DUPLEX:
                    replies.extend(
                        messages.streamed_body(forward.body, response=True, end_of_stream=False)
                    )
                else:
                    body = forward.body if forward.changed else None
                    replies.append(messages.buffered_response_body_reply(body))
        replies.append(messages.EMPTY_RESPONSE_TRAILERS)
        return replies

    def close(self, *, error: bool) -> None:
        """Stream ended (normally, by client disconnect or by error)."""
        if self.exchange is not None:
            cause = TerminationCause.ERROR if error else TerminationCause.CLIENT_DISCONNECT
            self.director.complete(self.exchange, cause)


def _scores(decision: Decision) -> dict[str, float]:
    by_id = {e.id: e for e in decision.candidates}
    scores: Mapping[str, float] = decision.result.primary.scores
    out = {}
    for eid, score in scores.items():
        ep = by_id.get(eid)
        out[ep.hostport if ep else eid] = score
    return out

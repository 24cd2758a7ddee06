"""One ext_proc stream = one HTTP request. A small state machine with one method per phase.

FULL_DUPLEX_STREAMED (the upstream contract): request headers get no reply; body chunks are
buffered (bounded) until end of stream or trailers; then the EPP sends the request-headers reply
(destination header + ``envoy.lb`` metadata, ``clear_route_cache``) followed by the body in pieces
of at most 62,000 bytes. BUFFERED (and STREAMED) request bodies: the headers are answered at once
with an empty reply and the decision rides on the body reply. Request trailers are always
answered. Responses are streamed through chunk by chunk when they are SSE and buffered otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.plugin import (
    ErrorCode,
    InferenceError,
    InferenceRequest,
    ResponseInfo,
    TerminationCause,
    wire,
)
from epp.requestcontrol.director import Decision
from epp.server import messages
from epp.server.context import ServerContext

log = logging.getLogger(__name__)

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_NONE = processing_mode_pb2.ProcessingMode.NONE
Replies = list[pb.ProcessingResponse]


@dataclass(slots=True)
class _Response:
    info: ResponseInfo
    state: Any = None  # the parser's incremental response state (streaming)
    buffer: bytearray | None = None
    first_byte_at: float = 0.0
    size: int = 0


class RequestStream:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.request_mode = _FULL_DUPLEX
        self.response_mode = _FULL_DUPLEX
        self.request: InferenceRequest | None = None
        self.generated_id = False
        self.metadata: dict[str, Any] = {}
        self.body = bytearray()
        self.decision: Decision | None = None
        self.response: _Response | None = None
        self.completed = False
        self.started = time.monotonic()
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
            return await self._on_request_trailers(msg)
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
        self.request = self.ctx.director.new_request(headers)
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
            endpoint = self.ctx.director.pick_random(self.metadata)
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
        if self.decision is not None or self.request is None:
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
            return await self._decide()
        return []

    async def _on_request_trailers(self, msg: pb.ProcessingRequest) -> Replies:
        # Upstream never answers request trailers, which stalls such requests until Envoy's
        # message timeout. Trailers end the body: decide now, then answer them.
        replies: Replies = []
        if self.decision is None and not self.done and self.request is not None:
            replies = await self._decide()
        if not self.done:
            replies.append(messages.EMPTY_REQUEST_TRAILERS)
        return replies

    async def _decide(self) -> Replies:
        assert self.request is not None
        ctx = self.ctx
        t0 = time.perf_counter()
        try:
            decision = await ctx.director.decide(self.request, bytes(self.body), self.metadata)
        except InferenceError as err:
            self.done = True
            return [self._fail(err)]
        except Exception:
            log.exception("request %s: unexpected error while scheduling", self.request.request_id)
            self.done = True
            return [
                self._fail(
                    InferenceError(
                        ErrorCode.INTERNAL,
                        "unexpected error while scheduling the request; see the EPP log",
                    )
                )
            ]
        self.decision = decision
        self.body = bytearray()  # the decision holds the body to forward
        ctx.stats.on_scheduled(decision)
        ctx.decisions.record(
            decision.request, decision.result, decision.candidates, time.perf_counter() - t0
        )
        dest = decision.destination
        lb: dict[str, Any] = {wire.DESTINATION_HEADER: dest}
        if ctx.emit_scores:
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
        out = {wire.DESTINATION_HEADER: dest}
        if body:
            out["content-length"] = str(len(body))
        if self.generated_id and self.request is not None:
            out[wire.REQUEST_ID_HEADER] = self.request.request_id
        return out

    def _fail(self, err: InferenceError) -> pb.ProcessingResponse:
        self.ctx.stats.on_error(self.request, err.code.label)
        self.ctx.decisions.record_error(
            self.request, err.code.http_status, err.body, err.drop_reason
        )
        if err.code.http_status >= 500:
            log.warning("request %s failed: %s", self.request and self.request.request_id, err)
        return messages.immediate(err)

    # ---- response phase ---------------------------------------------------------------------

    def _on_response_headers(self, msg: pb.ProcessingRequest) -> Replies:
        headers = messages.header_map(msg.response_headers)
        lb = messages.metadata_namespaces(msg, (wire.LB_NAMESPACE,)).get(wire.LB_NAMESPACE, {})
        status = headers.get(":status", "200")
        streaming = "text/event-stream" in headers.get("content-type", "") or bool(
            self.decision and self.decision.parsed.body.stream
        )
        info = ResponseInfo(
            request_id=self.request.request_id if self.request else "",
            headers=headers,
            served_endpoint=str(lb.get(wire.SERVED_HEADER, "")),
            streaming=streaming,
            status=int(status) if status.isdigit() else 0,
        )
        self.response = _Response(info=info)
        if streaming and self.decision is not None:
            self.response.state = self.decision.parser.new_response_state(headers)
        elif not streaming:
            self.response.buffer = bytearray()
        if not status.startswith("2"):
            self.ctx.stats.on_error(self.request, "ModelServerError")
        set_headers = {wire.WENT_INTO_RESP_HEADERS: "true"}
        if self.request is not None:
            for hook in self.ctx.pipeline.response_headers:
                try:
                    hook.response_headers(self.request, info, set_headers)
                except Exception:
                    log.exception("response-headers hook %s failed", hook.typed_name)
        if msg.response_headers.end_of_stream:
            self._complete(TerminationCause.NATURAL)
        return [messages.response_headers_reply(set_headers)]

    def _on_response_body(self, chunk: pb.HttpBody) -> Replies:
        resp = self.response
        if resp is None:  # response body without headers (response_header_mode SKIP)
            self.response = resp = _Response(
                info=ResponseInfo(
                    request_id=self.request.request_id if self.request else "", headers={}
                ),
                buffer=bytearray(),
            )
        if not resp.first_byte_at:
            resp.first_byte_at = time.monotonic()
            self.ctx.stats.on_first_byte(
                self.request, resp.first_byte_at - self.started, resp.info.streaming
            )
        data = chunk.body
        resp.size += len(data)
        eos = chunk.end_of_stream
        duplex = self.response_mode == _FULL_DUPLEX
        if resp.buffer is None or (
            duplex and len(resp.buffer) + len(data) > self.ctx.max_body_bytes
        ):
            # Streaming, or a buffered response that grew past the limit: pass it through.
            replies: Replies = []
            if resp.buffer:
                replies.extend(
                    messages.streamed_body(
                        self._restore(bytes(resp.buffer)), response=True, end_of_stream=False
                    )
                )
                resp.buffer = None
            if resp.state is not None:
                usage = resp.state.feed(data, eos).usage
                if usage is not None:
                    resp.info.usage.merge(usage)
            replies.extend(
                messages.streamed_body(self._restore(data), response=True, end_of_stream=eos)
            )
            if eos:
                self._complete(TerminationCause.NATURAL)
            return replies
        resp.buffer += data
        if not eos:
            return [] if duplex else [messages.buffered_response_body_reply(None)]
        return self._flush_buffered(end_of_stream=True)

    def _flush_buffered(self, *, end_of_stream: bool) -> Replies:
        resp = self.response
        assert resp is not None and resp.buffer is not None
        body = bytes(resp.buffer)
        resp.buffer = None
        if self.decision is not None:
            parsed = self.decision.parser.parse_response(
                body, resp.info.headers, streaming=False, end_of_stream=True
            )
            if parsed.usage is not None:
                resp.info.usage.merge(parsed.usage)
        restored = self._restore(body)
        self._complete(TerminationCause.NATURAL)
        if self.response_mode == _FULL_DUPLEX:
            return list(
                messages.streamed_body(restored, response=True, end_of_stream=end_of_stream)
            )
        return [messages.buffered_response_body_reply(restored if restored != body else None)]

    def _on_response_trailers(self) -> Replies:
        replies: Replies = []
        if self.response is not None and self.response.buffer is not None:
            replies = self._flush_buffered(end_of_stream=False)
        self._complete(TerminationCause.NATURAL)
        replies.append(messages.EMPTY_RESPONSE_TRAILERS)
        return replies

    def _restore(self, data: bytes) -> bytes:
        """Give the client back the model name it asked for (byte replace, as upstream)."""
        d = self.decision
        if d is None or not d.model_rewritten or not data:
            return data
        target = d.request.target_model.encode()
        incoming = d.request.incoming_model.encode()
        data = data.replace(b'"model":"' + target + b'"', b'"model":"' + incoming + b'"')
        return data.replace(b'"model": "' + target + b'"', b'"model": "' + incoming + b'"')

    # ---- completion -------------------------------------------------------------------------

    def _complete(self, cause: TerminationCause) -> None:
        if self.completed or self.decision is None:
            return
        self.completed = True
        request = self.decision.request
        info = (
            self.response.info
            if self.response
            else ResponseInfo(request_id=request.request_id, headers={})
        )
        info.end_of_stream = True
        info.termination_cause = cause
        for hook in self.ctx.pipeline.response_complete:
            try:
                hook.response_complete(request, info)
            except Exception:
                log.exception("response-complete hook %s failed", hook.typed_name)
        self.ctx.director.finished(request, info.usage.completion_tokens)
        self.ctx.stats.on_complete(
            self.decision,
            info,
            time.monotonic() - self.started,
            self.response.size if self.response else 0,
        )

    def close(self, *, error: bool) -> None:
        """Stream ended (normally, by client disconnect or by error)."""
        if self.decision is not None and not self.completed:
            self._complete(TerminationCause.ERROR if error else TerminationCause.CLIENT_DISCONNECT)


def _scores(decision: Decision) -> dict[str, float]:
    by_id = {e.id: e for e in decision.candidates}
    scores: Mapping[str, float] = decision.result.primary.scores
    out = {}
    for eid, score in scores.items():
        ep = by_id.get(eid)
        out[ep.hostport if ep else eid] = score
    return out

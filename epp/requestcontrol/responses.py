"""The Director's response side: from a request's response headers to its completion.

The response headers run the ``ResponseHeaders`` hooks and decide whether the body is read at all
(``epp.requestcontrol.bodyneed``: a streamed body nothing needs is handed back unread). Body
chunks feed the parser's usage extraction, then the ``ResponseStreaming`` hooks (a held,
non-streamed response: once, at its end), and get the client's model name back. Completion (end
of stream, trailers, client disconnect or error, exactly once) runs the ``ResponseComplete``
hooks, frees the flow-control accounting and records the request's metrics.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping

from epp.config.pipeline import Pipeline
from epp.flowcontrol.controller import FlowController
from epp.observability.logs import fields as _kv
from epp.observability.recorder import RequestStats
from epp.plugin import ResponseInfo, TerminationCause, wire
from epp.requestcontrol.bodyneed import BodyNeed
from epp.requestcontrol.exchange import Exchange, Forward, learn, restore_model, stream_hooks

log = logging.getLogger(__name__)
_tuple_new = tuple.__new__


class ResponseSide:
    """What the Director does once a request was answered (``Director`` builds on it)."""

    def __init__(
        self,
        pipeline: Pipeline,
        flow: FlowController | None,
        stats: RequestStats | None,
        *,
        response_sample: float,
        sample_rng: random.Random | None,
    ) -> None:
        self._pipeline = pipeline
        self._flow = flow
        self._stats = stats
        self._streaming = tuple(pipeline.response_streaming)
        self._body_need = BodyNeed(
            (*pipeline.response_streaming, *pipeline.response_complete),
            flow_controlled=flow is not None,
            sample_ratio=response_sample,
            rng=sample_rng,
        )

    def on_response_headers(
        self, ex: Exchange, headers: Mapping[str, str], served_endpoint: str
    ) -> dict[str, str]:
        """The model server answered: returns the headers to set on the response."""
        status = headers.get(":status", "200")
        decision = ex.decision
        streaming = "text/event-stream" in headers.get("content-type", "") or bool(
            decision and decision.parsed.body.stream
        )
        ex.response = ResponseInfo(
            request_id=ex.request.request_id,
            headers=headers,
            served_endpoint=served_endpoint,
            streaming=streaming,
            status=int(status) if status.isdigit() else 0,
        )
        if streaming and decision is not None:
            rewritten = decision.model_rewritten
            ex.skip_body = not self._body_need.wanted(ex.request, ex.response, rewritten=rewritten)
            if not ex.skip_body:
                ex.state = decision.parser.new_response_state(headers)
        elif not streaming:
            ex.buffer = bytearray()
        if self._stats is not None:
            self._stats.on_response_status(ex.request, ex.response.status)
            if not status.startswith("2"):
                self._stats.on_error(ex.request, "ModelServerError")
        set_headers = {wire.WENT_INTO_RESP_HEADERS: "true"}
        for hook in self._pipeline.response_headers:
            try:
                hook.response_headers(ex.request, ex.response, set_headers)
            except Exception:
                log.exception("response-headers hook failed", extra=_kv(ex.request, hook))
        return set_headers

    def on_response_chunk(
        self,
        ex: Exchange,
        data: bytes,
        end_of_stream: bool,
        hold_limit: int | None,
        copy_held: bool = False,
    ) -> Forward | None:
        """A response body chunk. Streamed responses pass through at once; a non-streamed one is
        held until its end to parse its usage (``None`` = held), unless it grows past
        ``hold_limit`` bytes, in which case it passes through from then on. ``copy_held``: the
        gateway forwards each chunk once it is answered (``STREAMED``), so a held response is
        only copied, each chunk passing on with the client's model name restored. A body nobody
        needs (``Exchange.skip_body``) passes back untouched."""
        if ex.skip_body:
            if end_of_stream:
                self.complete(ex, TerminationCause.NATURAL)
            return Forward(data, whole=False, changed=False)
        info = ex.response
        if info is None:  # response body without headers (response_header_mode SKIP)
            info = ex.response = ResponseInfo(request_id=ex.request.request_id, headers={})
            ex.buffer = bytearray()
        if self._stats is not None:  # TTFT at the first chunk, inter-chunk latency after it
            self._stats.on_chunk(ex.request, info.streaming, ex.started)
        ex.size += len(data)
        held = ex.buffer
        if held is not None:
            if copy_held:
                held += data
                if end_of_stream:
                    self._finish_held(ex)
                out = restore_model(ex.decision, data)
                return Forward(out, False, out is not data)
            if hold_limit is None or len(held) + len(data) <= hold_limit:
                held += data
                return self._release(ex) if end_of_stream else None
            if held:  # a held response grew past the limit: send what was held first
                data = bytes(held) + data
            ex.buffer = None
        state = ex.state
        if state is not None:
            parsed = state.feed(data, end_of_stream)
            if parsed.usage is not None or parsed.response_id:  # most chunks: nothing to learn
                learn(info, parsed)
        if self._streaming:
            stream_hooks(self._streaming, ex, end_of_stream)
        decision = ex.decision
        out = restore_model(decision, data) if decision is not None else data
        if end_of_stream:
            self.complete(ex, TerminationCause.NATURAL)
        # built as the tuple it is: ``Forward(...)`` goes through a Python-level ``__new__`` that
        # costs twice as much, on every chunk
        return _tuple_new(Forward, (out, False, out is not data))

    def on_response_trailers(self, ex: Exchange, *, copy_held: bool = False) -> Forward | None:
        """Trailers end the response: a held body is released (``copy_held``: its chunks already
        went on, only its usage is read), and the request completes."""
        forward = None
        if ex.buffer is not None:
            if copy_held:
                self._finish_held(ex)
            else:
                forward = self._release(ex)
        self.complete(ex, TerminationCause.NATURAL)
        return forward

    def _release(self, ex: Exchange) -> Forward:
        """Let a held response go: its usage parsed at once, the model name restored."""
        body = self._finish_held(ex)
        out = restore_model(ex.decision, body)
        return Forward(out, whole=True, changed=out != body)

    def _finish_held(self, ex: Exchange) -> bytes:
        """A held response ended: its usage parsed, the hooks run once, the request completed."""
        assert ex.buffer is not None and ex.response is not None
        body = bytes(ex.buffer)
        ex.buffer = None
        decision = ex.decision
        if decision is not None:
            parsed = decision.parser.parse_response(
                body, ex.response.headers, streaming=False, end_of_stream=True
            )
            learn(ex.response, parsed)
        if self._streaming:
            stream_hooks(self._streaming, ex, True)
        self.complete(ex, TerminationCause.NATURAL)
        return body

    def complete(self, ex: Exchange, cause: TerminationCause) -> None:
        """The request ended (any cause). Runs once, and only for a routed request."""
        if ex.completed or ex.decision is None:
            return
        ex.completed = True
        request = ex.request
        info = ex.response or ResponseInfo(request_id=request.request_id, headers={})
        info.end_of_stream = True
        info.termination_cause = cause
        for hook in self._pipeline.response_complete:
            try:
                hook.response_complete(request, info)
            except Exception:
                log.exception("response-complete hook failed", extra=_kv(request, hook))
        if self._flow is not None:
            self._flow.done(request, output_tokens=info.usage.completion_tokens)
        if self._stats is not None:
            size = None if ex.skip_body else ex.size  # an unread body's size is unknown
            self._stats.on_complete(request, info, time.monotonic() - ex.started, size)

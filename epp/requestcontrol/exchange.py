"""What the Director keeps for one request from its headers to its completion.

``Decision`` is the scheduling outcome (and the body to forward); ``Exchange`` is the whole
request: the decision, the response as it streams back, and whether completion already ran.
``Forward`` is what the Director hands back for a response body: the bytes to send on. ``learn``
and ``stream_hooks`` are the response side's per-chunk steps.

Conditional decode (``conditional_decode``, upstream's gate after scheduling): a request whose
``prefer`` header holds ``if-available`` (RFC 7240; the llm-d coordinator's speculative decode
attempt, ``wire.prefers_if_available``) is routed only if the primary profile's first target
already caches part of its prompt; otherwise it gets 412, ``inference error: PreconditionFailed -
no decode worker has the requested KV cache``, and the coordinator runs the full
encode/prefill/decode pipeline instead. "Caches part of its prompt" = a ``PrefixCacheMatchInfo``
published for the request reports ``match_blocks > 0`` for that endpoint. Upstream reads only the
default ``approx-prefix-cache-producer``'s key, so with ``precise-prefix-cache-producer`` (or an
approx producer under another name) every conditional request gets 412; here every prefix
producer's match info counts. No match info at all (no prefix producer configured) is a 412, as
upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from epp.observability.tracing import RequestTrace
from epp.plugin import (
    PREFIX_MATCH_INFO,
    DropReason,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    ParsedResponse,
    Parser,
    ParseResult,
    PrefixMatchInfo,
    ResponseInfo,
    ResponseState,
    ResponseStreaming,
    SchedulingResult,
    wire,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Decision:
    request: InferenceRequest
    result: SchedulingResult
    parser: Parser
    parsed: ParseResult
    body: bytes
    destination: str
    candidates: Sequence[Endpoint]

    @property
    def model_rewritten(self) -> bool:
        return self.request.target_model != self.request.incoming_model

    def scores_by_hostport(self) -> dict[str, float]:
        """The primary profile's scores keyed by ``ip:port`` (by id for an unknown endpoint)."""
        by_id = {e.id: e for e in self.candidates}
        out = {}
        for eid, score in self.result.primary.scores.items():
            ep = by_id.get(eid)
            out[ep.hostport if ep else eid] = score
        return out


@dataclass(slots=True, eq=False)
class Exchange:
    """One request as the Director follows it. ``started`` is the clock reading at its headers;
    ``buffer`` holds a non-streamed response until its end (to parse its usage at once)."""

    request: InferenceRequest
    started: float
    decision: Decision | None = None
    response: ResponseInfo | None = None
    state: ResponseState | None = None
    buffer: bytearray | None = None
    size: int = 0
    completed: bool = False
    trace: RequestTrace | None = None
    """The request's spans when tracing is on (``epp.observability.tracing``)."""
    skip_body: bool = False
    """Nothing needs this response's body (decided at its headers): chunks that arrive anyway
    go back untouched, unread."""


class Forward(NamedTuple):
    """Response bytes to send on. ``whole`` is a held response released at once (else a streamed
    piece); ``changed`` says the bytes differ from what the model server sent."""

    body: bytes
    whole: bool
    changed: bool


def restore_model(decision: Decision | None, data: bytes) -> bytes:
    """Give the client back the model name it asked for (byte replace, as upstream)."""
    if decision is None or not data or not decision.model_rewritten:
        return data
    target = decision.request.target_model.encode()
    incoming = decision.request.incoming_model.encode()
    data = data.replace(b'"model":"' + target + b'"', b'"model":"' + incoming + b'"')
    return data.replace(b'"model": "' + target + b'"', b'"model": "' + incoming + b'"')


def learn(info: ResponseInfo, parsed: ParsedResponse) -> None:
    """Fold what the parser read from a response chunk or body into the response info."""
    if parsed.usage is not None:
        info.usage.merge(parsed.usage)
    if parsed.response_id and not info.response_id:
        info.response_id = parsed.response_id


def stream_hooks(hooks: Sequence[ResponseStreaming], ex: Exchange, end_of_stream: bool) -> None:
    """Run the ``ResponseStreaming`` hooks on a chunk the parser has read (routed requests only;
    one that raises is logged, and the stream goes on)."""
    info = ex.response
    if ex.decision is None or info is None:
        return
    info.end_of_stream = end_of_stream
    for hook in hooks:
        try:
            hook.response_streaming(ex.request, info)
        except Exception:
            log.exception("response-streaming hook %s failed", hook.typed_name)


def no_candidates() -> InferenceError:
    """What a request gets when no endpoint may serve it (upstream's 503 wording)."""
    return InferenceError(
        ErrorCode.SERVICE_UNAVAILABLE,
        "failed to find endpoint candidates for serving the request",
        drop_reason=DropReason.NO_ENDPOINTS,
    )


def conditional_decode(request: InferenceRequest, result: SchedulingResult) -> None:
    """Raise upstream's 412 for a ``Prefer: if-available`` request whose chosen endpoint caches
    none of its prompt (module docstring); any other request passes."""
    if not wire.prefers_if_available(request.headers):
        return
    targets = result.primary.targets
    if targets:
        endpoint_id = targets[0].id
        prefix = PREFIX_MATCH_INFO + "/"
        for key, infos in request.attributes.items():
            if isinstance(key, str) and key.startswith(prefix) and isinstance(infos, Mapping):
                info = infos.get(endpoint_id)
                if isinstance(info, PrefixMatchInfo) and info.match_blocks > 0:
                    return
    raise InferenceError(
        ErrorCode.PRECONDITION_FAILED, "no decode worker has the requested KV cache"
    )

"""What the Director keeps for one request from its headers to its completion.

``Decision`` is the scheduling outcome (and the body to forward); ``Exchange`` is the whole
request: the decision, the response as it streams back, and whether completion already ran.
``Forward`` is what the Director hands back for a response body: the bytes to send on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from epp.plugin import (
    Endpoint,
    InferenceRequest,
    ParsedResponse,
    Parser,
    ParseResult,
    ResponseInfo,
    ResponseState,
    SchedulingResult,
)


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
    first_byte_at: float = 0.0
    size: int = 0
    completed: bool = False


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

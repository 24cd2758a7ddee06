"""Flow-control outcomes (the ``outcome`` metric label) and the wire error each one becomes.

Messages follow upstream's wording (``<context>: <wrapped sentinel errors>``) so the
``inference error: <Code> - <Msg>`` bodies match the Go EPP's.
"""

from __future__ import annotations

from typing import Final

from epp.plugin import DropReason, ErrorCode, InferenceError

NOT_YET_FINALIZED: Final = "NotYetFinalized"
DISPATCHED: Final = "Dispatched"
REJECTED_CAPACITY: Final = "RejectedCapacity"
REJECTED_NO_ENDPOINTS: Final = "RejectedNoEndpoints"
REJECTED_OTHER: Final = "RejectedOther"
EVICTED_TTL: Final = "EvictedTTL"
EVICTED_NO_ENDPOINTS: Final = "EvictedNoEndpoints"
EVICTED_CONTEXT_CANCELLED: Final = "EvictedContextCancelled"
EVICTED_OTHER: Final = "EvictedOther"

_REJECTED: Final = "request rejected pre-queue"
_EVICTED: Final = "request evicted from queue"
_TTL: Final = "request TTL expired"
_NO_ENDPOINTS: Final = "no endpoints available"
_NOT_RUNNING: Final = "flow controller is not running"
_TIMED_OUT_EMPTY: Final = "request timed out in queue and no endpoints are available"


def outcome_error(outcome: str, *, has_endpoints: bool) -> InferenceError:
    """The error a non-dispatched outcome is answered with. ``has_endpoints`` tells whether the
    request still had candidates (a TTL expiry is 429 when it had, 503 when it had none)."""
    if outcome == REJECTED_CAPACITY:
        return _error(429, f"{_REJECTED}: queue at capacity", DropReason.SATURATED)
    if outcome == REJECTED_NO_ENDPOINTS:
        msg = f"{_NO_ENDPOINTS}: {_REJECTED}: {_NO_ENDPOINTS}"
        return _error(503, msg, DropReason.NO_ENDPOINTS)
    if outcome == EVICTED_NO_ENDPOINTS:
        msg = f"{_TIMED_OUT_EMPTY}: {_EVICTED}: {_TTL}: {_NO_ENDPOINTS}"
        return _error(503, msg, DropReason.NO_ENDPOINTS)
    if outcome == EVICTED_TTL:
        if not has_endpoints:
            return _error(503, f"{_TIMED_OUT_EMPTY}: {_EVICTED}: {_TTL}", DropReason.NO_ENDPOINTS)
        msg = f"request timed out in queue: {_EVICTED}: {_TTL}"
        return _error(429, msg, DropReason.TTL_EXPIRED)
    if outcome == EVICTED_CONTEXT_CANCELLED:
        msg = f"client disconnected: {_EVICTED}: request context cancelled"
        return _error(503, msg, DropReason.CONTEXT_CANCELLED)
    if outcome in (REJECTED_OTHER, EVICTED_OTHER):
        where = _REJECTED if outcome == REJECTED_OTHER else _EVICTED
        msg = f"flow controller shutting down: {where}: {_NOT_RUNNING}"
        return _error(503, msg, DropReason.SHUTTING_DOWN)
    return InferenceError(ErrorCode.INTERNAL, f"unhandled flow control outcome: {outcome}")


def _error(status: int, message: str, reason: str) -> InferenceError:
    code = ErrorCode.RESOURCE_EXHAUSTED if status == 429 else ErrorCode.SERVICE_UNAVAILABLE
    return InferenceError(code, message, drop_reason=reason)

from __future__ import annotations

import pytest

from epp.flowcontrol import outcomes as o
from epp.plugin import DropReason


@pytest.mark.parametrize(
    ("outcome", "has_endpoints", "status", "reason", "body"),
    [
        pytest.param(
            o.REJECTED_CAPACITY,
            True,
            429,
            DropReason.SATURATED,
            "ResourceExhausted - request rejected pre-queue: queue at capacity",
            id="capacity",
        ),
        pytest.param(
            o.REJECTED_NO_ENDPOINTS,
            False,
            503,
            DropReason.NO_ENDPOINTS,
            "ServiceUnavailable - no endpoints available: request rejected pre-queue: "
            "no endpoints available",
            id="capacity-no-endpoints",
        ),
        pytest.param(
            o.EVICTED_TTL,
            True,
            429,
            DropReason.TTL_EXPIRED,
            "ResourceExhausted - request timed out in queue: request evicted from queue: "
            "request TTL expired",
            id="ttl",
        ),
        pytest.param(
            o.EVICTED_TTL,
            False,
            503,
            DropReason.NO_ENDPOINTS,
            "ServiceUnavailable - request timed out in queue and no endpoints are available: "
            "request evicted from queue: request TTL expired",
            id="ttl-pool-empty",
        ),
        pytest.param(
            o.EVICTED_NO_ENDPOINTS,
            False,
            503,
            DropReason.NO_ENDPOINTS,
            "ServiceUnavailable - request timed out in queue and no endpoints are available: "
            "request evicted from queue: request TTL expired: no endpoints available",
            id="no-endpoint-ttl",
        ),
        pytest.param(
            o.EVICTED_CONTEXT_CANCELLED,
            True,
            503,
            DropReason.CONTEXT_CANCELLED,
            "ServiceUnavailable - client disconnected: request evicted from queue: "
            "request context cancelled",
            id="client-gone",
        ),
        pytest.param(
            o.EVICTED_OTHER,
            True,
            503,
            DropReason.SHUTTING_DOWN,
            "ServiceUnavailable - flow controller shutting down: request evicted from queue: "
            "flow controller is not running",
            id="shutdown-queued",
        ),
        pytest.param(
            o.REJECTED_OTHER,
            True,
            503,
            DropReason.SHUTTING_DOWN,
            "ServiceUnavailable - flow controller shutting down: request rejected pre-queue: "
            "flow controller is not running",
            id="shutdown-new",
        ),
        pytest.param(
            "Weird", True, 500, None, "Internal - unhandled flow control outcome: Weird", id="other"
        ),
    ],
)
def test_outcome_maps_to_wire_error_when_not_dispatched(
    outcome: str, has_endpoints: bool, status: int, reason: str | None, body: str
) -> None:
    err = o.outcome_error(outcome, has_endpoints=has_endpoints)
    assert err.code.http_status == status
    assert err.drop_reason == reason
    assert err.body == f"inference error: {body}"

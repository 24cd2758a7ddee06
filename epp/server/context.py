"""What every ext_proc stream of one App shares."""

from __future__ import annotations

from dataclasses import dataclass

from epp.observability.metrics import EppMetrics
from epp.observability.streams import StreamMetrics
from epp.observability.tracing import Tracing
from epp.requestcontrol.director import Director


@dataclass(frozen=True, slots=True)
class ServerContext:
    director: Director
    max_body_bytes: int = 64 << 20
    emit_scores: bool = False
    streams: StreamMetrics | None = None
    """With ``--enable-grpc-stream-metrics``."""
    tracing: Tracing | None = None
    """Set when tracing is on: every request gets its spans."""
    metrics: EppMetrics | None = None
    """For the request and response processing durations the server measures."""

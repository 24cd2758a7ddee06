"""``--enable-grpc-stream-metrics``: upstream's opt-in metrics of the ext_proc gRPC streams.

- ``llm_d_epp_extproc_streams_inflight``: streams open now;
- ``llm_d_epp_extproc_stream_duration_seconds``: how long each stream stayed open (upstream's
  buckets, 1 ms to 600 s);
- ``llm_d_epp_extproc_streams_total{code}``: streams ended, by gRPC status code in Go's
  spelling (``OK``, ``Canceled``, ``InvalidArgument``, ``Internal``).

Only ``Process`` streams are counted (not health checks), as upstream's interceptor does.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)

OK: Final = "OK"
CANCELED: Final = "Canceled"
INVALID_ARGUMENT: Final = "InvalidArgument"
INTERNAL: Final = "Internal"


class StreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.inflight = Gauge(
            "llm_d_epp_extproc_streams_inflight",
            "[ALPHA] Number of ext_proc gRPC streams currently open.",
            registry=registry,
        )
        self.duration = Histogram(
            "llm_d_epp_extproc_stream_duration_seconds",
            "[ALPHA] Duration an ext_proc gRPC stream stays open, in seconds.",
            buckets=BUCKETS,
            registry=registry,
        )
        self.total = Counter(
            "llm_d_epp_extproc_streams",
            "[ALPHA] Total ext_proc gRPC streams completed, by gRPC status code.",
            ["code"],
            registry=registry,
        )

    @classmethod
    def when(cls, enabled: bool, registry: CollectorRegistry) -> StreamMetrics | None:
        return cls(registry) if enabled else None

    def started(self) -> None:
        self.inflight.inc()

    def finished(self, code: str, seconds: float) -> None:
        self.inflight.dec()
        self.duration.observe(seconds)
        self.total.labels(code).inc()

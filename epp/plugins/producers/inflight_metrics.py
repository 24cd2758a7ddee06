"""The in-flight gauges of ``inflight-load-producer``, upstream's names and labels.

- ``llm_d_epp_inflight_requests``: requests this EPP dispatched to the endpoint and not yet
  completed;
- ``llm_d_epp_inflight_tokens``: their uncached prompt tokens (plus estimated output tokens with
  ``addEstimatedOutputTokens``), released when the response starts.

Both are labelled ``endpoint_name``, ``namespace`` (the two halves of the endpoint id
``namespace/name``), ``producer_name`` (the producer's instance name), ``fairness_id`` and
``priority``, and count this replica's requests only (the peers' loads are in their own
``/metrics``). A series whose requests and tokens are both back to zero is removed, so the
series count is bounded by the requests in flight whatever fairness ids clients send.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge

from epp.plugin.metrics import metric_family

_LABELS: Final = ("endpoint_name", "namespace", "producer_name", "fairness_id", "priority")

Labels = tuple[str, str, str, str, str]


class InflightGauges:
    """Per (endpoint, fairness id, priority) series of one producer instance."""

    def __init__(self, registry: CollectorRegistry, producer_name: str) -> None:
        self._requests = metric_family(
            registry,
            Gauge,
            "llm_d_epp_inflight_requests",
            "Current number of in-flight requests per endpoint, as tracked by the in-flight load "
            "producer.",
            _LABELS,
        )
        self._tokens = metric_family(
            registry,
            Gauge,
            "llm_d_epp_inflight_tokens",
            "Current number of in-flight tokens per endpoint (uncached prompt tokens, optionally "
            "plus estimated output), as tracked by the in-flight load producer.",
            _LABELS,
        )
        self._producer = producer_name
        # labels → [requests child, tokens child, requests, tokens]
        self._series: dict[Labels, list[Any]] = {}

    def labels(self, endpoint_id: str, fairness_id: str, priority: int) -> Labels:
        namespace, sep, name = endpoint_id.partition("/")
        if not sep:
            namespace, name = "", endpoint_id
        return (name, namespace, self._producer, fairness_id, str(priority))

    def add(self, labels: Labels, requests: int, tokens: int) -> None:
        """Count ``requests`` and ``tokens`` more (negative to release); a series back to zero
        goes."""
        series = self._series.get(labels)
        if series is None:
            if requests <= 0 and tokens <= 0:
                return
            series = self._series[labels] = [
                self._requests.labels(*labels),
                self._tokens.labels(*labels),
                0,
                0,
            ]
        series[2] = max(0, series[2] + requests)
        series[3] = max(0, series[3] + tokens)
        if series[2] == 0 and series[3] == 0:
            del self._series[labels]
            self._requests.remove(*labels)
            self._tokens.remove(*labels)
            return
        if requests:
            series[0].set(series[2])
        if tokens:
            series[1].set(series[3])

"""The in-flight gauges of ``inflight-load-producer``, upstream's names and labels.

- ``llm_d_epp_inflight_requests``: requests this EPP dispatched to the endpoint and not yet
  completed;
- ``llm_d_epp_inflight_tokens``: their uncached prompt tokens (plus estimated output tokens with
  ``addEstimatedOutputTokens``), released when the response starts.

Both are labelled ``endpoint_name``, ``namespace`` (the two halves of the endpoint id
``namespace/name``), ``producer_name`` (the producer's instance name), ``fairness_id`` and
``priority``, and count this replica's requests only (the peers' loads are in their own
``/metrics``). A series whose requests and tokens are both back to zero reads 0 and stays while
it is one of the last ``MAX_IDLE_SERIES`` (64) to go idle, then is removed, so the series count
is bounded by the requests in flight plus that many whatever fairness ids clients send (the
idle ones add at most about 20 KB to a ``/metrics`` page). Keeping them
matters: a request that finds its series gone creates it again, two labelled children, and
removing and recreating a series for every request was about a tenth of a small request's CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from prometheus_client import CollectorRegistry

from epp.plugin.fastmetrics import FastGauge
from epp.plugin.metrics import metric_family

_LABELS: Final = ("endpoint_name", "namespace", "producer_name", "fairness_id", "priority")

Labels = tuple[str, str, str, str, str]

MAX_IDLE_SERIES: Final = 64


class InflightGauges:
    """Per (endpoint, fairness id, priority) series of one producer instance."""

    def __init__(self, registry: CollectorRegistry, producer_name: str) -> None:
        self._requests = metric_family(
            registry,
            FastGauge,  # updated on the loop only (the producer's hooks)
            "llm_d_epp_inflight_requests",
            "Current number of in-flight requests per endpoint, as tracked by the in-flight load "
            "producer.",
            _LABELS,
        )
        self._tokens = metric_family(
            registry,
            FastGauge,  # updated on the loop only (the producer's hooks)
            "llm_d_epp_inflight_tokens",
            "Current number of in-flight tokens per endpoint (uncached prompt tokens, optionally "
            "plus estimated output), as tracked by the in-flight load producer.",
            _LABELS,
        )
        self._producer = producer_name
        # labels → [requests child, tokens child, requests, tokens]
        self._series: dict[Labels, list[Any]] = {}
        self._idle: OrderedDict[Labels, None] = OrderedDict()  # at zero, oldest first

    def labels(self, endpoint_id: str, fairness_id: str, priority: int) -> Labels:
        namespace, sep, name = endpoint_id.partition("/")
        if not sep:
            namespace, name = "", endpoint_id
        return (name, namespace, self._producer, fairness_id, str(priority))

    def add(self, labels: Labels, requests: int, tokens: int) -> None:
        """Count ``requests`` and ``tokens`` more (negative to release); a series back to zero
        reads 0 and joins the idle ones (the oldest idle one past the bound goes)."""
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
        elif not (series[2] or series[3]):
            self._idle.pop(labels, None)
        series[2] = max(0, series[2] + requests)
        series[3] = max(0, series[3] + tokens)
        if requests:
            series[0].set(series[2])
        if tokens:
            series[1].set(series[3])
        if series[2] == 0 and series[3] == 0:
            self._idle[labels] = None
            if len(self._idle) > MAX_IDLE_SERIES:
                gone, _ = self._idle.popitem(last=False)
                del self._series[gone]
                self._requests.remove(*gone)
                self._tokens.remove(*gone)

"""``dcgm-data-source`` and ``dcgm-extractor`` (alpha): GPU utilization from NVIDIA's DCGM
Exporter, published as the endpoint attribute ``GPUUtilization/dcgm-extractor``.

``dcgm-data-source`` GETs the exporter's Prometheus page for each endpoint:
``<scheme>://<host>:<port><path>``, where the host is the endpoint's pod IP (exporter as a
sidecar) or, with ``useNodeAddress``, the IP of its node (exporter as a DaemonSet; the pod IP when
discovery does not know the node). Parameters:

* ``scheme``: ``http`` (default) or ``https``; ``insecureSkipVerify`` (default true) skips
  verification of the exporter's certificate, otherwise it is checked against the system store;
* ``path``: default ``/metrics``;
* ``port``: default ``9400``, the exporter's; 0 scrapes the endpoint's own port;
* ``useNodeAddress``: default false; needs a non-zero ``port``;
* ``interval``: Go duration; empty scrapes every collector tick, otherwise the collector rounds it
  to a multiple of its tick.

Endpoints that share a target (pods of one node, with ``useNodeAddress``) share one kept-alive
connection; it is closed when the last of them leaves.

``dcgm-extractor`` (no parameters) reads ``DCGM_FI_DEV_GPU_UTIL`` (percent, one series per GPU):
it keeps the series of the endpoint's pod (label ``pod`` equal to the pod name, the endpoint name
without its ``-rank-<n>`` suffix) and the series without a ``pod`` label (a sidecar's), takes the
highest value (the busiest GPU) and publishes it divided by 100 as a float in [0, 1]. A payload
without the metric, or without a series for the pod, raises (an extract error; the previous value
stays, as upstream). Non-finite samples are skipped.

Without an exporter (nothing listening, a timeout, a non-200 answer) each poll fails: the
collector counts it in ``llm_d_epp_datalayer_poll_errors_total{source_type="dcgm-data-source"}``
and logs it at most every 30 s per endpoint; the endpoints carry no ``GPUUtilization``, so the
``endpoint-attribute-filter`` applies its ``onMissing`` policy and the
``endpoint-attribute-scorer`` scores them 0. The EPP starts and routes as without the plugins.

YAML example (read by ``endpoint-attribute-filter`` / ``-scorer`` with ``producer:
dcgm-extractor``)::

    plugins:
    - type: dcgm-data-source
      name: dcgm-source
      parameters:
        port: 9400
        useNodeAddress: true
        interval: 1s
    - type: dcgm-extractor
    dataLayer:
      sources:
      - pluginRef: dcgm-source
        extractors:
        - pluginRef: dcgm-extractor

Differences from upstream: the Prometheus text is read by this package's lenient parser (``# TYPE``
is not checked, so a ``DCGM_FI_DEV_GPU_UTIL`` exposed as untyped counts; malformed lines are
skipped instead of failing the poll); non-finite samples are skipped instead of counting as 0;
``useNodeAddress`` needs discovery to fill ``Endpoint.node_address``.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from dataclasses import dataclass
from typing import ClassVar, Final, Literal

from epp.plugin import Endpoint, Handle, Metrics, PluginBase, Stability, with_attribute
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.units import parse_duration
from epp.plugins.sources import promtext
from epp.plugins.sources.scrapeclient import KeepAliveClient, ScrapeError

DEFAULT_PORT: Final = 9400
GPU_UTIL_METRIC: Final = "DCGM_FI_DEV_GPU_UTIL"
POD_LABEL: Final = "pod"
_WANTED: Final = frozenset({GPU_UTIL_METRIC})
# A DCGM page lists a few dozen fields per GPU: a few hundred KB at most.
MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024


class DCGMDataSource(PluginBase):
    """Polls the DCGM Exporter of each endpoint (sidecar) or of its node (DaemonSet)."""

    TYPE: ClassVar[str] = "dcgm-data-source"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        scheme: Literal["http", "https"] = "http"
        path: str = "/metrics"
        port: int = DEFAULT_PORT
        insecure_skip_verify: bool = True
        use_node_address: bool = False
        interval: str = ""

        def __post_init__(self) -> None:
            if not 0 <= self.port <= 65535:
                raise ValueError(f"port must be between 0 and 65535, got {self.port}")
            if self.use_node_address and self.port == 0:
                raise ValueError("useNodeAddress requires a non-zero port")
            if not self.path.startswith("/"):
                raise ValueError(f"path must start with '/', got {self.path!r}")
            if self.interval and parse_duration(self.interval) < 0:
                raise ValueError(f"interval must not be negative, got {self.interval!r}")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.interval_seconds = parse_duration(params.interval) if params.interval else 0.0
        self._ssl: ssl.SSLContext | None = None
        if params.scheme == "https":
            self._ssl = ssl.create_default_context()
            if params.insecure_skip_verify:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._client: KeepAliveClient | None = None
        # One lock per target, so endpoints sharing an exporter open one connection, not a race
        # of them; dropped with the target's connection.
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    def target(self, endpoint: Endpoint) -> tuple[str, int]:
        """The exporter's (host, port) for ``endpoint``."""
        host = endpoint.address
        if self.params.use_node_address and endpoint.node_address:
            host = endpoint.node_address
        return host, self.params.port or endpoint.port

    def url(self, endpoint: Endpoint) -> str:
        host, port = self.target(endpoint)
        host = f"[{host}]" if ":" in host else host
        return f"{self.params.scheme}://{host}:{port}{self.params.path}"

    def _ensure_client(self) -> KeepAliveClient:
        if self._client is None:
            self._client = KeepAliveClient(ssl_context=self._ssl, max_body_bytes=MAX_PAYLOAD_BYTES)
        return self._client

    async def start(self) -> None:
        self._ensure_client()

    async def stop(self) -> None:
        client, self._client = self._client, None
        self._locks.clear()
        if client is not None:
            await client.close()

    def forget(self, endpoint: Endpoint) -> None:
        """``EndpointForgetter``: close the connection to the endpoint's exporter unless another
        current endpoint still scrapes it."""
        target = self.target(endpoint)
        if any(e.id != endpoint.id and self.target(e) == target for e in self.handle.endpoints()):
            return
        self._locks.pop(target, None)
        if self._client is not None:
            self._client.forget(*target)

    async def poll(self, endpoint: Endpoint) -> bytes:
        target = self.target(endpoint)
        lock = self._locks.get(target)
        if lock is None:
            lock = self._locks[target] = asyncio.Lock()
        try:
            async with lock:
                return await self._ensure_client().get(*target, self.params.path)
        except (ScrapeError, OSError) as exc:
            raise RuntimeError(f"GET {self.url(endpoint)}: {exc}") from None


class DCGMExtractor(PluginBase):
    """``DCGM_FI_DEV_GPU_UTIL`` of the endpoint's pod → ``GPUUtilization/dcgm-extractor``."""

    TYPE: ClassVar[str] = "dcgm-extractor"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics:
        samples = promtext.parse(payload, _WANTED).get(GPU_UTIL_METRIC)
        if not samples:
            raise ValueError(f"metric {GPU_UTIL_METRIC!r} not found in DCGM response")
        pod = pod_name(endpoint)
        highest = 0.0
        found = False
        for sample in samples:
            if sample.labels.get(POD_LABEL, pod) != pod or not math.isfinite(sample.value):
                continue
            found = True
            highest = max(highest, sample.value)
        if not found:
            raise ValueError(
                f"metric {GPU_UTIL_METRIC!r} present but has no samples for pod {pod!r}"
            )
        return with_attribute(previous, GPU_UTILIZATION, highest / 100.0)


def pod_name(endpoint: Endpoint) -> str:
    """The pod an endpoint belongs to: its name without the ``-rank-<rank>`` suffix Kubernetes
    discovery gives it (file-discovery names are used as they are)."""
    suffix = f"-rank-{endpoint.rank}"
    name = endpoint.name
    return name[: -len(suffix)] if name.endswith(suffix) and len(name) > len(suffix) else name

"""``metrics-data-source``: HTTP(S) GET of a model server's Prometheus ``/metrics``.

URL: ``<scheme>://<endpoint address>:<port or endpoint port><path>``. Scrapes go through a
minimal HTTP/1.1 keep-alive client (``scrapeclient`` in this package): one connection per
endpoint reused every tick (TCP or TLS), no per-request objects, so a 50 ms tick over many
endpoints stays cheap; the answers of the scrapes started in one tick are read together, 2 ms
after the requests (one wake-up of the process for all of them). A response other than 200
raises; the next scrape reconnects.

Parameters:

* ``scheme``: ``http`` (default) or ``https``;
* ``path``: default ``/metrics``;
* ``insecureSkipVerify``: default true (upstream default); with false the server certificate is
  verified against ``caCertPath`` (or the system store when empty);
* ``clientCertPath`` / ``clientKeyPath``: client certificate for mTLS (both or neither);
* ``port``: 0 (default) scrapes the endpoint's own port, otherwise this port;
* ``interval``: Go duration; empty scrapes every collector tick, otherwise the collector rounds it
  to a multiple of its tick (the ``PollInterval`` capability, ``interval_seconds``).

Connections to an endpoint that left the pool are closed (``EndpointForgetter``). With ``port``
0 the scrape reaches the port the endpoint serves on (``ReachabilityProbe``): a refused connection
means nothing listens there any more, and the endpoint leaves routing until a scrape succeeds
(ours; upstream routes to it until discovery removes it).

YAML example::

    - type: metrics-data-source
      parameters:
        scheme: https
        path: /metrics
        insecureSkipVerify: false
        caCertPath: /etc/epp/ca.pem
        interval: 200ms
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import ClassVar, Final, Literal

from epp.plugin import Endpoint, Handle, PluginBase, PluginConfigError
from epp.plugin.units import parse_duration
from epp.plugins.sources.scrapeclient import KeepAliveClient, ScrapeError

# A /metrics page is tens to hundreds of KB; anything this large is not a metrics page.
MAX_PAYLOAD_BYTES: Final = 32 * 1024 * 1024


class MetricsDataSource(PluginBase):
    """Polls ``/metrics`` of each endpoint over one shared keep-alive session."""

    TYPE: ClassVar[str] = "metrics-data-source"
    MAX_PAYLOAD: ClassVar[int] = MAX_PAYLOAD_BYTES

    @dataclass(frozen=True)
    class Params:
        scheme: Literal["http", "https"] = "http"
        path: str = "/metrics"
        insecure_skip_verify: bool = True
        port: int = 0
        interval: str = ""
        ca_cert_path: str = ""
        client_cert_path: str = ""
        client_key_path: str = ""

        def __post_init__(self) -> None:
            if not 0 <= self.port <= 65535:
                raise ValueError(f"port must be between 0 and 65535, got {self.port}")
            if not self.path.startswith("/"):
                raise ValueError(f"path must start with '/', got {self.path!r}")
            if self.interval and parse_duration(self.interval) < 0:
                raise ValueError(f"interval must not be negative, got {self.interval!r}")
            if bool(self.client_cert_path) != bool(self.client_key_path):
                raise ValueError("clientCertPath and clientKeyPath must be set together")

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.interval_seconds = parse_duration(params.interval) if params.interval else 0.0
        self.reaches_endpoint = params.port == 0
        self._ssl = self._ssl_option(params)
        self._client: KeepAliveClient | None = None

    def _ssl_option(self, params: Params) -> ssl.SSLContext | bool:
        """TLS settings, built now so a bad certificate path fails at startup."""
        if params.scheme != "https":
            return True
        try:
            context = ssl.create_default_context(cafile=params.ca_cert_path or None)
            if params.insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if params.client_cert_path:
                context.load_cert_chain(params.client_cert_path, params.client_key_path)
        except (OSError, ssl.SSLError) as exc:
            raise PluginConfigError(
                plugin=self.typed_name.name, type_name=self.TYPE, path="", problem=str(exc)
            ) from exc
        return context

    def target(self, endpoint: Endpoint) -> tuple[str, int]:
        """The host and port scraped for ``endpoint``."""
        return endpoint.address, self.params.port or endpoint.port

    def url(self, endpoint: Endpoint) -> str:
        address, port = self.target(endpoint)
        host = f"[{address}]" if ":" in address else address
        return f"{self.params.scheme}://{host}:{port}{self.params.path}"

    def _ensure_client(self) -> KeepAliveClient:
        if self._client is None:
            self._client = KeepAliveClient(
                ssl_context=self._ssl if isinstance(self._ssl, ssl.SSLContext) else None,
                max_body_bytes=self.MAX_PAYLOAD,
            )
        return self._client

    async def start(self) -> None:
        self._ensure_client()

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def forget(self, endpoint: Endpoint) -> None:
        """``EndpointForgetter``: close the kept-alive connection to an endpoint that left."""
        if self._client is not None:
            self._client.forget(*self.target(endpoint))

    async def poll(self, endpoint: Endpoint) -> bytes:
        address, port = self.target(endpoint)
        try:
            return await self._ensure_client().get(address, port, self.params.path)
        except ScrapeError as exc:
            raise RuntimeError(f"GET {self.url(endpoint)}: {exc}") from None

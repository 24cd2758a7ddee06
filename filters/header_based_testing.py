"""``header-based-testing-filter``: keep the endpoints a test names in a request header.

Conformance suites steer a request to chosen pods with the request header
``test-epp-endpoint-selection``: a comma-separated list whose entries are ``IP`` or ``IP:port``;
IPv6 addresses may be bare (``fd00::1``) or bracketed (``[fd00::1]``, ``[fd00::1]:8000``).

- ``IP:port`` keeps the endpoint with exactly that address and port.
- ``IP`` keeps every endpoint (data-parallel rank) of that address, in candidate order.
- The result follows header order with duplicates removed; unknown or malformed entries are
  skipped. A missing or empty header keeps **no** endpoint.

Addresses are compared in canonical form, so ``fd00:0::1`` and ``fd00::1`` are the same address.

This plugin lets any client pick its backend: configure it only in test deployments.

Parameters: none.

YAML::

    plugins:
      - type: header-based-testing-filter
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: header-based-testing-filter
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase

HEADER = "test-epp-endpoint-selection"


class HeaderBasedTestingFilter(PluginBase):
    TYPE: ClassVar[str] = "header-based-testing-filter"

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        entries = list(_entries(request.headers.get(HEADER, "")))
        if not entries:
            return []
        candidates = [(_canonical(ep.address), ep) for ep in endpoints]
        selected: dict[str, Endpoint] = {}  # insertion-ordered, keyed by endpoint id
        for host, port in entries:
            for address, ep in candidates:
                if address == host and (port is None or ep.port == port):
                    selected.setdefault(ep.id, ep)
        return list(selected.values())


def _entries(value: str) -> Iterator[tuple[str, int | None]]:
    """Yield ``(canonical host, port or None)`` for each well-formed entry of the header."""
    for raw in value.split(","):
        parsed = _split(raw.strip())
        if parsed is not None:
            yield parsed


def _split(item: str) -> tuple[str, int | None] | None:
    if not item:
        return None
    host, port_text = item, ""
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            return None
        host, rest = item[1:end], item[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:]
    elif item.count(":") == 1:  # IPv4 or hostname with a port; bare IPv6 has several colons
        host, port_text = item.split(":")
    if not port_text:
        return _canonical(host), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return _canonical(host), int(port_text)


def _canonical(host: str) -> str:
    host = host.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()

"""The stack's Envoy configs take the gateway's route timeout, the EPP's and the baseline's alike
(``epp bench scale`` stretches it with simulated time, so slowed turns are not cut early)."""

from __future__ import annotations

import pytest
import yaml

from epp_tools.stack.envoy import render


def _route_timeouts(text: str) -> set[str]:
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            route = node.get("route")
            if isinstance(route, dict) and "timeout" in route:
                found.add(route["timeout"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load(text))
    return found


@pytest.mark.parametrize("name", ["full-duplex", "round-robin"])
def test_route_timeout_reaches_every_route(name: str) -> None:
    kw = {"listen_port": 1, "admin_port": 2, "epp_port": 3, "epp_tls": False}
    fallback = [("127.0.0.1", 8000)]
    assert _route_timeouts(render(name, fallback=fallback, **kw)) == {"300s"}
    assert _route_timeouts(render(name, fallback=fallback, route_timeout=600, **kw)) == {"600s"}

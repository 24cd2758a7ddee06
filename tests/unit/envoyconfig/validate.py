"""``envoy --mode validate`` on a generated config, and fragments wrapped into a bootstrap."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from epp_tools.stack.envoy import envoy_binary

ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."


def validate(text: str, path: Path) -> None:
    """Envoy accepts ``text`` as its whole config (AssertionError with Envoy's reason if not)."""
    path.write_text(text)
    run = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and " OK" in run.stdout, run.stdout + run.stderr


def wrap(http_filters: list[dict[str, Any]], clusters: list[dict[str, Any]]) -> str:
    """A bootstrap around ``http_filters`` (router appended unless present) and ``clusters``,
    routing to cluster ``pool``: how a user's own Envoy would hold the fragments."""
    if not any(f["name"] == ROUTER["name"] for f in http_filters):
        http_filters = [*http_filters, ROUTER]
    hcm = {
        "@type": HCM + "HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "pool"}}],
                }
            ]
        },
        "http_filters": http_filters,
    }
    listener = {
        "name": "main",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 8081}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }
    return yaml.safe_dump({"static_resources": {"listeners": [listener], "clusters": clusters}})

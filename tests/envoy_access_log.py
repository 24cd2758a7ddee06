"""The test Envoy config (``epp_tools.stack.envoy.render``) plus a file access log, so a test can
read what Envoy ended up with for each request: request headers after the EPP's mutations
(``%REQ(...)%``), dynamic metadata the EPP sent (``%DYNAMIC_METADATA(...)%``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from epp_tools.stack.envoy import free_port, render

_FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"


def logging_envoy(app: Any, log: Path, line: str) -> dict[str, Any]:
    """Keyword arguments for the ``envoy`` fixture: the full-duplex config for ``app`` with one
    access-log ``line`` (Envoy's format, newline added) per request written to ``log``."""
    listen, admin = free_port(), free_port()
    config = yaml.safe_load(
        render(
            "full-duplex",
            listen_port=listen,
            admin_port=admin,
            epp_port=app.grpc_port,
            epp_tls=app.settings.secure_serving,
        )
    )
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    manager["typed_config"]["access_log"] = [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": _FILE_LOG,
                "path": str(log),
                "log_format": {"text_format": line + "\n"},
            },
        }
    ]
    return {"config_text": yaml.safe_dump(config), "listen_port": listen, "admin_port": admin}

"""The EPP configuration the local tools run: a config with file discovery injected.

``epp stack`` and ``epp bench`` both start the EPP against simulated pods listed in an endpoints
file; this is the one place that turns a base config (the built-in default unless given) into
that config.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from epp.config.schema import DEFAULT_CONFIG_TEXT


def epp_config_text(
    endpoints_file: Path, extra_scorers: tuple[tuple[str, int], ...], base: str | None = None
) -> str:
    """The built-in default config (or ``base``) with file discovery and the workload's extra
    scorers (added only to the default config)."""
    doc = yaml.safe_load(base or DEFAULT_CONFIG_TEXT)
    doc.setdefault("plugins", [])
    doc.setdefault("dataLayer", {})
    if base is not None:
        extra_scorers = ()
    params = {"path": str(endpoints_file), "watchFile": False}
    discovery = [p for p in doc["plugins"] if p.get("type") == "file-discovery"]
    if discovery:
        discovery[0]["parameters"] = params
    else:
        discovery = [{"type": "file-discovery", "parameters": params}]
        doc["plugins"].append(discovery[0])
    doc["dataLayer"]["discovery"] = {"pluginRef": discovery[0].get("name", "file-discovery")}
    for scorer, weight in extra_scorers:
        doc["plugins"].append({"type": scorer})
        doc["schedulingProfiles"][0]["plugins"].append({"pluginRef": scorer, "weight": weight})
    return str(yaml.safe_dump(doc, sort_keys=False))

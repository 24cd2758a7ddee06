"""The EPP configuration the local tools run: a config with file discovery injected.

``epp stack`` and ``epp bench`` both start the EPP against simulated pods listed in an endpoints
file; this is the one place that turns a base config (the built-in default unless given) into
that config. ``unloadable_plugins`` tells a tool, before it starts anything, which plugin types of
a config the installed plugins cannot provide (a P/D config before the P/D plugins exist),
``CONFIGS`` holds the configs of the source tree (``PD_CONFIG`` the P/D one), and ``with_syncer``
adds the Redis syncer that active-active replicas share state through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import yaml

import epp
from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp.plugin.errors import PluginLoadError, UnknownPluginType
from epp.plugin.registry import PluginRegistry

CHECKOUT: Final = Path(epp.__file__).resolve().parent.parent
"""The source checkout the EPP runs from (an editable install; the tools are installed from it)."""
CONFIGS: Final = CHECKOUT / "deploy" / "configs"
"""``deploy/configs`` of the source checkout (absent from an installed wheel)."""
PD_CONFIG: Final = CONFIGS / "pd.yaml"


def unloadable_plugins(config_text: str) -> list[str]:
    """Plugin types of a config the installed plugins cannot provide, each with the reason."""
    doc = yaml.safe_load(config_text) or {}
    registry = PluginRegistry.from_entry_points()
    missing = []
    for type_name in dict.fromkeys(str(p.get("type", "")) for p in doc.get("plugins") or ()):
        try:
            registry.load(type_name)
        except (UnknownPluginType, PluginLoadError) as exc:
            missing.append(f"{type_name} ({type(exc).__name__})")
    return missing


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


def with_syncer(config_text: str, redis_url: str, interval: str = "200ms") -> str:
    """``config_text`` with a ``redis-syncer`` on ``redis_url`` as its cross-replica syncer
    (active-active replicas share what they learn through it)."""
    doc = yaml.safe_load(config_text) or {}
    doc.setdefault("plugins", []).append({"type": "redis-syncer", "parameters": {"url": redis_url}})
    data_layer = doc.setdefault("dataLayer", {})
    data_layer["crossReplicaSyncerPluginRef"] = "redis-syncer"
    data_layer["crossReplicaSyncInterval"] = interval
    return str(yaml.safe_dump(doc, sort_keys=False))

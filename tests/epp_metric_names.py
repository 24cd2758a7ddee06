"""The Prometheus series names an EPP exposes, read from a real ``App``'s registry, for the checks
that dashboards and alert rules name only metrics that exist.

The App is built (not started) from ``deploy/configs/flow-control.yaml`` plus a ``redis-syncer``,
so the engine's families, flow control's, cross-replica sync's and those of the plugins that
register their own (prefix indexer, program-aware fairness, the syncer) are all there. The model
servers' series the EPP scrapes by default (vLLM's, which the dashboard's per-endpoint KV-cache
panel reads) are listed separately.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


@functools.cache
def epp_series_names() -> frozenset[str]:
    from epp.app import App
    from tests.conftest import make_settings

    config = yaml.safe_load((ROOT / "deploy/configs/flow-control.yaml").read_text())
    config["plugins"].append({"type": "redis-syncer", "parameters": {"url": "redis://127.0.0.1:1"}})
    config["dataLayer"]["crossReplicaSyncerPluginRef"] = "redis-syncer"
    app = App(make_settings(yaml.safe_dump(config), allow_experimental_plugins=True))
    names: set[str] = set()
    for family in app.metrics.registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return frozenset(names)


@functools.cache
def model_server_series_names() -> frozenset[str]:
    """vLLM's series the built-in engine mapping reads (queue, running, KV cache, LoRA)."""
    from epp.plugins.sources.engines import BUILTIN_ENGINES, parse_spec

    (vllm,) = [e for e in BUILTIN_ENGINES if e.name == "vllm"]
    specs = (vllm.queued_requests_spec, vllm.running_requests_spec, vllm.kv_usage_spec)
    return frozenset(spec.name for spec in map(parse_spec, specs) if spec is not None)


_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are neither functions,
    keywords, label names (in ``{}`` matchers or grouping clauses), strings nor variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call is None and name.lower() not in _KEYWORDS:
            names.add(name)
    return names

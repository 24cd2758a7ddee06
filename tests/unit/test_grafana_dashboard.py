"""deploy/grafana/inference-epp.json: every query names only series the EPP registers (read from a
real App's registry) or the vLLM series the EPP itself scrapes; llm-d's Inference Gateway
dashboard's panels are all there under their titles; the dashboard is well formed (unique panel
ids, no overlapping panels, every template variable defined)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.epp_metric_names import epp_series_names, model_server_series_names, promql_metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "inference-epp.json"

# The panels of llm-d's Inference Gateway dashboard (deploy/grafana/inference_gateway.json there).
LLM_D_PANELS = (
    "Average KV Cache Utilization", "Average Queue Size", "Queue Size Per Endpoint",
    "E2E Request Latency", "Request / s", "Request Error / s", "Request Size", "Response Size",
    "Input Token Count", "Output Token Count", "Pool Saturation", "Net Queue Flow",
    "Request Arrival Rate", "Queue Depth", "Queue Memory Mass", "Dispatch Outcomes",
    "Wait Time (P99)", "Internal Processing Latency (P99)", "Fairness Sharing Rate",
)  # fmt: skip
# What the issue asks the dashboard to show, by the series that show it.
REQUIRED_SERIES = {
    "pool health": "llm_d_epp_ready_endpoints",
    "per-endpoint queue": "llm_d_epp_per_endpoint_queue_size",
    "per-endpoint KV cache": "vllm:kv_cache_usage_perc",
    "decision mix": "llm_d_epp_scheduler_attempts_total",
    "per-plugin latency": "llm_d_epp_plugin_duration_seconds_bucket",
    "flow-control queues": "llm_d_epp_flow_control_queue_size",
    "prefix hit ratio": "llm_d_epp_prefix_indexer_hit_ratio_sum",
    "sharing lag": "llm_d_epp_state_sync_lag_seconds",
}


def _load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p.get("targets", [])]


def test_every_query_names_a_series_the_epp_registers() -> None:
    known = epp_series_names() | model_server_series_names()
    unknown: list[str] = []
    for title, expr in _exprs(_load()):
        names = promql_metric_names(expr)
        assert names, (title, expr)
        unknown += [f"{title}: {n}" for n in sorted(names - known)]
    assert not unknown, "\n".join(unknown)


def test_the_panels_of_llm_d_and_of_the_issue_are_there() -> None:
    dashboard = _load()
    titles = {p["title"] for p in _panels(dashboard)}
    assert not set(LLM_D_PANELS) - titles
    used = set().union(*(promql_metric_names(e) for _, e in _exprs(dashboard)))
    missing = {what: s for what, s in REQUIRED_SERIES.items() if s not in used}
    assert not missing


def test_dashboard_is_well_formed() -> None:
    dashboard = _load()
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
    defined = {v["name"] for v in dashboard["templating"]["list"]} | {"__rate_interval", "__range"}
    for title, expr in _exprs(dashboard):
        used = set(re.findall(r"\$(\w+)", expr))
        assert used <= defined, (title, used - defined)

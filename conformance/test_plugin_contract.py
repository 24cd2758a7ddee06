"""The plugin contract, checked over every plugin installed under the ``epp.plugins`` group:
built-in ones and any third-party package in the environment."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import Filter, Picker, Scorer
from epp.plugin.conformance import scheduling_roles
from epp.plugin.params import decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import (
    check_filter,
    check_picker,
    check_plugin_class,
    check_scorer,
    sample_endpoints,
    sample_request,
)
from tests.builders import FakeHandle

REGISTRY = PluginRegistry.from_entry_points()
TYPES = REGISTRY.types()

# Plugins whose parameters have required fields get a minimal valid set here.
REQUIRED_PARAMS: dict[str, dict[str, Any]] = {
    "file-discovery": {"path": "/nonexistent/endpoints.yaml"},
    "multicluster-file-discovery": {"path": "/nonexistent/clusters.yaml"},
    "priority-holdback-policy": {"minCeiling": 0.5},
    "by-label": {"label": "llm-d.ai/role", "validValues": ["decode"], "allowsNoLabel": True},
    "endpoint-attribute-filter": {
        "attribute": "GPUUtilization",
        "producer": "dcgm-extractor",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 0.9}},
    },
    "session-id-producer": {"headerName": "x-session-id"},
    "k8s-notification-source": {"version": "v1", "kind": "ConfigMap"},
    "request-attribute-reporter": {
        "attributes": [
            {"key": {"name": "x-cost"}, "expression": "usage.prompt_tokens * 2.0"},
        ]
    },
    "utilization-filter": {
        "conditions": [
            {"metric": "active-requests", "maxValue": 2},
            {"metric": "waiting-queue", "maxValue": 5},
        ]
    },
    "header-label-affinity-scorer": {"headerName": "x-disagg-slice", "labelKey": "zone"},
    "disaggregatedset-rollout-screener": {
        "scope": {"labelSelector": "llm-d.ai/engine-type=vllm"},
        "headerSelectors": [
            {"name": "zone", "headerName": "x-zone", "labelKey": "zone", "mode": "strict"}
        ],
        "revisionGating": {"mode": "sum", "requireRoles": {"values": ["decode"]}},
    },
    "endpoint-attribute-scorer": {
        "attributeKey": "GPUUtilization",
        "producer": "dcgm-extractor",
        "algorithm": {"type": "linear_lower_is_better"},
    },
}


class RegistryHandle(FakeHandle):
    """A handle whose other plugins are the registered types, each named by its type (as a
    plugin that refers to another by name, e.g. a profile handler's decider, finds it)."""

    def plugin(self, name: str) -> Any:
        if name not in REGISTRY.types():
            raise KeyError(name)
        return build(name)


def build(type_name: str, parameters: dict[str, Any] | None = None) -> Any:
    cls = REGISTRY.load(type_name)
    params = decode(cls.Params, parameters or REQUIRED_PARAMS.get(type_name))
    return cls(name=type_name, params=params, handle=RegistryHandle())


@pytest.mark.parametrize("type_name", TYPES)
def test_class_contract(type_name: str) -> None:
    check_plugin_class(REGISTRY.load(type_name), type_name)


def scheduling_types() -> list[str]:
    """The types that fill a scheduling role; ``test_role_contracts`` checks every other role."""
    return [t for t in TYPES if scheduling_roles(build(t))]


@pytest.mark.parametrize("type_name", scheduling_types())
def test_role_contract(type_name: str) -> None:
    plugin = build(type_name)
    checked = False
    for n in (0, 1, 7, 50):
        eps = sample_endpoints(n, seed=n)
        request = sample_request(headers={"test-epp-endpoint-selection": "127.0.0.2,127.0.0.3"})
        if isinstance(plugin, Scorer):
            check_scorer(plugin, eps, request)
            checked = True
        if isinstance(plugin, Filter):
            check_filter(plugin, eps, request)
            checked = True
        if isinstance(plugin, Picker):
            check_picker(plugin, eps)
            checked = True
    assert checked, f"{type_name} is not a filter, scorer or picker"

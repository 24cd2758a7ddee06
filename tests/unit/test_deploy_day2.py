"""deploy/ (the kustomize variants and the Helm chart) sets what a rolling update, a node drain
and a pod's termination need to lose no request:

- the rollout finishes and keeps a ready EPP throughout, checked by replaying the Deployment
  controller's steps (``tests/deploy_rollout.py``) with the EPP's readiness: every started
  replica without leader election, only the leader with it. Without leader election that means
  ``maxUnavailable: 0`` (a new pod is ready before an old one stops); with it, 100% (anything
  lower never finishes: no new pod can be ready while the old leader holds the lease);
- a PodDisruptionBudget lets a node drain go on one EPP at a time, and none is rendered with
  leader election, where any budget would forbid evicting the only ready pod;
- readiness follows the drain: the readiness probe asks the ``readiness`` service (NOT_SERVING
  from SIGTERM on) and liveness asks ``liveness`` (SERVING while draining, so the kubelet does not
  restart a draining pod);
- ``terminationGracePeriodSeconds`` exceeds ``--drain-timeout`` by a margin to stop in.
"""

from __future__ import annotations

from typing import Any

import pytest

from epp.cli import settings_from_args
from tests.deploy_rollout import disruptions_allowed, resolve, rollout
from tests.unit.test_deploy_active_active import build
from tests.unit.test_helm_chart import CHART_DIR, render, values

KUBE = CHART_DIR.parents[1] / "kubernetes"
STOP_MARGIN_S = 10  # after the drain: stopping the servers and background tasks
Doc = dict[str, Any]

VARIANTS = {
    "kustomize base": lambda: build(KUBE / "base"),
    "kustomize ha": lambda: build(KUBE / "ha"),
    "kustomize active-active": lambda: build(KUBE / "active-active"),
    "helm default": lambda: render(values("default")),
    "helm ha": lambda: render(values("ha")),
    "helm active-active": lambda: render(values("active-active")),
}


def _epp(docs: list[Doc]) -> tuple[Doc, Doc]:
    (deployment,) = [
        d for d in docs
        if d["kind"] == "Deployment"
        and any(c["name"] == "epp" for c in d["spec"]["template"]["spec"]["containers"])
    ]  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _leader_election(container: Doc) -> bool:
    args = [a for a in container["args"] if not a.startswith("--config-file")]
    return bool(settings_from_args(args).ha_enable_leader_election)


@pytest.fixture(params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    return request.param, VARIANTS[request.param]()


def test_a_rolling_update_finishes_and_keeps_a_ready_epp(variant: tuple[str, list[Doc]]) -> None:
    name, docs = variant
    deployment, container = _epp(docs)
    replicas = deployment["spec"]["replicas"]
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate", name
    surge = strategy["rollingUpdate"]["maxSurge"]
    unavailable = strategy["rollingUpdate"]["maxUnavailable"]
    leader_only = _leader_election(container)
    done = rollout(replicas, surge, unavailable, leader_only=leader_only)
    assert done.completed, (name, done.log)
    assert not done.leader_stopped_before_a_new_pod_existed, (name, done.log)
    if leader_only:
        assert done.fewest_ready >= 1, (name, done.log)
    else:
        assert unavailable == 0, name  # a new replica is ready before an old one stops
        assert done.fewest_ready == replicas, (name, done.log)


def test_maxunavailable_0_never_finishes_with_leader_election() -> None:
    # why the HA variants use 100%: the new pods wait for the lease, the controller for them
    stuck = rollout(2, 1, 0, leader_only=True)
    assert not stuck.completed and stuck.log[-1].startswith(f"pass {stuck.passes}: blocked")
    assert not rollout(2, 1, 1, leader_only=True).completed
    assert not rollout(2, "25%", "25%", leader_only=True).completed  # the controller's default
    assert rollout(2, 1, "100%", leader_only=True).completed


def test_a_node_drain_takes_one_epp_at_a_time_and_never_blocks(
    variant: tuple[str, list[Doc]],
) -> None:
    name, docs = variant
    deployment, container = _epp(docs)
    replicas = deployment["spec"]["replicas"]
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if _leader_election(container):
        # one ready pod (the leader): a budget keeping any pod would forbid evicting it for ever
        assert pdbs == [], name
        return
    if replicas == 1 and not pdbs:
        return  # one replica: a budget could only forbid the drain (the kustomize base)
    (pdb,) = pdbs
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"], name
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items(), name
    budget = {
        "max_unavailable": pdb["spec"].get("maxUnavailable"),
        "min_available": pdb["spec"].get("minAvailable"),
    }
    assert disruptions_allowed(replicas, replicas, **budget) >= 1, name  # never blocks
    if replicas > 1:
        assert disruptions_allowed(replicas - 1, replicas, **budget) == 0, name  # one at a time


def test_readiness_follows_the_drain_and_liveness_does_not(
    variant: tuple[str, list[Doc]],
) -> None:
    name, docs = variant
    _, container = _epp(docs)
    settings = settings_from_args([a for a in container["args"] if "--config-file" not in a])
    port = settings.grpc_health_port
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": "readiness"}, name
    assert container["livenessProbe"]["grpc"] == {"port": port, "service": "liveness"}, name
    assert container["readinessProbe"]["periodSeconds"] <= 5, name


def test_the_grace_period_outlasts_the_drain(variant: tuple[str, list[Doc]]) -> None:
    name, docs = variant
    deployment, container = _epp(docs)
    settings = settings_from_args([a for a in container["args"] if "--config-file" not in a])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert settings.drain_timeout > 0, name
    assert grace >= settings.drain_timeout + STOP_MARGIN_S, name


def test_percentages_round_as_kubernetes_rounds_them() -> None:
    assert resolve("25%", 2, round_up=True) == 1 and resolve("25%", 2, round_up=False) == 0
    assert resolve("100%", 3, round_up=False) == 3 and resolve(1, 3, round_up=False) == 1

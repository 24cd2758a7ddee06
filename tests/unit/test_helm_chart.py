"""deploy/helm/inference-epp: the chart renders with its defaults and with the HA and active-active
values (ci/*-values.yaml); every object parses and its references resolve (ServiceAccount,
ConfigMaps, Secrets, Roles, Service selectors and ports, the pool's EPP, the ServiceMonitor, the
PDB, the Redis the syncer points at); the EPP accepts the rendered flags and config; the alert
rules name only metrics the EPP registers. The renderer is ``tests/helm_render.py``; where ``helm``
is installed, ``helm template`` must print the same objects."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from epp.cli import settings_from_args
from epp.config.loader import LoadOptions, load_config
from epp.plugin.registry import PluginRegistry
from tests.builders import handle
from tests.epp_metric_names import epp_series_names, promql_metric_names
from tests.helm_render import Chart, TemplateError

CHART_DIR = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "inference-epp"
VALUE_SETS = ("default", "ha", "active-active")
Doc = dict[str, Any]


def values(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((CHART_DIR / "ci" / f"{name}-values.yaml").read_text()))


def render(overrides: dict[str, Any], namespace: str = "llm") -> list[Doc]:
    docs: list[Doc] = []
    for text in Chart(CHART_DIR).render(overrides, release="r1", namespace=namespace).values():
        docs += [d for d in yaml.safe_load_all(text) if d is not None]
    return docs


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    (doc,) = find(docs, kind, name)
    return doc


def epp_deployment(docs: list[Doc]) -> tuple[Doc, Doc]:
    (deployment,) = [
        d for d in find(docs, "Deployment")
        if any(c["name"] == "epp" for c in d["spec"]["template"]["spec"]["containers"])
    ]  # fmt: skip
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


@pytest.fixture(params=VALUE_SETS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    return request.param, render(values(request.param))


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}


def test_every_object_parses_when_rendered(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    assert docs
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == "llm"
    keys = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), keys


def _pod_refs(pod: Doc) -> tuple[set[str], set[str]]:
    """The ConfigMaps and Secrets a pod spec names (volumes and env)."""
    configmaps = {v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
    secrets = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for container in pod["containers"]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                secrets.add(ref["name"])
    return configmaps, secrets


def test_references_resolve_when_rendered(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for deployment in find(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        if "serviceAccountName" in pod:
            assert ("ServiceAccount", pod["serviceAccountName"]) in names
        configmaps, secrets = _pod_refs(pod)
        assert {("ConfigMap", c) for c in configmaps} <= names
        assert {("Secret", s) for s in secrets} <= names
        for container in pod["containers"]:
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in pod.get("volumes", [])}
    for binding in find(docs, "RoleBinding"):
        assert ("Role", binding["roleRef"]["name"]) in names
        for subject in binding["subjects"]:
            assert ("ServiceAccount", subject["name"]) in names
    for service in find(docs, "Service"):
        _check_service(docs, service)


def _check_service(docs: list[Doc], service: Doc) -> None:
    """The Service selects exactly one Deployment's pods, and its target ports are theirs."""
    (target,) = [
        d for d in find(docs, "Deployment")
        if matches(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
    ]  # fmt: skip
    ports = [p for c in target["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
    for port in service["spec"]["ports"]:
        (container_port,) = [
            p for p in ports if port["targetPort"] in (p["name"], p["containerPort"])
        ]
        assert container_port["containerPort"] == port["port"]


def test_the_pool_points_at_the_epp_service_when_rendered(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    pool = one(docs, "InferencePool", "vllm-pool")
    assert pool["spec"]["selector"]["matchLabels"] == {"app": "vllm"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["appProtocol"] == "http"
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["failureMode"] == "FailOpen"
    service = one(docs, "Service", ref["name"])
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    deployment, container = epp_deployment(docs)
    if any(a.startswith("--ha-enable-leader-election") for a in container["args"]):
        return  # no budget with leader election (tests/unit/test_deploy_day2.py says why)
    pdb = one(docs, "PodDisruptionBudget", deployment["metadata"]["name"])
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def _settings(docs: list[Doc], tmp_path: Path) -> Any:
    _, container = epp_deployment(docs)
    args = list(container["args"])
    for i, arg in enumerate(args):
        if arg.startswith("--config-file="):
            (configmap,) = find(docs, "ConfigMap")
            path = tmp_path / "config.yaml"
            path.write_text(configmap["data"]["config.yaml"])
            args[i] = f"--config-file={path}"
    return settings_from_args(args)


def _pipeline(settings: Any) -> Any:
    return load_config(
        settings.config_text,
        registry=PluginRegistry.from_entry_points(),
        handle_for=handle,
        options=LoadOptions(),
    )


def test_epp_accepts_the_rendered_flags_and_config(
    rendered: tuple[str, list[Doc]], tmp_path: Path
) -> None:
    name, docs = rendered
    settings = _settings(docs, tmp_path)
    assert (settings.pool_name, settings.pool_namespace) == ("vllm-pool", "llm")
    assert (settings.grpc_port, settings.grpc_health_port, settings.metrics_port) == (
        9002,
        9003,
        9090,
    )
    assert settings.ha_enable_leader_election is (name == "ha")
    pipeline = _pipeline(settings)
    assert pipeline.discovery is None  # endpoints come from the InferencePool
    assert (pipeline.syncer is not None) is (name == "active-active")


def test_defaults_run_the_builtin_config_with_one_replica() -> None:
    docs = render(values("default"))
    deployment, container = epp_deployment(docs)
    assert not find(docs, "ConfigMap")
    assert not any(a.startswith("--config-file") for a in container["args"])
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "DestinationRule", "Secret"}


def test_ha_values_elect_a_leader_with_lease_rbac(tmp_path: Path) -> None:
    docs = render(values("ha"))
    deployment, container = epp_deployment(docs)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--emit-endpoint-scores=True" in container["args"] or (
        "--emit-endpoint-scores=true" in container["args"]
    )
    leases = one(docs, "Role", "vllm-pool-epp-leases")
    assert leases["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]}
    ]  # fmt: skip
    settings = _settings(docs, tmp_path)
    assert settings.emit_endpoint_scores is True
    assert (settings.ha_lease_duration, settings.ha_renew_deadline) == (15.0, 10.0)
    rule = one(docs, "DestinationRule")
    assert rule["spec"]["host"] == "vllm-pool-epp.llm.svc.cluster.local"
    (port,) = rule["spec"]["trafficPolicy"]["portLevelSettings"]
    assert port["port"]["number"] == 9002
    assert port["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    assert rule["spec"]["trafficPolicy"]["connectionPool"]["http"] == {
        "maxRequestsPerConnection": 256000
    }


def test_active_active_values_share_state_through_the_charts_redis() -> None:
    docs = render(values("active-active"))
    deployment, container = epp_deployment(docs)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert not any("leader-election" in a for a in container["args"])
    assert not find(docs, "Role", "vllm-pool-epp-leases")
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    (syncer,) = config["plugins"]
    assert config["dataLayer"]["crossReplicaSyncerPluginRef"] == syncer["type"] == "redis-syncer"
    url = urlsplit(syncer["parameters"]["url"])
    service = one(docs, "Service", url.hostname)
    assert (url.port or 6379) in [p["port"] for p in service["spec"]["ports"]]
    # The password: the syncer reads the file the Secret is mounted as; Redis requires it.
    secret = one(docs, "Secret", "vllm-pool-epp-redis")
    assert secret["stringData"] == {"password": "change-me"}
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["redis-password"]
    assert syncer["parameters"]["passwordFile"] == f"{mount}/password"
    redis = one(docs, "Deployment", url.hostname)
    assert "--requirepass" in redis["spec"]["template"]["spec"]["containers"][0]["args"]
    policy = one(docs, "NetworkPolicy")
    (rule,) = policy["spec"]["ingress"]
    assert matches(
        rule["from"][0]["podSelector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"],
    )


def test_an_external_redis_and_an_own_config_are_used_as_given(tmp_path: Path) -> None:
    own = (CHART_DIR.parents[2] / "deploy/kubernetes/active-active/configmap.yaml").read_text()
    inline = yaml.safe_load(own)["data"]["config.yaml"]
    overrides = values("active-active")
    overrides["activeActive"] = {
        "enabled": True, "redis": {"create": False, "url": "rediss://redis.shared:6380/0"}
    }  # fmt: skip
    overrides["config"] = {"inline": inline}
    docs = render(overrides)
    assert not find(docs, "NetworkPolicy") and not find(docs, "Secret")
    assert [d["metadata"]["name"] for d in find(docs, "Deployment")] == ["vllm-pool-epp"]
    assert one(docs, "ConfigMap")["data"]["config.yaml"].strip() == inline.strip()
    assert _pipeline(_settings(docs, tmp_path)).syncer is not None
    # Without a config of the user's, the chart writes the syncer's url: it must be given.
    overrides["activeActive"]["redis"]["url"] = ""
    overrides["config"] = {"inline": ""}
    with pytest.raises(TemplateError, match=r"activeActive\.redis\.url is required"):
        render(overrides)


def test_an_existing_configmap_is_mounted_by_name() -> None:
    overrides = values("default")
    overrides["config"] = {"existingConfigMap": "my-epp-config", "existingConfigMapKey": "epp.yaml"}
    docs = render(overrides)
    deployment, container = epp_deployment(docs)
    assert not find(docs, "ConfigMap")
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"] == {
        "name": "my-epp-config", "items": [{"key": "epp.yaml", "path": "config.yaml"}]
    }  # fmt: skip
    assert "--config-file=/etc/epp/config.yaml" in container["args"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"ha": {"leaderElection": True}, "activeActive": {"enabled": True}},
            "exclude each other",
            id="ha-and-active-active",
        ),
        pytest.param({}, "selector", id="no-selector"),  # the chart's own defaults alone
    ],
)
def test_values_that_cannot_work_fail_to_render(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        render(overrides)


def test_alert_rules_name_only_metrics_the_epp_registers() -> None:
    docs = render(values("active-active"))
    rules = one(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
    alerts = {r["alert"] for r in rules}
    assert {
        "EPPNoReadyEndpoints", "EPPModelServerScrapeErrors", "EPPQueueSaturated",
        "EPPRequestsRejected", "EPPStaleEndpointMetrics", "EPPSharedStateLagging",
    } <= alerts  # fmt: skip
    known = epp_series_names() | {"up"}
    for rule in rules:
        names = promql_metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= known, (rule["alert"], names - known)
        assert 'job="vllm-pool-epp", namespace="llm"' in rule["expr"]
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service", "vllm-pool-epp")
    assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_template_prints_the_same_objects(name: str) -> None:
    done = subprocess.run(
        ["helm", "template", "r1", str(CHART_DIR), "--namespace", "llm",
         "-f", str(CHART_DIR / "ci" / f"{name}-values.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    helm_docs = [d for d in yaml.safe_load_all(done.stdout) if d is not None]

    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted(helm_docs, key=key) == sorted(render(values(name)), key=key)


def test_renderer_rejects_what_helm_would_render_silently_or_differently(tmp_path: Path) -> None:
    chart = tmp_path / "c"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: c\nversion: 1.0.0\nappVersion: '1'\n")
    (chart / "values.yaml").write_text("a: {b: 1}\nflags: {y: 2, x: true}\n")
    (chart / "templates" / "t.yaml").write_text(
        'k: {{- range $k, $v := .Values.flags }} {{ $k }}={{ $v }}{{ end }} {{ "}}" | quote }}\n'
    )
    assert Chart(chart).render()["t.yaml"] == 'k: x=true y=2 "}}"\n'
    (chart / "templates" / "t.yaml").write_text("k: {{ .Values.a.c }}\n")
    with pytest.raises(TemplateError, match="no key 'c'"):
        Chart(chart).render()


@pytest.mark.parametrize("name", ["ha", "active-active"])
def test_chart_expresses_the_kustomize_overlay_of_the_same_name(name: str) -> None:
    from tests.unit.test_deploy_active_active import build

    kustomized = build(CHART_DIR.parents[1] / "kubernetes" / name)
    overrides = values(name)
    overrides["activeActive"] = {**overrides.get("activeActive", {}), "redis": {"password": ""}}
    charted = render(overrides, namespace="llm")
    k_deploy, k_epp = epp_deployment(kustomized)
    c_deploy, c_epp = epp_deployment(charted)
    assert c_deploy["spec"]["replicas"] >= k_deploy["spec"]["replicas"]
    assert c_deploy["spec"]["strategy"]["type"] == k_deploy["spec"]["strategy"]["type"]
    for key in ("livenessProbe", "readinessProbe", "securityContext", "resources", "ports"):
        assert c_epp[key] == k_epp[key], key
    flag_names = {a.split("=")[0] for a in c_epp["args"]}
    assert {a.split("=")[0] for a in k_epp["args"]} <= flag_names

    def rules(docs: list[Doc]) -> list[Any]:
        return sorted(yaml.safe_dump(r) for role in find(docs, "Role") for r in role["rules"])

    assert rules(charted) == rules(kustomized)
    if name == "active-active":
        assert c_deploy["spec"]["strategy"] == k_deploy["spec"]["strategy"]
        k_redis, c_redis = (
            one(docs, "Deployment", "vllm-pool-epp-redis")["spec"]["template"]["spec"]
            for docs in (kustomized, charted)
        )
        assert c_redis["containers"][0]["args"] == k_redis["containers"][0]["args"]
        assert c_redis["securityContext"] == k_redis["securityContext"]


def test_metrics_auth_lets_the_epp_review_tokens_and_a_scraper_read(
    rendered: tuple[str, list[Doc]],
) -> None:
    _, docs = rendered
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    (epp,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["spec"]["template"]["spec"].get("serviceAccountName")
    ]
    args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metrics-endpoint-auth=true" in args
    reviewer = [d for (k, _), d in by_key.items() if k == "ClusterRole" and "auth-reviewer" in _]
    assert len(reviewer) == 1
    resources = {r for rule in reviewer[0]["rules"] for r in rule["resources"]}
    assert resources == {"tokenreviews", "subjectaccessreviews"}
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == reviewer[0]["metadata"]["name"]
    (subject,) = binding["subjects"]
    sa = epp["spec"]["template"]["spec"]["serviceAccountName"]
    assert (subject["name"], subject["namespace"]) == (sa, "llm")
    reader = [d for (k, n), d in by_key.items() if k == "ClusterRole" and "metrics-reader" in n]
    assert reader[0]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]

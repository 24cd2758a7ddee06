"""deploy/kubernetes/active-active: several EPP replicas without leader election, sharing state
through the Redis of the overlay. The overlay is built here by applying its patches the way
kustomize does (``build``; checked against ``kubectl kustomize`` where kubectl is installed), then
the EPP's own flag parser and config loader read the result. The commented password example is
checked too, uncommented."""

from __future__ import annotations

import copy
import re
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
from tests.unit.test_deploy import KUBE

OVERLAY = KUBE / "active-active"
SYNC_KEYS = ("crossReplicaSyncerPluginRef", "crossReplicaSyncInterval")
_NOTE = re.compile(r"^(\s*)# \(password\)")


def uncomment_password(text: str) -> str:
    """The lines after each ``# (password)`` note, at the note's indentation, without their
    ``# `` (the overlay's instructions for a password-protected Redis)."""
    out: list[str] = []
    indent: str | None = None
    for line in text.splitlines():
        note = _NOTE.match(line)
        if note:
            indent = note.group(1)
        elif indent is not None and line.startswith(indent + "# "):
            line = indent + line[len(indent) + 2 :]
        else:
            indent = None
        out.append(line)
    return "\n".join(out) + "\n"


def _read(path: Path, password: bool) -> str:
    text = path.read_text()
    return uncomment_password(text) if password else text


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """RFC 6902 ``add`` / ``replace`` / ``remove`` (what the overlays use)."""
    for op in ops:
        *parents, last = op["path"].lstrip("/").split("/")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list) and last == "-":
            node.append(op["value"])
        elif isinstance(node, list) and op["op"] == "add":
            node.insert(int(last), op["value"])
        else:
            assert op["op"] in ("add", "replace"), op
            node[int(last) if isinstance(node, list) else last] = op["value"]


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """A strategic merge of maps (lists are replaced: the overlays patch no keyed lists)."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def build(folder: Path, *, password: bool = False) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize <folder>`` prints: resources (files and bases), then the
    kustomization's ``labels`` (metadata only), then its patches."""
    kustomization = yaml.safe_load(_read(folder / "kustomization.yaml", password))
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            docs += build(path, password=password)
        else:
            docs += [d for d in yaml.safe_load_all(_read(path, password)) if d is not None]
    for label in kustomization.get("labels", []):
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(label["pairs"])
    for patch in kustomization.get("patches", []):
        if "path" in patch:
            merge = yaml.safe_load(_read(folder / patch["path"], password))
            _merge(_find(docs, merge["kind"], merge["metadata"]["name"]), merge)
        else:
            target = _find(docs, patch["target"]["kind"], patch["target"]["name"])
            _json_patch(target, yaml.safe_load(patch["patch"]))
    return docs


def _by_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _epp(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = _find(docs, "Deployment", "vllm-pool-epp")
    (epp,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    return deployment, epp


def _config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    text = _find(docs, "ConfigMap", "vllm-pool-epp-config")["data"]["config.yaml"]
    return dict(yaml.safe_load(text))


def _load(docs: list[dict[str, Any]]) -> Any:
    text = _find(docs, "ConfigMap", "vllm-pool-epp-config")["data"]["config.yaml"]
    registry = PluginRegistry.from_entry_points()
    return load_config(text, registry=registry, handle_for=handle, options=LoadOptions())


def _syncer_params(config: dict[str, Any]) -> dict[str, Any]:
    ref = config["dataLayer"]["crossReplicaSyncerPluginRef"]
    (plugin,) = [p for p in config["plugins"] if p.get("name", p["type"]) == ref]
    assert plugin["type"] == "redis-syncer"
    return dict(plugin["parameters"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("password", [False, True], ids=["as-shipped", "password-uncommented"])
def test_overlay_builds_like_kustomize_when_kubectl_is_installed(
    password: bool, tmp_path: Path
) -> None:
    shutil.copytree(KUBE / "base", tmp_path / "base")
    (tmp_path / OVERLAY.name).mkdir()
    for path in OVERLAY.iterdir():
        (tmp_path / OVERLAY.name / path.name).write_text(_read(path, password))
    done = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / OVERLAY.name)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kustomized = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    assert _by_name(kustomized) == _by_name(build(OVERLAY, password=password))


def test_epp_runs_replicas_rolling_without_leader_election_when_deployed(tmp_path: Path) -> None:
    docs = build(OVERLAY)
    deployment, epp = _epp(docs)
    assert deployment["spec"]["replicas"] >= 2
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0  # a new replica is ready first
    assert not any("leader-election" in a for a in epp["args"])
    assert epp["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    pdb = _find(docs, "PodDisruptionBudget", "vllm-pool-epp")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    config = tmp_path / "config.yaml"
    config.write_text(_find(docs, "ConfigMap", "vllm-pool-epp-config")["data"]["config.yaml"])
    args = [f"--config-file={config}" if a.startswith("--config-file=") else a for a in epp["args"]]
    settings = settings_from_args(args)
    assert settings.ha_enable_leader_election is False
    assert settings.pool_name == "vllm-pool"


def test_config_is_the_base_config_plus_the_redis_syncer_when_loaded() -> None:
    docs = build(OVERLAY)
    config = _config(docs)
    assert config["dataLayer"]["crossReplicaSyncerPluginRef"] == "redis-syncer"
    assert config["dataLayer"]["crossReplicaSyncInterval"] == "200ms"
    pipeline = _load(docs)
    assert pipeline.syncer is not None
    assert pipeline.syncer.typed_name.type == "redis-syncer"
    assert pipeline.sync_interval == pytest.approx(0.2)
    assert pipeline.discovery is None  # endpoints still come from the InferencePool
    # Take the syncer away and the base config remains, unchanged.
    stripped = copy.deepcopy(config)
    stripped["plugins"] = [p for p in stripped["plugins"] if p["type"] != "redis-syncer"]
    for key in SYNC_KEYS:
        del stripped["dataLayer"][key]
    assert stripped == _config(build(KUBE / "base"))


def test_redis_service_answers_at_the_syncer_url_when_deployed() -> None:
    docs = build(OVERLAY)
    url = urlsplit(_syncer_params(_config(docs))["url"])
    assert url.scheme == "redis"
    service = _find(docs, "Service", str(url.hostname))
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == (url.port or 6379)]
    redis = _find(docs, "Deployment", str(url.hostname))
    pod = redis["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert port["targetPort"] in [p["containerPort"] for p in container["ports"]]
    assert container["image"].startswith("redis:7")
    args = container["args"]
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"
    assert "--maxmemory" in args and "--maxmemory-policy" in args
    assert redis["spec"]["replicas"] == 1
    assert {"requests", "limits"} <= container["resources"].keys()
    assert container["readinessProbe"] and container["livenessProbe"]
    policy = _find(docs, "NetworkPolicy", str(url.hostname))
    assert policy["spec"]["podSelector"]["matchLabels"] == service["spec"]["selector"]
    (allowed,) = policy["spec"]["ingress"]
    epp_labels = _epp(docs)[0]["spec"]["template"]["metadata"]["labels"]
    assert allowed["from"][0]["podSelector"]["matchLabels"].items() <= epp_labels.items()
    assert allowed["ports"][0]["port"] == port["targetPort"]


def test_password_example_is_consistent_when_uncommented() -> None:
    docs = build(OVERLAY, password=True)
    params = _syncer_params(_config(docs))
    deployment, epp = _epp(docs)
    (mount,) = [m for m in epp["volumeMounts"] if m["name"] == "redis-password"]
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == "redis-password"]  # fmt: skip
    (item,) = volume["secret"]["items"]
    assert params["passwordFile"] == f"{mount['mountPath']}/{item['path']}"
    (redis,) = _find(docs, "Deployment", "vllm-pool-epp-redis")["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    secret = {"name": volume["secret"]["secretName"], "key": item["key"]}
    assert env == {"REDIS_PASSWORD": secret, "REDISCLI_AUTH": secret}
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert _load(docs).syncer is not None
    assert build(OVERLAY) != docs  # the example is really commented out by default

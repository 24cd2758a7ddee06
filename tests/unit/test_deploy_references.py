"""Every kustomize folder under deploy/kubernetes renders (``kubectl kustomize``), and inside each
rendering every reference resolves: a pod template's volume mounts name its volumes, its config
map and secret volumes (and env references) name objects of the rendering, its service account
exists, and role bindings bind existing roles to existing service accounts. A manifest an API
server would reject, or a pod that would never start, fails here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
FOLDERS = sorted(p.parent.name for p in KUBE.glob("*/kustomization.yaml"))
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}


def render(folder: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations")
    out = subprocess.run(
        [kubectl, "kustomize", str(KUBE / folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _names(docs: list[dict[str, Any]], kind: str) -> set[str]:
    return {d["metadata"]["name"] for d in docs if d["kind"] == kind}


def _pod_references(pod: dict[str, Any]) -> dict[str, set[str]]:
    """What a pod spec refers to, by kind (``volume`` = names of its own volumes)."""
    refs: dict[str, set[str]] = {"volume": set(), "ConfigMap": set(), "Secret": set()}
    refs["ServiceAccount"] = {pod.get("serviceAccountName", "default")}
    for container in pod.get("initContainers", []) + pod["containers"]:
        refs["volume"] |= {m["name"] for m in container.get("volumeMounts", [])}
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "configMapKeyRef" in source:
                refs["ConfigMap"].add(source["configMapKeyRef"]["name"])
            if "secretKeyRef" in source:
                refs["Secret"].add(source["secretKeyRef"]["name"])
        for env_from in container.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in env_from:
                    refs[kind].add(env_from[key]["name"])
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            refs["ConfigMap"].add(volume["configMap"]["name"])
        if "secret" in volume:
            refs["Secret"].add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                refs["ConfigMap"].add(source["configMap"]["name"])
            if "secret" in source:
                refs["Secret"].add(source["secret"]["name"])
    return refs


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_reference_resolves_when_the_folder_is_rendered(folder: str) -> None:
    docs = render(folder)
    assert docs
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        where = f"{doc['kind']} {doc['metadata']['name']}"
        pod = doc["spec"]["template"]["spec"]
        refs = _pod_references(pod)
        defined = {v["name"] for v in pod.get("volumes", [])}
        assert refs["volume"] <= defined, f"{where}: undefined volumes {refs['volume'] - defined}"
        for kind in ("ConfigMap", "Secret", "ServiceAccount"):
            missing = (
                refs[kind]
                - _names(docs, kind)
                - ({"default"} if kind == "ServiceAccount" else set())
            )
            assert not missing, f"{where}: {kind} {sorted(missing)} not in the rendering"
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        role = binding["roleRef"]
        assert role["name"] in _names(docs, role["kind"]), binding["metadata"]["name"]
        for subject in binding.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                assert subject["name"] in _names(docs, "ServiceAccount"), subject

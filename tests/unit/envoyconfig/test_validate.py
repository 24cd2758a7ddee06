"""Every output of ``epp envoy-config`` passes the real Envoy's ``--mode validate``: whole
bootstraps in each TLS mode, body mode and fail-open choice, YAML and JSON, the filter and
cluster parts inside a user's own listener, and the Istio EnvoyFilter's patches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from epp.envoyconfig.cli import main
from epp.server.tls import self_signed
from tests.unit.envoyconfig.validate import validate, wrap

pytestmark = [pytest.mark.envoy]
EPP = ["--epp-address", "127.0.0.1:9002"]


def generate(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main([*args]) == 0
    return capsys.readouterr().out


@pytest.fixture
def certs(tmp_path: Path) -> list[str]:
    cert, key = self_signed("epp")
    (tmp_path / "ca.pem").write_bytes(cert)
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    return ["--ca-file", str(tmp_path / "ca.pem"), "--sni", "epp"]


BOOTSTRAPS = {
    "full-duplex-tls": [*EPP],
    "full-duplex-plaintext": [*EPP, "--tls", "plaintext"],
    "full-duplex-replicas": [
        *EPP,
        "--epp-address",
        "10.0.0.2:9002",
        "--max-streams-per-connection",
        "4",
    ],
    "full-duplex-dns-no-lua": ["--epp-address", "epp.llm.svc:9002", "--no-report-served"],
    "buffered": [*EPP, "--body", "buffered"],
    "buffered-fail-open": [
        *EPP,
        "--body",
        "buffered",
        "--fail-open",
        "--fallback",
        "10.0.0.9:8000",
        "--fallback",
        "models.llm.svc:8000",
    ],
    "streamed": [*EPP, "--body", "streamed"],
    "streamed-fail-open": [*EPP, "--body", "streamed", "--fail-open", "--fallback", "m:8000"],
    "json": [*EPP, "--format", "json", "--message-timeout", "2", "--route-timeout", "60"],
    "known-pool": [*EPP, "--pool-endpoint", "10.0.0.7:8000", "--pool-endpoint", "10.0.0.8:8000"],
    "known-pool-dns-no-retries": [*EPP, "--pool-endpoint", "models.llm:8000", "--retries", "0"],
    "h2c-model-servers": [*EPP, "--app-protocol", "h2c"],
    "h2c-known-pool-fail-open": [
        *EPP,
        "--app-protocol",
        "h2c",
        "--pool-endpoint",
        "10.0.0.7:8000",
        "--body",
        "buffered",
        "--fail-open",
        "--fallback",
        "10.0.0.9:8000",
    ],
    "known-pool-health-checked": [
        *EPP,
        "--pool-endpoint",
        "10.0.0.7:8000",
        "--pool-health-path",
        "/health",
    ],
}


@pytest.mark.parametrize("args", BOOTSTRAPS.values(), ids=BOOTSTRAPS.keys())
def test_bootstrap_passes_envoy_validate(
    args: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    validate(generate(capsys, *args), tmp_path / "envoy.yaml")


@pytest.mark.parametrize("mode", ["tls", "mtls"])
def test_tls_and_mtls_with_certificate_files_pass_envoy_validate(
    mode: str, certs: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    client = ["--cert-file", str(tmp_path / "tls.crt"), "--key-file", str(tmp_path / "tls.key")]
    text = generate(capsys, *EPP, "--tls", mode, *certs, *(client if mode == "mtls" else []))
    tls = yaml.safe_load(text)["static_resources"]["clusters"][-1]["transport_socket"]
    common = tls["typed_config"]["common_tls_context"]
    assert common["validation_context"]["trusted_ca"]["filename"].endswith("ca.pem")
    assert ("tls_certificates" in common) == (mode == "mtls")
    validate(text, tmp_path / "envoy.yaml")


@pytest.mark.parametrize("body", ["full-duplex", "buffered"])
def test_filter_and_clusters_parts_pass_inside_a_users_listener(
    body: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    filters = yaml.safe_load(generate(capsys, *EPP, "--body", body, "--part", "filter"))
    clusters = yaml.safe_load(generate(capsys, *EPP, "--body", body, "--part", "clusters"))
    assert filters[0]["name"] == "envoy.filters.http.ext_proc"
    assert {c["name"] for c in clusters} == {"epp", "pool"}
    validate(wrap(filters, clusters), tmp_path / "envoy.yaml")


def test_istio_envoyfilter_patches_pass_as_envoy_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = yaml.safe_load(
        generate(
            capsys, *EPP, "--istio", "-n", "llm", "--selector", "app=gw", "--istio-route", "models"
        )
    )
    assert (doc["kind"], doc["metadata"]["namespace"]) == ("EnvoyFilter", "llm")
    assert doc["spec"]["workloadSelector"] == {"labels": {"app": "gw"}}
    patches = doc["spec"]["configPatches"]
    filters = [p["patch"]["value"] for p in patches if p["applyTo"] == "HTTP_FILTER"]
    clusters = [p["patch"]["value"] for p in patches if p["applyTo"] == "CLUSTER"]
    route = next(p for p in patches if p["applyTo"] == "HTTP_ROUTE")
    retry = {"retry_on": "connect-failure,refused-stream,reset", "num_retries": 2}
    assert route["patch"]["value"] == {"route": {"cluster": "pool", "retry_policy": retry}}
    assert all(
        p["patch"]["operation"] == "INSERT_BEFORE" for p in patches if p["applyTo"] == "HTTP_FILTER"
    )
    validate(wrap(filters, clusters), tmp_path / "envoy.yaml")


def test_validate_rejects_what_envoy_rejects(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The check has teeth: full-duplex without trailers is a config Envoy refuses."""
    doc = json.loads(generate(capsys, *EPP, "--format", "json"))
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"][0]["typed_config"]["processing_mode"]["request_trailer_mode"] = "SKIP"
    with pytest.raises(AssertionError, match="FULL_DUPLEX_STREAMED"):
        validate(json.dumps(doc), tmp_path / "envoy.json")

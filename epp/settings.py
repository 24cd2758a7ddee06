"""Runtime options of one EPP, filled from the command line (``epp.cli``) or by tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    grpc_port: int = 9002
    """ext_proc port (0 = any free port; tests use that)."""
    grpc_health_port: int = 9003
    metrics_port: int = 9090
    bind_address: str = "0.0.0.0"
    """Our addition: where the servers listen (upstream listens on every address)."""
    config_text: str | None = None
    """EndpointPickerConfig YAML; ``None`` = the built-in default config."""
    pool_name: str = ""
    pool_namespace: str = ""
    pool_group: str = "inference.networking.k8s.io"
    endpoint_selector: str = ""
    endpoint_target_ports: tuple[int, ...] = ()
    pod_name: str = ""
    """``$POD_NAME``: in standalone mode the pool is named after this pod's Deployment."""
    kubeconfig: str = ""
    """``--kubeconfig`` (controller-runtime's flag); empty = $KUBECONFIG, in-cluster, ~/.kube."""
    kube_watch_timeout: int = 300
    """Our addition: server-side timeout of each Kubernetes watch call, in seconds."""
    objectives_files: tuple[str, ...] = ()
    """Our addition (``--objectives-file``): YAML files of InferenceObjective and
    InferenceModelRewrite objects, in every mode."""
    objectives_poll_interval: float = 1.0
    """Our addition: how often the objectives files are checked for changes."""
    ha_enable_leader_election: bool = False
    ha_lease_duration: float = 15.0
    """Our addition (``--ha-lease-duration``); upstream's fixed controller-runtime default."""
    ha_renew_deadline: float = 10.0
    ha_retry_period: float = 2.0
    secure_serving: bool = True
    cert_path: str = ""
    refresh_metrics_interval: float = 0.05
    """Seconds between scrapes of one endpoint; below 50 ms is clamped to 50 ms."""
    refresh_prometheus_metrics_interval: float = 5.0
    metrics_staleness_threshold: float = 2.0
    drain_timeout: float = 30.0
    grpc_max_recv_msg_size: int = 64 << 20
    grpc_max_send_msg_size: int = 64 << 20
    max_request_body_bytes: int = 64 << 20
    """Our addition (``--max-request-body-bytes``): larger bodies are answered with a 413."""
    emit_endpoint_scores: bool = False
    disable_endpoint_subset_filter: bool = False
    allow_experimental_plugins: bool = False
    health_checking: bool = False
    verbosity: int = 2
    log_json: bool = False
    seed: int | None = None
    """Our addition: seeds the scheduler's random source (reproducible tie-breaks in tests)."""

"""Kubernetes mode as the command line asks for it: the pool source and the leader elector.

``--pool-name`` watches that InferencePool (only ``inference.networking.k8s.io``, v1);
``--endpoint-selector`` with ``--endpoint-target-ports`` builds a standalone pool named after
this pod's Deployment. ``--ha-enable-leader-election`` adds a Lease elector. The ``kubernetes``
client is imported only here, so it is never loaded outside Kubernetes mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from epp.config.loader import ConfigError
from epp.k8s.client import KubeConfigError, KubeLeases, load_api_client
from epp.k8s.leader import ElectionConfig, LeaderElector, default_identity, lease_name
from epp.k8s.sink import ObjectSink
from epp.k8s.source import KubernetesSource, PoolMode, StandaloneMode, standalone_pool
from epp.plugin import AppProtocols, Endpoint, Parser
from epp.plugin.selectors import parse_selector


class KubeSettings(Protocol):
    """The command-line options Kubernetes mode reads (``epp.settings.Settings`` has them)."""

    @property
    def pool_name(self) -> str: ...

    @property
    def pool_namespace(self) -> str: ...

    @property
    def pool_group(self) -> str: ...

    @property
    def endpoint_selector(self) -> str: ...

    @property
    def endpoint_target_ports(self) -> tuple[int, ...]: ...

    @property
    def pod_name(self) -> str: ...

    @property
    def kubeconfig(self) -> str: ...

    @property
    def kube_watch_timeout(self) -> int: ...

    @property
    def ha_enable_leader_election(self) -> bool: ...

    @property
    def ha_lease_duration(self) -> float: ...

    @property
    def ha_renew_deadline(self) -> float: ...

    @property
    def ha_retry_period(self) -> float: ...


def kubernetes_mode(
    settings: KubeSettings,
    *,
    publish: Callable[[Sequence[Endpoint]], None],
    sink: ObjectSink,
    parsers: Sequence[Parser] = (),
    gates: Mapping[str, bool] | None = None,
) -> tuple[KubernetesSource, LeaderElector | None]:
    """The pool source and, when asked for, the elector; ``ConfigError`` says what is wrong.
    Readiness checks the pool's ``appProtocol`` against the ``parsers`` (``AppProtocols``).
    With the elector and the feature gate ``haPopulateNonLeaderDatastore=false`` in ``gates``,
    the watches run only while this replica leads (``KubernetesSource.leading``)."""
    s = settings
    namespace = s.pool_namespace or "default"
    mode, pool_name = _pool_mode(s, namespace)
    try:
        api = load_api_client(s.kubeconfig)
    except KubeConfigError as exc:
        raise ConfigError(str(exc)) from None
    source = KubernetesSource(
        api,
        mode,
        publish=publish,
        sink=sink,
        watch_timeout=s.kube_watch_timeout,
        logger=logging.getLogger("epp.k8s"),
        parser_protocols={
            str(p.typed_name): p.app_protocols() for p in parsers if isinstance(p, AppProtocols)
        },
    )
    if not s.ha_enable_leader_election:
        return source, None
    try:
        cfg = ElectionConfig(
            lease_name=lease_name(namespace, pool_name),
            namespace=namespace,
            identity=default_identity(),
            lease_duration=s.ha_lease_duration,
            renew_deadline=s.ha_renew_deadline,
            retry_period=s.ha_retry_period,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    leases = KubeLeases(api, namespace, timeout=s.ha_renew_deadline)
    elector = LeaderElector(leases, cfg, logger=logging.getLogger("epp.k8s.leader"))
    if not (gates or {}).get("haPopulateNonLeaderDatastore", True):
        source.leading = (elector.is_leader, cfg.retry_period)
    return source, elector


def _pool_mode(s: KubeSettings, namespace: str) -> tuple[PoolMode | StandaloneMode, str]:
    if s.pool_name:
        if s.pool_group != "inference.networking.k8s.io":
            raise ConfigError(
                f"--pool-group {s.pool_group!r}: only inference.networking.k8s.io (v1) is supported"
            )
        return PoolMode(name=s.pool_name, namespace=namespace, group=s.pool_group), s.pool_name
    try:
        selector = parse_selector(s.endpoint_selector)
    except ValueError as exc:
        raise ConfigError(f"--endpoint-selector: {exc}") from None
    if not s.endpoint_target_ports:
        raise ConfigError("--endpoint-selector needs --endpoint-target-ports")
    pool = standalone_pool(selector, s.endpoint_target_ports, namespace, s.pod_name)
    return StandaloneMode(pool), pool.name

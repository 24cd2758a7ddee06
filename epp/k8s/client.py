"""The ``kubernetes`` client, wrapped: configuration loading, list/watch targets, discovery.

Objects stay raw JSON dicts end to end (``_preload_content=False`` on lists, ``Watch`` with
``return_type="object"`` on watches): the client's model classes would reject or reshape objects
the EPP only needs a few fields of, and decoding is ours (``DecodeError`` → log and skip).

Configuration, in the order controller-runtime uses: ``--kubeconfig``, ``$KUBECONFIG``, the
in-cluster service account, ``~/.kube/config``. Each ``ApiClient`` gets its own
``Configuration`` (no process-wide default is touched), so two Apps can share a process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from kubernetes import client
from kubernetes import config as _config
from kubernetes import watch as _watch
from kubernetes.client.exceptions import ApiException

from epp.k8s.leader import Conflict
from epp.k8s.watch import Gone

# The client's config and watch modules carry no type hints.
config: Any = _config
watch: Any = _watch

CONNECT_TIMEOUT: Final = 5.0
READ_TIMEOUT: Final = 30.0
"""Seconds a list or a lease call may take."""
WATCH_READ_SLACK: Final = 30.0
"""A watch whose server-side timeout passed this long ago is presumed dead."""


class KubeConfigError(RuntimeError):
    """No usable cluster configuration."""


def load_api_client(kubeconfig: str = "") -> client.ApiClient:
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    try:
        if path:
            config.load_kube_config(config_file=path, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        elif (Path.home() / ".kube" / "config").is_file():
            config.load_kube_config(client_configuration=cfg)
        else:
            raise KubeConfigError(
                "Kubernetes mode: no cluster configuration (use --kubeconfig, $KUBECONFIG, "
                "or run in a pod with a service account)"
            )
    except (config.ConfigException, OSError, ValueError) as exc:
        raise KubeConfigError(
            f"Kubernetes mode: cannot load the cluster configuration: {exc}"
        ) from None
    return client.ApiClient(cfg)


def _json(response: Any) -> Any:
    return json.loads(response.data)


class KubeResource:
    """A ``WatchTarget`` for one namespaced resource (core pods or a custom resource)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        field_selector: str = "",
    ) -> None:
        self.name = f"{plural}.{group}/{version}" if group else f"{plural}/{version}"
        self._args: tuple[Any, ...]
        self._kwargs: dict[str, Any] = {}
        self._list_fn: Callable[..., Any]
        if group:
            self._list_fn = client.CustomObjectsApi(api).list_namespaced_custom_object
            self._args = (group, version, namespace, plural)
        elif plural == "pods":
            self._list_fn = client.CoreV1Api(api).list_namespaced_pod
            self._args = (namespace,)
        else:
            raise ValueError(f"unsupported core resource {plural!r}")
        if field_selector:
            self._kwargs["field_selector"] = field_selector
        self._watch: Any = None

    def list(self) -> tuple[list[Any], str]:
        response = self._list_fn(
            *self._args,
            **self._kwargs,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
        )
        data = _json(response)
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Mapping[str, Any]]:
        w = watch.Watch(return_type="object")
        self._watch = w
        try:
            for event in w.stream(
                self._list_fn,
                *self._args,
                **self._kwargs,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds,
                _request_timeout=(CONNECT_TIMEOUT, timeout_seconds + WATCH_READ_SLACK),
            ):
                yield {"type": event["type"], "object": event["raw_object"]}
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc.reason)) from None
            raise
        finally:
            self._watch = None

    def stop(self) -> None:
        w = self._watch
        if w is not None:
            w.stop()  # shuts the socket down, so a blocked read returns at once


def served_resources(api: client.ApiClient, group: str, version: str) -> frozenset[str]:
    """Plural names the API server serves for ``group/version`` (empty when not installed)."""
    try:
        response = client.CustomObjectsApi(api).get_api_resources(
            group, version, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)
        )
    except ApiException as exc:
        if exc.status == 404:
            return frozenset()
        raise
    data = _json(response)
    return frozenset(r.get("name", "") for r in data.get("resources") or [])


class KubeLeases:
    """``LeaseClient`` over the API: raw Lease dicts, so ``MicroTime`` fields keep exactly the
    RFC 3339 micro format the API server parses."""

    GROUP: Final = "coordination.k8s.io"
    VERSION: Final = "v1"
    PLURAL: Final = "leases"

    def __init__(
        self, api: client.ApiClient, namespace: str, timeout: float = READ_TIMEOUT
    ) -> None:
        self._api = client.CustomObjectsApi(api)
        self._namespace = namespace
        self._timeout = (min(CONNECT_TIMEOUT, timeout), timeout)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        try:
            response = fn(
                self.GROUP,
                self.VERSION,
                self._namespace,
                self.PLURAL,
                *args,
                **kwargs,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from None
            raise
        result: dict[str, Any] = _json(response)
        return result

    def get(self, name: str) -> dict[str, Any] | None:
        return self._call(self._api.get_namespaced_custom_object, name)

    def create(self, lease: dict[str, Any]) -> dict[str, Any]:
        created = self._call(self._api.create_namespaced_custom_object, lease)
        if created is None:
            raise ApiException(status=404, reason="lease namespace not found")
        return created

    def replace(self, lease: dict[str, Any]) -> dict[str, Any]:
        name = lease["metadata"]["name"]
        replaced = self._call(self._api.replace_namespaced_custom_object, name, lease)
        if replaced is None:
            raise ApiException(status=404, reason=f"lease {name} vanished")
        return replaced

"""Kubernetes mode: the watches the App runs, and what they feed.

InferencePool mode (``--pool-name``): watches, in the pool's namespace, the InferencePool (by
name), every Pod, and the InferenceObjective and InferenceModelRewrite objects when their API is
served (``llm-d.ai/v1alpha2``; the legacy ``inference.networking.x-k8s.io`` group of either kind
only when the new one is absent, as upstream). Standalone mode (``--endpoint-selector`` +
``--endpoint-target-ports``): Pods only; the pool comes from the flags and is named after the
EPP's Deployment (derived from ``POD_NAME``).

Each resource has a ``Reflector`` (``epp.k8s.watch``) on its own daemon thread; snapshots are
handed to the event loop with ``call_soon_threadsafe``, where endpoints are recomputed (coalesced:
one recomputation per loop turn however many events arrived) and published to the datastore. The
pool and the pods are published together only once both have synced; ``ready()`` is true once
every watch has synced and, in InferencePool mode, the pool exists (upstream's PoolHasSynced;
a deleted pool empties the datastore and turns readiness off). Which APIs are served is probed
once at start (retried with back-off while the API server is unreachable): CRDs installed later
are picked up at the next restart.

With leader election every replica runs the watches by default (feature gate
``haPopulateNonLeaderDatastore``, default true): a follower keeps a warm datastore, so a request
that reaches it is routed (it still reports NOT_SERVING). With
``haPopulateNonLeaderDatastore=false`` (upstream's leader-only behaviour; ``leading`` is then set)
the watches run only while this replica leads: a follower has no endpoints, objectives or rewrites
(a request reaching it gets 503); the watches start when it wins the lease and, when it loses the
lease (upstream's process exits then; this one stays to compete again), stop, and what they fed
is emptied.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client

from epp.k8s import objectives as obj_api
from epp.k8s import rewrites as rw_api
from epp.k8s.client import KubeResource, served_resources
from epp.k8s.pods import PodInfo, decode_pod, pool_endpoints
from epp.k8s.pool import POOL_PLURAL, POOL_VERSION, EndpointPool, decode_pool
from epp.k8s.sink import ObjectSink
from epp.k8s.watch import Backoff, Reflector
from epp.plugin import Endpoint
from epp.plugin.selectors import LabelSelector

JOIN_TIMEOUT: Final = 5.0


@dataclass(frozen=True, slots=True)
class PoolMode:
    name: str
    namespace: str
    group: str


@dataclass(frozen=True, slots=True)
class StandaloneMode:
    pool: EndpointPool


def deployment_name(pod_name: str) -> str:
    """``vllm-epp-7d4b9c-x2x9k`` → ``vllm-epp`` (a Deployment's pod name minus the ReplicaSet
    and pod suffixes); other names are returned unchanged."""
    parts = pod_name.split("-")
    return "-".join(parts[:-2]) if len(parts) >= 3 else pod_name


def standalone_pool(
    selector: LabelSelector, ports: tuple[int, ...], namespace: str, pod_name: str
) -> EndpointPool:
    return EndpointPool(
        name=deployment_name(pod_name) if pod_name else "standalone",
        namespace=namespace,
        selector=selector,
        target_ports=ports,
    )


class KubernetesSource:
    def __init__(
        self,
        api: client.ApiClient,
        mode: PoolMode | StandaloneMode,
        *,
        publish: Callable[[Sequence[Endpoint]], None],
        sink: ObjectSink,
        watch_timeout: int = 300,
        logger: logging.Logger | None = None,
        parser_protocols: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self._api = api
        self.mode = mode
        self._publish = publish
        self._sink = sink
        self._watch_timeout = watch_timeout
        self._log = logger or logging.getLogger(__name__)
        self._pool: EndpointPool | None = mode.pool if isinstance(mode, StandaloneMode) else None
        self._pods: Mapping[str, PodInfo] = {}
        self._expected: set[str] = set()
        self._synced: set[str] = set()
        self._dirty = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parser_protocols = dict(parser_protocols or {})
        self._protocol_ok = True
        self._generation = 0  # a watch stopped by ``_forget`` may still hand in a snapshot
        self.reflectors: dict[str, Reflector[Any]] = {}
        self.leading: tuple[Callable[[], bool], float] | None = None

    @property
    def api(self) -> client.ApiClient:
        """The API client (other watches of the same cluster, e.g. ``epp.k8s.notify``)."""
        return self._api
        """``(is_leader, check interval)``: watch only while leading (module docstring)."""

    @property
    def namespace(self) -> str:
        return self.mode.namespace if isinstance(self.mode, PoolMode) else self.mode.pool.namespace

    @property
    def pool(self) -> EndpointPool | None:
        return self._pool

    def ready(self) -> bool:
        return (
            bool(self._expected)
            and self._synced >= self._expected
            and self._pool is not None
            and self._protocol_ok
        )

    def _check_protocol(self) -> None:
        """Spec §10: not ready while the pool declares an ``appProtocol`` that a parser with a
        protocol list does not serve (logged once per change)."""
        wanted = self._pool.app_protocol if self._pool is not None else ""
        refusing = [
            name
            for name, protocols in self._parser_protocols.items()
            if wanted and protocols and wanted not in protocols
        ]
        ok = not refusing
        if not ok and self._protocol_ok:
            self._log.error(
                "parser does not support the pool protocol: not ready",
                extra={
                    "poolProtocol": wanted,
                    "parsers": refusing,
                    "supported": [list(self._parser_protocols[n]) for n in refusing],
                },
            )
        self._protocol_ok = ok

    # ---- start-up -----------------------------------------------------------------------------

    def _served_group(self, kind: str, plural: str, version: str, absent: str) -> str | None:
        """The API group ``kind`` is served in: ``llm-d.ai``, else the deprecated
        ``inference.networking.x-k8s.io`` (as upstream, the legacy group is ignored when both are
        installed), else ``None`` (logged with what is lost)."""
        for group in (obj_api.GROUP, obj_api.LEGACY_GROUP):
            if plural in served_resources(self._api, group, version):
                if group == obj_api.LEGACY_GROUP:
                    self._log.warning(
                        "%s: using the deprecated %s group", kind, obj_api.LEGACY_GROUP
                    )
                return group
        self._log.warning("%s API not served: %s", kind, absent)
        return None

    def _build(self) -> None:
        """Probe the served APIs (blocking) and create one reflector per watched resource."""
        ns = self.namespace

        def resource(group: str, version: str, plural: str, **kw: str) -> KubeResource:
            return KubeResource(
                self._api, group=group, version=version, plural=plural, namespace=ns, **kw
            )

        specs: dict[str, tuple[KubeResource, Callable[[Any], Any]]] = {
            "pods": (resource("", "v1", "pods"), decode_pod)
        }
        if isinstance(self.mode, PoolMode):
            mode = self.mode
            specs["pool"] = (
                resource(
                    mode.group,
                    POOL_VERSION,
                    POOL_PLURAL,
                    field_selector=f"metadata.name={mode.name}",
                ),
                decode_pool,
            )
            group = self._served_group(
                "InferenceObjective",
                obj_api.PLURAL,
                obj_api.VERSION,
                "every request has priority 0",
            )
            if group is not None:
                specs["objectives"] = (
                    resource(group, obj_api.VERSION, obj_api.PLURAL),
                    obj_api.decode_objective,
                )
            rewrites = self._served_group(
                "InferenceModelRewrite", rw_api.PLURAL, rw_api.VERSION, "no model rewrites"
            )
            if rewrites is not None:
                specs["rewrites"] = (
                    resource(rewrites, rw_api.VERSION, rw_api.PLURAL),
                    rw_api.decode_rewrite,
                )
        for kind, (target, decode) in specs.items():
            self.reflectors[kind] = Reflector(
                target,
                decode,
                self._handoff(kind),
                watch_timeout=self._watch_timeout,
                logger=self._log,
            )
        self._expected = set(specs)

    def _handoff(self, kind: str) -> Callable[[dict[str, Any]], None]:
        generation = self._generation

        def deliver(snapshot: dict[str, Any]) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._update, kind, snapshot, generation)

        return deliver

    # ---- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the watches until cancelled (only while leading when ``leading`` is set)."""
        if self.leading is None:
            await self._watch_all()
        else:
            await self._watch_while_leading(*self.leading)

    async def _watch_all(self) -> None:
        self._loop = asyncio.get_running_loop()
        backoff = Backoff(initial=0.5, maximum=30.0)
        while not self.reflectors:
            try:
                await asyncio.to_thread(self._build)
            except Exception as exc:  # API server unreachable at start: keep trying
                delay = backoff.next()
                self._log.warning(
                    "Kubernetes API discovery failed (%s); retrying in %.1fs", exc, delay
                )
                await asyncio.sleep(delay)
        threads = [
            threading.Thread(target=r.run, name=f"watch {kind}", daemon=True)
            for kind, r in self.reflectors.items()
        ]
        for t in threads:
            t.start()
        try:
            await asyncio.Event().wait()
        finally:
            for r in self.reflectors.values():
                r.stop()
            await asyncio.to_thread(_join, threads)

    async def _watch_while_leading(self, is_leader: Callable[[], bool], interval: float) -> None:
        """The watches run only while ``is_leader()`` (checked every ``interval`` seconds);
        losing the lease stops them and empties what they fed."""
        while True:
            while not is_leader():
                await asyncio.sleep(interval)
            self._log.info("leading: starting the Kubernetes watches")
            watches = asyncio.create_task(self._watch_all())
            try:
                while is_leader() and not watches.done():
                    await asyncio.sleep(interval)
            finally:
                watches.cancel()
                try:
                    await watches  # the threads' join: a while
                except asyncio.CancelledError:
                    # the watches' own cancellation ends here; this task's (the App stopping
                    # while the watches wind down) must go on, or the loop runs forever
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
            self._log.info("not leading: Kubernetes watches stopped, datastore emptied")
            self._forget()

    def _forget(self) -> None:
        """Back to the state before the first watch: no pool, pods, objectives or rewrites."""
        self._generation += 1
        self.reflectors = {}
        self._expected, self._synced, self._pods = set(), set(), {}
        if isinstance(self.mode, PoolMode):
            self._pool = None
        self._sink.set_cluster_objectives(())
        self._sink.set_cluster_rewrites(())
        self._publish(())

    def _update(self, kind: str, snapshot: dict[str, Any], generation: int = 0) -> None:
        if generation != self._generation:
            return
        self._synced.add(kind)
        if kind == "pods":
            self._pods = snapshot
        elif kind == "pool" and isinstance(self.mode, PoolMode):
            pool = snapshot.get(f"{self.mode.namespace}/{self.mode.name}")
            if pool is None and self._pool is not None:
                self._log.warning("InferencePool %s deleted: no endpoints", self.mode.name)
            self._pool = pool
            self._check_protocol()
        elif kind == "objectives":
            self._sink.set_cluster_objectives(snapshot.values())
            return
        elif kind == "rewrites":
            self._sink.set_cluster_rewrites(snapshot.values())
            return
        if not self._dirty:
            self._dirty = True
            asyncio.get_running_loop().call_soon(self._recompute)

    def _recompute(self) -> None:
        self._dirty = False
        if "pods" not in self._synced or (
            isinstance(self.mode, PoolMode) and "pool" not in self._synced
        ):
            return
        self._publish(pool_endpoints(self._pods.values(), self._pool))


def _join(threads: Sequence[threading.Thread]) -> None:
    for t in threads:
        t.join(JOIN_TIMEOUT)

"""``App``: owns one EPP's lifecycle, state and servers. No globals: two Apps can share a process.

Start order: config → plugins → discovery and scrapers → gRPC (ext_proc + health) and metrics
servers. Stop: with leader election, a leader hands over (it releases the lease and stays ready
until another replica holds it, then ``HANDOVER_GRACE`` more, so that the gateway's health check
sees the successor before this replica leaves: no moment without a ready replica) → draining
(readiness NOT_SERVING) → serve for what is left of the drain window → stop the servers → cancel
the background tasks → stop plugins.

Endpoints come from the config's ``dataLayer.discovery`` plugin, or, with ``--pool-name`` /
``--endpoint-selector``, from Kubernetes (``epp.k8s.mode``; the ``kubernetes`` client is only
imported then). InferenceObjective / InferenceModelRewrite objects come from the cluster and from
``--objectives-file`` files in any mode. Readiness: discovery synced, first scrape cycle done,
plugins ready, not draining; in Kubernetes mode every watch synced and the pool present; with
leader election, holding the lease; with a cross-replica syncer, the log's tail applied or its
bootstrap wait over (``epp.state.sync``: active-active replicas share routing facts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import signal
import time
from collections.abc import Sequence
from typing import Any, Final

from epp.config.handle import AppHandle
from epp.config.loader import ConfigError, LoadOptions, PluginFactory, load_config
from epp.config.pipeline import Pipeline
from epp.datalayer.collector import Collector
from epp.datalayer.store import Datastore
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.shared import CrossReplicaOptions
from epp.k8s.files import ObjectFiles, ObjectsFileError
from epp.k8s.review import metrics_reviewer
from epp.k8s.sink import ObjectSink
from epp.observability import stuck
from epp.observability.auth import Reviewer
from epp.observability.decisions import DecisionLog
from epp.observability.http import DebugViews, MetricsServer, PortOptions
from epp.observability.memory import HeapTrimmer
from epp.observability.metrics import EppMetrics
from epp.observability.pool import pool_gauges
from epp.observability.recorder import RequestStats
from epp.observability.streams import StreamMetrics
from epp.observability.tracing import Tracing
from epp.plugin import Discovery, Endpoint, Lifecycle
from epp.plugin.registry import PluginRegistry
from epp.requestcontrol.director import Director
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.rewrites import RewriteStore
from epp.scheduling.scheduler import Scheduler
from epp.server import health
from epp.server.admin import AdminServicer, AdminSources, read_token
from epp.server.context import ServerContext
from epp.server.serve import private_host, start_grpc
from epp.server.tls import CertFiles, metrics_tls
from epp.settings import Settings
from epp.state.sync import StateSync

HANDOVER_GRACE: Final = 5.0
"""Seconds a leader that handed its lease over keeps serving: the health-check interval of the
generated Envoy configs (``epp envoy-config --health-interval``, 5 s), so the gateway has checked
the successor once before this replica stops being ready."""

log = logging.getLogger(__name__)


class App:
    _certs: list[CertFiles]  # the servers' certificates, set as they start

    def __init__(self, settings: Settings, *, registry: PluginRegistry | None = None) -> None:
        self.settings = settings
        self.metrics = EppMetrics()
        self.store = Datastore(time.monotonic)
        self.objectives = ObjectiveStore()
        self.rewrites = RewriteStore()
        self.decisions = DecisionLog()
        self.heap_trimmer = HeapTrimmer(settings.memory_trim_interval)
        self._instances: dict[str, Any] = {}  # filled once the config is loaded
        self.sync: StateSync | None = None  # set once the plugins are built
        registry = registry or PluginRegistry.from_entry_points()
        options = LoadOptions(allow_experimental=settings.allow_experimental_plugins)
        self.factory = PluginFactory(registry, allow_experimental=options.allow_experimental)
        self.pipeline: Pipeline = load_config(
            settings.config_text,
            registry=registry,
            handle_for=self._handle,
            options=options,
        )
        self._instances = self.pipeline.instances
        self.kube: Any = None
        self.notifications: Any = None
        """``k8s-notification-source`` watches, in Kubernetes mode (``epp.k8s.notify``)."""
        """The ``KubernetesSource`` in Kubernetes mode."""
        self.elector: Any = None
        """The ``LeaderElector`` with --ha-enable-leader-election."""
        self.object_files: ObjectFiles | None = None
        self._wire_sources()
        self.flow = self._flow_controller()
        self.discovered = asyncio.Event()  # the first discovery sync (Director.route waits)
        self.director = self._director()
        p, flow = self.pipeline, [self.flow] if self.flow is not None else []
        self.sync = StateSync.create(  # the flow controller shares its queues like a plugin
            p.syncer, [*p.shared, *flow], interval=p.sync_interval, registry=self.metrics.registry,
            namespace=settings.pool_namespace, pool_name=settings.pool_name,
        )  # fmt: skip
        self.collector = self._collector()
        self.tracing = Tracing.from_environment(settings.tracing, settings.tracing_plugin_threshold)
        self.context = ServerContext(
            director=self.director,
            max_body_bytes=settings.max_request_body_bytes,
            emit_scores=settings.emit_endpoint_scores,
            streams=StreamMetrics.when(settings.enable_grpc_stream_metrics, self.metrics.registry),
            tracing=self.tracing,
            metrics=self.metrics,
        )
        self.health = health.HealthServicer(
            self.ready, leader_election=settings.ha_enable_leader_election
        )
        self.draining = False
        self._handing_over = False
        self.grpc_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._started = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._election: asyncio.Task[None] | None = None

    def _handle(self) -> AppHandle:
        return AppHandle(
            registry=self.metrics.registry,
            plugin=self.plugin,
            endpoints=self.store.snapshot,
            share_soon=self._share_soon,
            factory=self.factory,
        )

    def _share_soon(self) -> None:
        if self.sync is not None:
            self.sync.share_soon()

    def _collector(self) -> Collector:
        m = self.metrics
        return Collector(
            store=self.store,
            pipelines=self.pipeline.sources,
            interval=self.settings.refresh_metrics_interval,
            clock=time.monotonic,
            on_poll_error=lambda src, _eid, _exc: m.poll_errors.inc((src,), (src,)),
            on_extract_error=lambda s, x, _e: m.extract_errors.inc((s, x), (s, x)),
        )

    def _director(self) -> Director:
        m = self.metrics
        scheduler = Scheduler(
            profiles=self.pipeline.profiles,
            handler=self.pipeline.profile_handler,
            observe=lambda ep, t, n, s: m.plugin_duration.observe((ep, t, n), (ep, t, n), s),
            count_error=lambda ep, t, n: m.plugin_errors.labels(ep, t, n).inc(),
        )
        return Director(
            flow=self.flow,
            pipeline=self.pipeline,
            scheduler=scheduler,
            endpoints=self.store.routable,
            objectives=self.objectives,
            clock=time.monotonic,
            rng=random.Random(self.settings.seed),
            subset_filter=not self.settings.disable_endpoint_subset_filter,
            on_scheduled=lambda s: m.scheduler_e2e.observe((), (), s),
            rewrites=self.rewrites,
            on_rewrite=lambda name, model, target: m.model_rewrites.inc(
                (name, *m.models(model, target)), (name, *m.models(model, target))
            ),
            stats=RequestStats(m),
            decisions=self.decisions,
            response_sample=self.settings.response_body_sample_ratio,
            discovered=self.discovered,
        )

    def _wire_sources(self) -> None:
        """Endpoint discovery (config plugin or Kubernetes), objects files, leader election."""
        s, p = self.settings, self.pipeline
        sink = ObjectSink(
            self.objectives, self.rewrites, pool_name=s.pool_name, pool_group=s.pool_group
        )
        if s.pool_name or s.endpoint_selector:
            if self.pipeline.discovery is not None:
                raise ConfigError(
                    "dataLayer.discovery and --pool-name/--endpoint-selector are mutually "
                    "exclusive: endpoints come either from the config's discovery plugin or from "
                    "Kubernetes"
                )
            from epp.k8s.mode import kubernetes_mode

            self.kube, self.elector = kubernetes_mode(
                s, publish=self._publish, sink=sink, parsers=p.parsers, gates=p.feature_gates
            )
            if p.kube_notifications:
                from epp.k8s.notify import NotificationWatches

                self.notifications = NotificationWatches(
                    self.kube.api,
                    self.kube.namespace,
                    p.kube_notifications,
                    watch_timeout=s.kube_watch_timeout,
                )
        else:
            if self.pipeline.discovery is None:
                raise ConfigError(
                    "no endpoint discovery configured: set dataLayer.discovery (for example "
                    "{pluginRef: file-discovery}) or use Kubernetes mode (--pool-name or "
                    "--endpoint-selector)"
                )
            if s.ha_enable_leader_election:
                raise ConfigError("--ha-enable-leader-election needs Kubernetes mode")
            for n in p.kube_notifications:
                log.warning(
                    "%s watches Kubernetes objects: without Kubernetes mode (--pool-name or "
                    "--endpoint-selector) it gets no events",
                    n.source.typed_name,
                )
        if s.objectives_files:
            self.object_files = ObjectFiles(
                s.objectives_files, sink.set_files, poll_interval=s.objectives_poll_interval
            )
            try:
                self.object_files.load()
            except ObjectsFileError as exc:
                raise ConfigError(f"--objectives-file: {exc}") from None

    def _flow_controller(self) -> FlowController | None:
        """The flow controller when the ``flowControl`` feature gate is on."""
        if not self.pipeline.feature_gates.get("flowControl"):
            if self.pipeline.flow_control is not None:
                log.warning("flowControl config is ignored: the flowControl feature gate is off")
            return None
        try:
            return FlowController.from_config(
                self.pipeline.flow_control,
                plugins=self.pipeline.instances,
                detector=self.pipeline.saturation_detector,
                registry=self.metrics.registry,
                clock=time.monotonic,
                pool_name=self.settings.pool_name or "default",
                model_labels=self.metrics.models,
                cross_replica=CrossReplicaOptions(
                    pool_wide_max_requests=self.settings.flow_control_pool_wide_max_requests,
                    pool_wide_priority=self.settings.flow_control_pool_wide_priority,
                ),
            )
        except ValueError as exc:
            raise ConfigError(f"config: flowControl: {exc}") from None

    # ---- state --------------------------------------------------------------------------------

    def plugin(self, name: str) -> Any:
        return self._instances[name]

    def ready(self) -> bool:
        return (
            not self.draining
            and self.discovered.is_set()
            and self.collector.first_cycle_done()
            and all(p.is_ready() for p in self.pipeline.readiness)
            and (self.kube is None or self.kube.ready())
            and (self.elector is None or self.elector.is_leader() or self._handing_over)
            and (self.sync is None or self.sync.ready())
        )

    def _discovery(self) -> Discovery:
        assert self.pipeline.discovery is not None, "checked in __init__"
        return self.pipeline.discovery

    def _publish(self, endpoints: Sequence[Endpoint]) -> None:
        self.store.set_endpoints(endpoints)
        if not self.discovered.is_set():
            self.discovered.set()
            self.collector.discovery_synced()
            log.info("discovery synced", extra={"endpoints": len(endpoints)})

    # ---- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until ``stop()`` (or SIGTERM via ``install_signal_handlers``)."""
        servers = await self._start_servers()
        started: list[Lifecycle] = []
        report: asyncio.TimerHandle | None = None
        try:
            for p in self.pipeline.lifecycle:  # a start that fails still stops the servers
                await p.start()
                started.append(p)
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(c) for c in self._background()]
                if self.elector is not None:
                    self._election = tg.create_task(self.elector.run())
                    tasks.append(self._election)
                self._started.set()
                await self._stop.wait()
                # a stop that overruns its bound logs what it waits on (epp.observability.stuck)
                late = self.settings.drain_timeout + stuck.STUCK_AFTER
                report = asyncio.get_running_loop().call_later(late, stuck.report, late)
                await self._drain(servers)
                for t in tasks:
                    t.cancel()
        finally:
            for srv in servers[:2]:
                await srv.stop(grace=None)
            for p in reversed(started):
                with contextlib.suppress(Exception):
                    await p.stop()
            await servers[2].stop()
            if self.tracing is not None:
                await asyncio.to_thread(self.tracing.shutdown)
            if report is not None:
                report.cancel()

    def _background(self) -> list[Any]:
        """The long-lived tasks: discovery, scraping, pool gauges, flow control, objects files,
        cross-replica sync, certificate reload, the heap trimmer."""
        s = self.settings
        source = self.kube.run() if self.kube else self._discovery().run(self._publish)
        gauges = pool_gauges(
            self.metrics,
            self.store.snapshot,
            pool=s.pool_name or "default",
            staleness=s.metrics_staleness_threshold,
            interval=s.refresh_prometheus_metrics_interval,
        )
        return [
            source,
            self.collector.run(),
            gauges,
            *([self.flow.run()] if self.flow is not None else []),
            *([self.object_files.run()] if self.object_files is not None else []),
            *([self.sync.run()] if self.sync is not None else []),
            *([self.notifications.run()] if self.notifications is not None else []),
            *(c.watch() for c in (self._certs if s.enable_cert_reload else [])),
            self.heap_trimmer.run(),
        ]

    async def _start_servers(self) -> list[Any]:
        s = self.settings
        try:
            ssl_context, metrics_certs = metrics_tls(s)
        except ValueError as exc:
            raise ConfigError(f"--metrics-cert-dir: {exc}") from None
        reviewer = metrics_reviewer(s)  # before any server starts: a ConfigError stops nothing
        grpc_servers = await start_grpc(s, self.context, self.health, self._admin(reviewer))
        self.grpc_port, self.health_port = grpc_servers.grpc_port, grpc_servers.health_port
        self._certs = [c for c in (grpc_servers.cert_files, metrics_certs) if c is not None]
        ms = MetricsServer(
            DebugViews(
                registry=self.metrics.registry,
                config=self.pipeline.describe,
                endpoints=self.store.snapshot,
                decisions=self.decisions,
                dumpers=self.pipeline.dumpers,
            ),
            PortOptions(reviewer, ssl_context, s.enable_debug_endpoints, s.enable_pprof),
        )
        self.metrics_port = await ms.start(private_host(s), s.metrics_port)
        ports: dict[str, object] = {"extProcPort": self.grpc_port, "healthPort": self.health_port}
        ports |= {"metricsPort": self.metrics_port, "tls": s.secure_serving}
        # the loop actually running ("uvloop" or "asyncio"), whatever --event-loop asked for
        ports["eventLoop"] = type(asyncio.get_running_loop()).__module__.partition(".")[0]
        log.info("serving", extra=ports)
        return [grpc_servers.ext, grpc_servers.health, ms]

    def _admin(self, reviewer: Reviewer | None) -> AdminServicer:
        """The admin gRPC API (``epp.server.admin``) over this App's state, behind the debug
        views' auth."""
        p, token = self.pipeline, read_token(self.settings.admin_token_file)
        sources = AdminSources(self.director, self.store.snapshot, p.dumpers, self.flow, self.sync)
        return AdminServicer(dataclasses.replace(sources, token=token, reviewer=reviewer))

    async def _drain(self, servers: list[Any]) -> None:
        t0 = time.monotonic()
        await self._hand_over()
        self.draining = True
        await self._resign()  # a follower (or a leader whose hand-over was cut short)
        if self.flow is not None:
            await self.flow.shutdown()  # queued requests: 503 rejected-shutting-down
        left = self.settings.drain_timeout - (time.monotonic() - t0)
        if left > 0:
            log.info("draining for %.1fs", left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._force.wait(), left)
        for srv in servers[:2]:
            await srv.stop(grace=1.0)

    async def _hand_over(self) -> None:
        """A leader releases the lease and stays ready until a successor holds it and the
        gateway has had ``HANDOVER_GRACE`` to see it (all within the drain window; a second
        SIGTERM cuts it short). Upstream goes NOT_SERVING at once, which leaves no ready
        replica until the standby's next lease round and the gateway's next health check."""
        if self.elector is None or not self.elector.is_leader():
            return
        self._handing_over = True
        try:
            await self._resign()
            async with asyncio.timeout(max(self.settings.drain_timeout, 0.0)):
                successor = await self.elector.await_successor(self._force)
                if successor:
                    log.info("lease taken by %s; serving %.0fs more", successor, HANDOVER_GRACE)
                    await asyncio.wait_for(self._force.wait(), HANDOVER_GRACE)
        except TimeoutError:
            pass
        finally:
            self._handing_over = False

    async def _resign(self) -> None:
        """Stop competing for the lease and release it, so a follower takes over at once."""
        if self.elector is None or self._election is None:
            return
        self._election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._election
        try:
            await asyncio.to_thread(self.elector.release)
        except Exception as exc:  # the lease then expires by itself
            log.warning("could not release the lease: %r", exc)

    def stop(self) -> None:
        """First call: drain, then stop. A second call (a second SIGTERM) cuts the drain short."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def __aenter__(self) -> App:
        self._runner = asyncio.create_task(self.run())
        started = asyncio.create_task(self._started.wait())
        done, _ = await asyncio.wait({self._runner, started}, return_when=asyncio.FIRST_COMPLETED)
        if self._runner in done:
            started.cancel()
            self._runner.result()  # re-raise the start-up error
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        if self._runner is not None:
            await self._runner

    async def wait_started(self) -> None:
        """Return once the servers listen and the background tasks run (ports are known)."""
        await self._started.wait()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not self.ready():
                await asyncio.sleep(0.02)

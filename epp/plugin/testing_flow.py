"""Contract checks for flow-control policies (``epp.plugin.flow``: ordering, fairness, usage
limit, priority adjustment) and the data layer (data sources, extractors, endpoint sources and
extractors, shared state). Re-exported by ``epp.plugin.testing``.

Each check first applies ``epp.plugin.conformance`` (the rules start-up enforces for the role),
then exercises the role, and raises ``AssertionError`` naming the plugin and the broken rule.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from epp.plugin.capabilities import PollInterval
from epp.plugin.flow import (
    EvictionFilterPolicy,
    EvictionItem,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    PriorityAdjuster,
    QueuedRequest,
    UsageLimitPolicy,
)
from epp.plugin.notifications import (
    GVK,
    NotificationEvent,
    NotificationExtractor,
    NotificationSource,
)
from epp.plugin.protocols import (
    DataSource,
    Discovery,
    EndpointEvent,
    EndpointEventType,
    EndpointExtractor,
    EndpointSource,
    Extractor,
    Lifecycle,
)
from epp.plugin.sharing import ReplicaSyncer, SharedState
from epp.plugin.testing_request import check_role, name_of
from epp.plugin.types import Endpoint, InferenceRequest, Metrics


def sample_queue(
    n: int, *, fairness_id: str = "tenant-a", priority: int = 0
) -> list[QueuedRequest]:
    """``n`` queued requests, arriving 10 ms apart, the odd ones with a 5 s queue budget."""
    return [
        QueuedRequest(
            request=InferenceRequest(
                request_id=f"{fairness_id}-{i}", headers={}, received_at=1000.0 + i / 100
            ),
            candidates=list,
            fairness_id=fairness_id,
            priority=priority,
            enqueue_time=1000.0 + i / 100,
            ttl=5.0 if i % 2 else 0.0,
            size_bytes=100 * (i + 1),
            seq=i,
        )
        for i in range(n)
    ]


@dataclasses.dataclass
class _Flow:
    flow_id: str
    items: list[QueuedRequest]
    ordering: OrderingPolicy

    def __len__(self) -> int:
        return len(self.items)

    def peek(self) -> QueuedRequest | None:
        return min(self.items, key=self.ordering.order_key, default=None)

    def head_key(self) -> tuple[Any, ...]:
        head = self.peek()
        return () if head is None else tuple(self.ordering.order_key(head))


@dataclasses.dataclass
class _Band:
    priority: int
    state: Any
    flows: list[_Flow]

    def active_flows(self) -> Iterable[_Flow]:
        return [f for f in self.flows if f.items]


def check_ordering_policy(policy: OrderingPolicy, items: Sequence[QueuedRequest]) -> None:
    """``order_key`` is a deterministic tuple of numbers; keys of distinct requests differ (the
    order is total), and it does not change the request."""
    check_role(policy, "ordering-policy")
    name = name_of(policy)
    keys = [policy.order_key(item) for item in items]
    for key in keys:
        assert isinstance(key, tuple), f"{name}: order_key() returned {key!r}, not a tuple"
        assert all(isinstance(k, (int, float)) for k in key), f"{name}: non-numeric key {key!r}"
    assert keys == [policy.order_key(item) for item in items], f"{name}: order_key() changed"
    assert len(set(keys)) == len(keys), f"{name}: two requests have the same order key"


def sample_eviction_items(n: int) -> list[EvictionItem]:
    """``n`` dispatched requests: priorities -2, -1, 0, 1 in turn, dispatched 10 ms apart except
    that every third shares its predecessor's dispatch time (ties broken by ``seq``)."""
    out = []
    for i in range(n):
        at = 1000.0 + (i - (1 if i % 3 == 2 else 0)) / 100
        request = InferenceRequest(request_id=f"in-flight-{i}", headers={}, received_at=at)
        out.append(
            EvictionItem(request, priority=i % 4 - 2, fairness_id="f", dispatched_at=at, seq=i)
        )
    return out


def check_eviction_filter_policy(
    policy: EvictionFilterPolicy, items: Sequence[EvictionItem]
) -> None:
    """``evictable`` answers a bool, synchronously, the same when asked twice, and leaves the
    request as it was."""
    check_role(policy, "eviction-filter-policy")
    name = name_of(policy)
    for item in items:
        before = dict(item.request.attributes)
        answer = policy.evictable(item)
        assert isinstance(answer, bool), f"{name}: evictable() returned {answer!r}, not a bool"
        assert policy.evictable(item) is answer, f"{name}: evictable() is not deterministic"
        assert item.request.attributes == before, f"{name}: evictable() changed the request"


def check_eviction_ordering_policy(
    policy: EvictionOrderingPolicy, items: Sequence[EvictionItem]
) -> None:
    """``eviction_key`` is a deterministic tuple of numbers; keys of distinct requests differ (the
    order is total)."""
    check_role(policy, "eviction-ordering-policy")
    name = name_of(policy)
    keys = [policy.eviction_key(item) for item in items]
    for key in keys:
        assert isinstance(key, tuple), f"{name}: eviction_key() returned {key!r}, not a tuple"
        assert all(isinstance(k, (int, float)) for k in key), f"{name}: non-numeric key {key!r}"
    assert keys == [policy.eviction_key(item) for item in items], f"{name}: key changed"
    assert len(set(keys)) == len(keys), f"{name}: two requests have the same eviction key"


def check_fairness_policy(
    policy: FairnessPolicy, ordering: OrderingPolicy, queues: Sequence[Sequence[QueuedRequest]]
) -> None:
    """Dispatches every request of ``queues`` (one flow each) through the policy: ``select_flow``
    picks a non-empty flow of the band while one is left, the same one when asked twice (it
    changes no state), ``None`` when all are empty; two fresh bands give the same order."""
    check_role(policy, "fairness-policy")
    name = name_of(policy)
    orders = []
    for _ in range(2):
        flows = [_Flow(f"flow-{i}", list(q), ordering) for i, q in enumerate(queues)]
        band = _Band(0, policy.new_state(), flows)
        order = []
        for _ in range(sum(len(q) for q in queues)):
            flow = policy.select_flow(band, 1000.0)
            assert not inspect.isawaitable(flow), f"{name}: select_flow() must be synchronous"
            assert any(flow is f for f in band.active_flows()), (
                f"{name}: selected {flow!r}, not a non-empty flow of the band"
            )
            assert policy.select_flow(band, 1000.0) is flow, f"{name}: select_flow() moved state"
            assert isinstance(flow, _Flow)
            item = flow.peek()
            assert item is not None
            flow.items.remove(item)
            policy.on_dispatch(band, flow, item, 1000.0)
            policy.on_complete(item.fairness_id, 10, 10, 1000.0)
            order.append(item.request.request_id)
        assert policy.select_flow(band, 1000.0) is None, f"{name}: selected from empty flows"
        orders.append(order)
    assert orders[0] == orders[1], f"{name}: dispatch order differs between identical bands"


def check_usage_limit_policy(policy: UsageLimitPolicy, priorities: Sequence[int]) -> None:
    """For saturations from 0 to beyond 1: at most one ceiling per band, each in [0, 1],
    non-increasing from the highest priority down, deterministic."""
    check_role(policy, "usage-limit-policy")
    name = name_of(policy)
    for saturation in (0.0, 0.5, 0.99, 1.0, 1.5):
        limits = list(policy.compute_limit(saturation, priorities))
        assert len(limits) <= len(priorities), f"{name}: more ceilings than bands: {limits}"
        assert all(0.0 <= x <= 1.0 for x in limits), f"{name}: ceiling outside [0, 1]: {limits}"
        assert all(a >= b for a, b in itertools.pairwise(limits)), f"{name}: increasing {limits}"
        again = list(policy.compute_limit(saturation, priorities))
        assert again == limits, f"{name}: compute_limit() is not deterministic"


def check_priority_adjuster(adjuster: PriorityAdjuster, request: InferenceRequest) -> None:
    """``adjusted_priority`` is an int; the dispatch and done notifications are accepted."""
    check_role(adjuster, "priority-adjuster")
    value = adjuster.adjusted_priority(request, 1000.0)
    assert isinstance(value, int), f"{name_of(adjuster)}: adjusted_priority() returned {value!r}"
    adjuster.on_dispatch(request, 1000.0)
    adjuster.on_done(request, 1001.0)


async def check_data_source(source: DataSource, endpoint: Endpoint, *, bound: float = 10.0) -> None:
    """Started (when it has a ``Lifecycle``), ``poll`` of ``endpoint`` ends within ``bound``
    seconds with bytes or an exception (an unreachable endpoint is the degraded mode the
    collector counts); a ``PollInterval`` is >= 0; ``stop`` ends it."""
    check_role(source, "data-source")
    name = name_of(source)
    if isinstance(source, PollInterval):
        interval = source.interval_seconds
        assert interval >= 0, f"{name}: interval_seconds is {interval!r}, not >= 0"
    if isinstance(source, Lifecycle):
        await source.start()
    try:
        async with asyncio.timeout(bound):
            payload = await source.poll(endpoint)
    except TimeoutError:
        raise AssertionError(f"{name}: poll() did not end within {bound} s") from None
    except Exception:  # unreachable endpoint: the degraded mode
        payload = b""
    finally:
        if isinstance(source, Lifecycle):
            await source.stop()
    assert isinstance(payload, bytes), f"{name}: poll() returned {type(payload).__name__}"


def check_extractor(extractor: Extractor, payload: bytes, endpoint: Endpoint) -> Metrics:
    """``extract`` is synchronous and pure: a ``Metrics``, the same for the same input, the
    previous metrics unchanged."""
    check_role(extractor, "extractor")
    name = name_of(extractor)
    previous = endpoint.metrics or Metrics()
    snapshot = dataclasses.replace(previous)
    out = extractor.extract(payload, endpoint, previous, now=2000.0)
    assert not inspect.isawaitable(out), f"{name}: extract() must be synchronous"
    assert isinstance(out, Metrics), f"{name}: extract() returned {type(out).__name__}"
    assert extractor.extract(payload, endpoint, previous, now=2000.0) == out, (
        f"{name}: extract() is not deterministic"
    )
    assert previous == snapshot, f"{name}: extract() changed the previous metrics"
    return out


def check_endpoint_listener(plugin: Any, endpoint: Endpoint) -> None:
    """An ``EndpointSource`` passes an endpoint's add and delete events on (or drops them with
    ``None``); an ``EndpointExtractor`` hears them synchronously and returns ``None`` or a mapping
    of attributes."""
    name = name_of(plugin)
    for kind in (EndpointEventType.ADD_OR_UPDATE, EndpointEventType.DELETE):
        event = EndpointEvent(kind, endpoint)
        if isinstance(plugin, EndpointSource):
            check_role(plugin, "endpoint-source")
            out = plugin.notify_endpoint(event)
            assert out is None or isinstance(out, EndpointEvent), f"{name}: notify -> {out!r}"
        if isinstance(plugin, EndpointExtractor):
            check_role(plugin, "endpoint-extractor")
            attrs = plugin.extract_endpoint(event)
            assert not inspect.isawaitable(attrs), f"{name}: extract_endpoint() must be sync"
            assert attrs is None or hasattr(attrs, "items"), (
                f"{name}: extract_endpoint() returned {attrs!r}"
            )


def check_notification_listener(plugin: Any) -> None:
    """A ``NotificationSource`` names its kind (group, version and kind strings; version and kind
    not empty) and passes an object's add and delete events on (or drops them with ``None``); a
    ``NotificationExtractor`` hears them synchronously."""
    name = name_of(plugin)
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns"}}
    for kind in (EndpointEventType.ADD_OR_UPDATE, EndpointEventType.DELETE):
        event = NotificationEvent(kind, obj)
        if isinstance(plugin, NotificationSource):
            check_role(plugin, "notification-source")
            gvk = plugin.gvk
            assert isinstance(gvk, GVK) and gvk.version and gvk.kind, f"{name}: gvk {gvk!r}"
            out = plugin.notify(event)
            assert out is None or isinstance(out, NotificationEvent), f"{name}: notify -> {out!r}"
        if isinstance(plugin, NotificationExtractor):
            check_role(plugin, "notification-extractor")
            hear = plugin.extract_notification
            assert not inspect.iscoroutinefunction(hear), f"{name}: extract_notification() is async"
            hear(event)


def check_shared_state(plugin: SharedState, peer: SharedState) -> None:
    """``export_facts`` is a list, and a fresh ``peer`` of the same type applies it (and a second,
    duplicated delivery) without raising."""
    check_role(plugin, "shared-state")
    facts = plugin.export_facts()
    assert isinstance(facts, list), f"{name_of(plugin)}: export_facts() returned {facts!r}"
    peer.apply_facts(facts, "peer-replica")
    peer.apply_facts(facts, "peer-replica")


async def check_discovery(discovery: Discovery, *, bound: float = 10.0) -> list[Endpoint]:
    """``run`` publishes an endpoint set within ``bound`` seconds and, cancelled, ends."""
    check_role(discovery, "discovery")
    name = name_of(discovery)
    published: asyncio.Future[list[Endpoint]] = asyncio.get_running_loop().create_future()

    def publish(endpoints: Sequence[Endpoint]) -> None:
        if not published.done():
            published.set_result(list(endpoints))

    task = asyncio.create_task(discovery.run(publish))
    try:
        async with asyncio.timeout(bound):
            waiters: set[asyncio.Future[Any]] = {task, published}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        raise AssertionError(f"{name}: published no endpoint set within {bound} s") from None
    finally:
        task.cancel()
    assert published.done(), f"{name}: run() returned without publishing: {task.exception()!r}"
    endpoints = published.result()
    assert all(isinstance(e, Endpoint) for e in endpoints), f"{name}: published non-endpoints"
    async with asyncio.timeout(bound):
        await asyncio.gather(task, return_exceptions=True)
    return endpoints


async def check_replica_syncer(syncer: ReplicaSyncer, *, bound: float = 10.0) -> None:
    """A stable, non-empty ``replica_id``; a positive ``bootstrap_timeout``; after ``bind``,
    ``publish``, ``replay`` and ``receive`` each end within ``bound`` seconds, with a result or an
    exception (the transport being unavailable is the degraded mode the engine retries)."""
    check_role(syncer, "replica-syncer")
    name = name_of(syncer)
    rid = syncer.replica_id
    assert isinstance(rid, str) and rid, f"{name}: replica_id is {rid!r}"
    assert syncer.replica_id == rid, f"{name}: replica_id is not stable"
    assert syncer.bootstrap_timeout > 0, f"{name}: bootstrap_timeout must be positive"
    syncer.bind("default/contract-pool")
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "publish": lambda: syncer.publish({"p": [1]}),
        "replay": syncer.replay,
        "receive": lambda: syncer.receive(0.0),
    }
    try:
        for method, call in calls.items():
            try:
                async with asyncio.timeout(bound):
                    out = await call()
            except TimeoutError:
                raise AssertionError(f"{name}: {method}() did not end in {bound} s") from None
            except Exception:  # the transport is unavailable: the degraded mode
                continue
            assert method == "publish" or isinstance(out, list), f"{name}: {method} -> {out!r}"
    finally:
        if isinstance(syncer, Lifecycle):
            await syncer.stop()

"""Contract checks plugin authors run in their own test suites, one per role, grouped by
extension point as the roles are (``epp.plugin.protocols``):

* scheduling: filters, scorers (and ``ListScorer``'s list form), pickers, profile handlers,
  deciders;
* request control: parsers, data producers, screeners, admitters, saturation detectors,
  request-header processors and the pre-request and response hooks (``check_hooks``);
* the data layer: data sources, extractors, discovery, endpoint sources and extractors,
  notification sources and extractors;
* flow control: ordering, fairness, usage-limit and eviction policies, priority adjusters;
* sharing between replicas: ``SharedState`` plugins and ``ReplicaSyncer`` transports.

Each check first applies the rules start-up enforces for the role (``check_role``, from
``epp.plugin.conformance``, the one definition both use), then exercises the role with a small
realistic input (``sample_endpoints``, ``sample_request``, ``sample_queue``,
``sample_eviction_items``), and raises ``AssertionError`` with a message naming the plugin and
the broken rule. Example::

    from epp.plugin.testing import check_plugin_class, check_scorer, sample_endpoints

    def test_my_scorer_honours_the_contract():
        check_plugin_class(MyScorer, "my-scorer")
        scorer = MyScorer(name="s", params=MyScorer.Params(), handle=None)
        check_scorer(scorer, sample_endpoints(5))
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import itertools
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from epp.plugin.capabilities import (
    DEFAULT_PRODUCE_TIMEOUT,
    ListScorer,
    PollInterval,
    ProducerTimeout,
)
from epp.plugin.conformance import problems
from epp.plugin.errors import InferenceError
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
from epp.plugin.params import ParamError, decode
from epp.plugin.protocols import (
    Admitter,
    DataProducer,
    DataSource,
    Decider,
    Discovery,
    EndpointEvent,
    EndpointEventType,
    EndpointExtractor,
    EndpointSource,
    Extractor,
    Filter,
    Lifecycle,
    Parser,
    Picker,
    PreRequest,
    Profile,
    ProfileHandler,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseHeaders,
    ResponseStreaming,
    SaturationDetector,
    Scorer,
    Screener,
)
from epp.plugin.routed import release_content
from epp.plugin.sharing import ReplicaSyncer, SharedState
from epp.plugin.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ParsedResponse,
    ParseResult,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
    ScoredEndpoint,
)

__all__ = [
    "check_admitter",
    "check_data_source",
    "check_decider",
    "check_discovery",
    "check_endpoint_listener",
    "check_eviction_filter_policy",
    "check_eviction_ordering_policy",
    "check_extractor",
    "check_fairness_policy",
    "check_filter",
    "check_hooks",
    "check_notification_listener",
    "check_ordering_policy",
    "check_parser",
    "check_picker",
    "check_plugin_class",
    "check_priority_adjuster",
    "check_producer",
    "check_profile_handler",
    "check_replica_syncer",
    "check_role",
    "check_saturation_detector",
    "check_score_list",
    "check_scorer",
    "check_screener",
    "check_shared_state",
    "check_usage_limit_policy",
    "sample_endpoints",
    "sample_eviction_items",
    "sample_queue",
    "sample_request",
]


# ---- samples and what every check shares ----


def sample_endpoints(n: int, *, seed: int = 0) -> list[Endpoint]:
    """``n`` endpoints with varied, realistic metrics (loopback addresses)."""
    rng = random.Random(seed)
    return [
        Endpoint(
            id=f"default/pod-{i}-rank-0",
            name=f"pod-{i}",
            namespace="default",
            address=f"127.0.0.{i % 250 + 1}",
            port=8000 + i // 250,
            labels={"llm-d.ai/engine-type": "vllm", "zone": f"z{i % 3}"},
            metrics=Metrics(
                waiting_queue_size=rng.randint(0, 20),
                running_requests_size=rng.randint(0, 64),
                kv_cache_usage_percent=rng.random(),
                active_models=frozenset({"lora-a"}) if i % 2 else frozenset(),
                max_active_models=2,
                cache_block_size=16,
                cache_num_blocks=1000,
                update_time=1000.0,
            ),
        )
        for i in range(n)
    ]


def sample_request(**overrides: Any) -> InferenceRequest:
    base: dict[str, Any] = {
        "request_id": "contract-check",
        "headers": {"content-type": "application/json"},
        "incoming_model": "m",
        "target_model": "m",
        "received_at": 1000.0,
    }
    base.update(overrides)
    return InferenceRequest(**base)


def _cycle(seed: int = 0) -> CycleState:
    """The cycle state a check passes: a fixed clock and a seeded random source."""
    return CycleState(now=1000.0, rng=random.Random(seed))


def _name_of(plugin: Any) -> str:
    return str(getattr(plugin, "typed_name", type(plugin).__name__))


def check_role(plugin: Any, role: str) -> None:
    """``plugin`` declares everything start-up requires of ``role`` (a key of
    ``epp.plugin.conformance.ROLES``: ``filter``, ``parser``, ``producer``, ...; the one definition
    both use): e.g. a scorer's ``category`` is a ``ScorerCategory``, a producer publishes under
    ``<data type>/<its name>``."""
    missing = problems(plugin, role)
    assert not missing, f"{_name_of(plugin)}: start-up refuses it as a {role}: {'; '.join(missing)}"


def check_plugin_class(cls: type[Any], type_name: str) -> None:
    """``TYPE`` matches the registered name; ``Params`` is a frozen dataclass decoded strictly."""
    assert getattr(cls, "TYPE", None) == type_name, f"{cls.__name__}.TYPE != {type_name!r}"
    params: Any = getattr(cls, "Params", None)
    assert isinstance(params, type) and dataclasses.is_dataclass(params), (
        f"{type_name}: Params must be a dataclass"
    )
    assert vars(params)["__dataclass_params__"].frozen, f"{type_name}: Params must be frozen"
    try:
        decode(params, {"__notAField__": 1})
    except ParamError:
        pass
    else:
        raise AssertionError(f"{type_name}: unknown parameter keys must be rejected")


def _sync(value: Any, plugin: Any, method: str) -> Any:
    if inspect.iscoroutine(value):
        value.close()
    assert not inspect.isawaitable(value), f"{_name_of(plugin)}: {method}() must be synchronous"
    return value


def _call(method: Callable[..., Any], *args: Any) -> None:
    """Call a hook that returns nothing; it must not be a coroutine function."""
    out = method(*args)
    if inspect.iscoroutine(out):
        out.close()
    assert not inspect.isawaitable(out), f"{method.__qualname__} must be synchronous"


# ---- scheduling ----


def check_filter(
    flt: Filter, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> None:
    """A filter as start-up requires (``check_role``); the result is a subset of the input,
    deterministic, and the input is not mutated."""
    check_role(flt, "filter")
    request = request or sample_request()
    name = str(flt.typed_name)
    before = list(endpoints)
    out = flt.filter(_cycle(), request, endpoints)
    assert not inspect.isawaitable(out), f"{name}: filter() must be synchronous"
    ids = {e.id for e in endpoints}
    assert all(e.id in ids for e in out), f"{name}: filter() returned endpoints not given to it"
    assert [e.id for e in flt.filter(_cycle(), request, endpoints)] == [e.id for e in out], (
        f"{name}: filter() is not deterministic"
    )
    assert list(endpoints) == before, f"{name}: filter() mutated its input"
    flt.filter(_cycle(), request, [])


def check_scorer(
    scorer: Scorer, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> None:
    """A scorer as start-up requires (``check_role``); it scores every given endpoint and no
    other, each score a number in [0, 1]; deterministic and synchronous; the endpoints are not
    mutated; an empty list is accepted. A ``ListScorer``'s ``score_list`` returns one score per
    endpoint, each exactly the one ``score`` gives it (``check_score_list``)."""
    check_role(scorer, "scorer")
    request = request or sample_request()
    name = str(scorer.typed_name)
    before = copy.deepcopy(list(endpoints))
    first = scorer.score(_cycle(), request, endpoints)
    assert not inspect.isawaitable(first), f"{name}: score() must be synchronous"
    ids = {e.id for e in endpoints}
    assert set(first) <= ids, f"{name}: scored unknown endpoints {set(first) - ids}"
    assert set(first) >= ids, f"{name}: did not score endpoints {sorted(ids - set(first))}"
    for eid, value in first.items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (
            f"{name}: score of {eid} is not a number"
        )
        assert 0.0 <= value <= 1.0, f"{name}: score {value} of {eid} outside [0, 1]"
    again = scorer.score(_cycle(), request, endpoints)
    assert dict(first) == dict(again), f"{name}: scores differ between identical calls"
    assert list(endpoints) == before, f"{name}: score() mutated its input"
    scorer.score(_cycle(), request, [])
    if isinstance(scorer, ListScorer):
        check_score_list(scorer, endpoints, request)


def check_score_list(
    scorer: Scorer, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> None:
    """A ``ListScorer``: ``score_list`` is synchronous, returns one value per endpoint, and
    ``score_list(...)[i]`` equals ``score(...)[endpoints[i].id]`` (0 where ``score`` leaves the
    endpoint out); for no endpoints, an empty list. Endpoint ids
    must be unique here (with duplicates a mapping holds one score per id)."""
    name = str(scorer.typed_name)
    assert isinstance(scorer, ListScorer), f"{name}: has no score_list()"
    request = request or sample_request()
    by_id = scorer.score(_cycle(), request, endpoints)
    listed = scorer.score_list(_cycle(), request, endpoints)
    assert not inspect.isawaitable(listed), f"{name}: score_list() must be synchronous"
    assert len(listed) == len(endpoints), (
        f"{name}: score_list() returned {len(listed)} scores for {len(endpoints)} endpoints"
    )
    for e, value in zip(endpoints, listed, strict=True):
        expected = by_id.get(e.id, 0.0)
        assert isinstance(value, (int, float)) and value == expected, (
            f"{name}: score_list() gives {e.id} {value!r}, score() gives it {expected!r}"
        )
    assert len(scorer.score_list(_cycle(), request, [])) == 0, (
        f"{name}: score_list() of no endpoints is not empty"
    )


def check_picker(picker: Picker, endpoints: Sequence[Endpoint]) -> None:
    """Targets come from the scored candidates; a non-empty candidate list yields a target."""
    check_role(picker, "picker")
    name = str(picker.typed_name)
    scored = [ScoredEndpoint(e, (i % 7) / 7) for i, e in enumerate(endpoints)]
    result = picker.pick(_cycle(), scored)
    assert not inspect.isawaitable(result), f"{name}: pick() must be synchronous"
    ids = {e.id for e in endpoints}
    assert all(t.id in ids for t in result.targets), f"{name}: picked an unknown endpoint"
    if scored:
        assert result.targets, f"{name}: no target from a non-empty candidate list"
    assert len({t.id for t in result.targets}) == len(result.targets), f"{name}: duplicate targets"


def check_profile_handler(
    handler: ProfileHandler,
    profiles: Mapping[str, Profile],
    request: InferenceRequest,
    endpoints: Sequence[Endpoint],
) -> SchedulingResult:
    """Drives the handler as the scheduler does (each chosen profile "picks" the first endpoint):
    it chooses only given profiles, never one twice, stops within ``len(profiles) + 1`` rounds,
    and its result's primary profile is one that ran."""
    check_role(handler, "profile-handler")
    name = _name_of(handler)
    state = _cycle()
    results: dict[str, ProfileResult | None] = {}
    target = tuple(endpoints[:1])
    for _ in range(len(profiles) + 1):
        chosen = _sync(handler.pick_profiles(state, request, profiles, results), handler, "pick")
        if not chosen:
            break
        for key, profile in chosen.items():
            assert profiles.get(key) is profile, f"{name}: chose a profile it was not given: {key}"
            assert key not in results, f"{name}: chose profile {key!r} twice"
            results[key] = ProfileResult(targets=target, scores={e.id: 1.0 for e in target})
    else:
        raise AssertionError(f"{name}: still choosing profiles after {len(profiles) + 1} rounds")
    assert results, f"{name}: chose no profile"
    result = _sync(handler.process_results(state, request, results), handler, "process_results")
    assert isinstance(result, SchedulingResult), f"{name}: process_results() returned {result!r}"
    assert result.primary_profile in results, (
        f"{name}: primary profile {result.primary_profile!r} did not run"
    )
    return result


def check_decider(decider: Decider, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
    """``disaggregate`` is synchronous and answers a deterministic ``bool``."""
    check_role(decider, "decider")
    out = _sync(decider.disaggregate(_cycle(), request, endpoint), decider, "disaggregate")
    assert isinstance(out, bool), f"{_name_of(decider)}: disaggregate() returned {out!r}"
    assert decider.disaggregate(_cycle(), request, endpoint) is out, (
        f"{_name_of(decider)}: disaggregate() is not deterministic"
    )
    return out


# ---- request control ----


def check_parser(
    parser: Parser,
    path: str,
    body: bytes,
    malformed: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> ParseResult:
    """A parser parses the valid ``body`` at ``path`` deterministically into a ``ParseResult``
    whose raw body is the input; rewriting the model (when it says it can) gives a body that
    parses to the new model; a ``malformed`` body is refused with a 4xx ``InferenceError``;
    response parsing accepts an empty final chunk."""
    check_role(parser, "parser")
    name = _name_of(parser)
    headers = dict(headers or {"content-type": "application/json"})
    result = _sync(parser.parse_request(path, body, headers), parser, "parse_request")
    assert isinstance(result, ParseResult), f"{name}: parse_request() returned {result!r}"
    assert isinstance(result.model, str), f"{name}: the parsed model is not a string"
    assert result.body.raw == body, f"{name}: RequestBody.raw is not the body it was given"
    again = parser.parse_request(path, body, headers)
    assert (again.model, again.body.kind) == (result.model, result.body.kind), (
        f"{name}: parse_request() is not deterministic"
    )
    if parser.supports_model_rewrite and result.model:
        rewritten = parser.rewrite_model(result.body, "contract-check-model")
        assert isinstance(rewritten, bytes), f"{name}: rewrite_model() must return bytes"
        model = parser.parse_request(path, rewritten, headers).model
        assert model == "contract-check-model", f"{name}: rewritten body parses to {model!r}"
    if malformed is not None:
        try:
            parser.parse_request(path, malformed, headers)
        except InferenceError as exc:
            status = exc.code.http_status
            assert 400 <= status < 500, f"{name}: malformed body refused with {status}, not 4xx"
        else:
            raise AssertionError(f"{name}: accepted a malformed body {malformed[:40]!r}")
    state = parser.new_response_state({"content-type": "application/json"})
    parsed = state.feed(b"", True)
    assert isinstance(parsed, ParsedResponse), f"{name}: feed() returned {parsed!r}"
    return result


async def check_producer(
    producer: DataProducer,
    request: InferenceRequest,
    endpoints: Sequence[Endpoint],
    *,
    must_publish: bool = True,
) -> None:
    """A producer as start-up requires; ``produce`` finishes within its timeout
    (``ProducerTimeout``, else the Director's 400 ms) and publishes only under the keys
    ``produces()`` declares (data keys, ``<type>/<producer>``: private scratch entries under
    other key shapes are the producer's own); with ``must_publish`` (the default) it publishes
    every one of them. Pass ``must_publish=False`` for a producer in its degraded mode (its
    service unreachable, or nothing in the request for it)."""
    check_role(producer, "producer")
    name = _name_of(producer)
    declared = producer.produces()
    timeout = (
        float(producer.produce_timeout())
        if isinstance(producer, ProducerTimeout)
        else DEFAULT_PRODUCE_TIMEOUT
    )
    before = set(request.attributes)
    try:
        async with asyncio.timeout(timeout):
            await producer.produce(request, endpoints)
    except TimeoutError:
        raise AssertionError(f"{name}: produce() took longer than its {timeout} s") from None
    published = {k for k in set(request.attributes) - before if _is_data_key(k)}
    undeclared = published - set(declared)
    assert not undeclared, f"{name}: published undeclared keys {sorted(undeclared)}"
    if must_publish:
        absent = set(declared) - set(request.attributes)
        assert not absent, f"{name}: did not publish declared keys {sorted(absent)}"


def _is_data_key(key: object) -> bool:
    """A ``<data type>/<producer>`` key: a publication (a producer may keep private scratch on the
    request under another key shape)."""
    return isinstance(key, str) and "/" in key


def check_screener(
    screener: Screener, request: InferenceRequest, endpoints: Sequence[Endpoint]
) -> list[Endpoint]:
    """``screen`` is synchronous and keeps a subset of the candidates it is given (no endpoint of
    its own, none twice), the same one for the same random seed; the candidates are not mutated;
    no candidates give none. Returns what it kept."""
    check_role(screener, "screener")
    name = _name_of(screener)
    before = list(endpoints)
    kept = list(_sync(screener.screen(_cycle(), request, endpoints), screener, "screen"))
    assert list(endpoints) == before, f"{name}: screen() mutated its input"
    ids = {e.id for e in before}
    assert all(isinstance(e, Endpoint) and e.id in ids for e in kept), (
        f"{name}: screen() returned endpoints it was not given"
    )
    assert len({e.id for e in kept}) == len(kept), f"{name}: screen() kept an endpoint twice"
    again = [e.id for e in screener.screen(_cycle(), request, endpoints)]
    assert again == [e.id for e in kept], f"{name}: screen() differs for the same random seed"
    none = _sync(screener.screen(_cycle(), request, []), screener, "screen")
    assert not list(none), f"{name}: screen() of no candidates kept {list(none)!r}"
    return kept


def check_admitter(
    admitter: Admitter, request: InferenceRequest, endpoints: Sequence[Endpoint]
) -> InferenceError | None:
    """``admit`` is synchronous, deterministic for one random seed, and answers ``None`` (admit)
    or an ``InferenceError``; endpoints are not mutated."""
    check_role(admitter, "admitter")
    name = _name_of(admitter)
    before = list(endpoints)
    out = _sync(admitter.admit(_cycle(), request, endpoints), admitter, "admit")
    assert out is None or isinstance(out, InferenceError), f"{name}: admit() returned {out!r}"
    again = admitter.admit(_cycle(), request, endpoints)
    assert type(again) is type(out), f"{name}: admit() differs for the same random seed"
    assert list(endpoints) == before, f"{name}: admit() mutated its input"
    return out


def check_saturation_detector(detector: SaturationDetector, endpoints: Sequence[Endpoint]) -> float:
    """``saturation`` is synchronous, a finite number >= 0 (1.0 = saturated), deterministic, and
    defined for an empty pool."""
    check_role(detector, "saturation-detector")
    name = _name_of(detector)
    for eps in (endpoints, []):
        value = _sync(detector.saturation(1000.0, eps), detector, "saturation")
        assert isinstance(value, (int, float)), f"{name}: saturation() returned {value!r}"
        assert 0.0 <= value < float("inf"), f"{name}: saturation {value} is not in [0, inf)"
        assert detector.saturation(1000.0, eps) == value, f"{name}: saturation() not deterministic"
    return float(detector.saturation(1000.0, endpoints))


def check_hooks(plugin: Any, request: InferenceRequest, result: SchedulingResult) -> None:
    """Every request-header / pre-request / response hook ``plugin`` implements runs synchronously
    on a request routed to ``result`` and its 200 response without raising; response headers it
    sets are strings; ``request.body`` is still ``None`` when the request-header hook runs. The
    response hooks get the request as the server gives it to them, its content released
    (``epp.plugin.routed``): a copy, so ``request`` itself keeps its body."""
    name = _name_of(plugin)
    if isinstance(plugin, RequestHeaderProcessor):
        check_role(plugin, "request-header")
        early = InferenceRequest(request_id=request.request_id, headers=request.headers)
        _call(plugin.request_header, early)
    if isinstance(plugin, PreRequest):
        check_role(plugin, "pre-request")
        _call(plugin.pre_request, request, result)
    body = dataclasses.replace(request.body) if request.body is not None else None
    request = dataclasses.replace(request, body=body, attributes=dict(request.attributes))
    release_content(request)
    served = result.primary.targets[0].hostport if result.primary.targets else ""
    response = ResponseInfo(request.request_id, {":status": "200"}, served_endpoint=served)
    if isinstance(plugin, ResponseHeaders):
        check_role(plugin, "response-headers")
        set_headers: dict[str, str] = {}
        _call(plugin.response_headers, request, response, set_headers)
        bad = {k: v for k, v in set_headers.items() if not isinstance(v, str)}
        assert not bad, f"{name}: response headers must be strings: {bad}"
    if isinstance(plugin, ResponseStreaming):
        check_role(plugin, "response-streaming")
        _call(plugin.response_streaming, request, response)
    if isinstance(plugin, ResponseComplete):
        check_role(plugin, "response-complete")
        response.end_of_stream = True
        _call(plugin.response_complete, request, response)


# ---- data layer ----


async def check_data_source(source: DataSource, endpoint: Endpoint, *, bound: float = 10.0) -> None:
    """Started (when it has a ``Lifecycle``), ``poll`` of ``endpoint`` ends within ``bound``
    seconds with bytes or an exception (an unreachable endpoint is the degraded mode the
    collector counts); a ``PollInterval`` is >= 0; ``stop`` ends it."""
    check_role(source, "data-source")
    name = _name_of(source)
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
    name = _name_of(extractor)
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


async def check_discovery(discovery: Discovery, *, bound: float = 10.0) -> list[Endpoint]:
    """``run`` publishes an endpoint set within ``bound`` seconds and, cancelled, ends."""
    check_role(discovery, "discovery")
    name = _name_of(discovery)
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


def check_endpoint_listener(plugin: Any, endpoint: Endpoint) -> None:
    """An ``EndpointSource`` passes an endpoint's add and delete events on (or drops them with
    ``None``); an ``EndpointExtractor`` hears them synchronously and returns ``None`` or a mapping
    of attributes."""
    name = _name_of(plugin)
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
    name = _name_of(plugin)
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


# ---- flow control ----


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
    name = _name_of(policy)
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
    name = _name_of(policy)
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
    name = _name_of(policy)
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
    name = _name_of(policy)
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
    name = _name_of(policy)
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
    assert isinstance(value, int), f"{_name_of(adjuster)}: adjusted_priority() returned {value!r}"
    adjuster.on_dispatch(request, 1000.0)
    adjuster.on_done(request, 1001.0)


# ---- sharing between replicas ----


def check_shared_state(plugin: SharedState, peer: SharedState) -> None:
    """``export_facts`` is a list, and a fresh ``peer`` of the same type applies it (and a second,
    duplicated delivery) without raising."""
    check_role(plugin, "shared-state")
    facts = plugin.export_facts()
    assert isinstance(facts, list), f"{_name_of(plugin)}: export_facts() returned {facts!r}"
    peer.apply_facts(facts, "peer-replica")
    peer.apply_facts(facts, "peer-replica")


async def check_replica_syncer(syncer: ReplicaSyncer, *, bound: float = 10.0) -> None:
    """A stable, non-empty ``replica_id``; a positive ``bootstrap_timeout``; after ``bind``,
    ``publish``, ``replay`` and ``receive`` each end within ``bound`` seconds, with a result or an
    exception (the transport being unavailable is the degraded mode the engine retries)."""
    check_role(syncer, "replica-syncer")
    name = _name_of(syncer)
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

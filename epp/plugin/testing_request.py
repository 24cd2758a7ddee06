"""Contract checks for the request-path roles other than filter, scorer and picker: parsers,
data producers, screeners, admitters, saturation detectors, profile handlers, deciders,
request-header processors and the pre-request / response hooks. Re-exported by
``epp.plugin.testing``.

Each check first applies ``epp.plugin.conformance`` (the rules start-up enforces for the role),
then exercises the role with the input given, and raises ``AssertionError`` naming the plugin and
the broken rule.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from epp.plugin.capabilities import ProducerTimeout
from epp.plugin.conformance import problems
from epp.plugin.errors import InferenceError
from epp.plugin.protocols import (
    Admitter,
    DataProducer,
    Decider,
    Parser,
    PreRequest,
    Profile,
    ProfileHandler,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseHeaders,
    ResponseStreaming,
    SaturationDetector,
    Screener,
)
from epp.plugin.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ParsedResponse,
    ParseResult,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
)

DEFAULT_PRODUCE_TIMEOUT = 0.4
"""The Director's budget for a producer without ``ProducerTimeout`` (seconds)."""


def cycle(seed: int = 0) -> CycleState:
    return CycleState(now=1000.0, rng=random.Random(seed))


def name_of(plugin: Any) -> str:
    return str(getattr(plugin, "typed_name", type(plugin).__name__))


def check_role(plugin: Any, role: str) -> None:
    """``plugin`` declares everything start-up requires of ``role`` (a key of
    ``epp.plugin.conformance.ROLES``: ``filter``, ``parser``, ``producer``, ...; the one definition
    both use): e.g. a scorer's ``category`` is a ``ScorerCategory``, a producer publishes under
    ``<data type>/<its name>``."""
    missing = problems(plugin, role)
    assert not missing, f"{name_of(plugin)}: start-up refuses it as a {role}: {'; '.join(missing)}"


def _sync(value: Any, plugin: Any, method: str) -> Any:
    if inspect.iscoroutine(value):
        value.close()
    assert not inspect.isawaitable(value), f"{name_of(plugin)}: {method}() must be synchronous"
    return value


def _call(method: Callable[..., Any], *args: Any) -> None:
    """Call a hook that returns nothing; it must not be a coroutine function."""
    out = method(*args)
    if inspect.iscoroutine(out):
        out.close()
    assert not inspect.isawaitable(out), f"{method.__qualname__} must be synchronous"


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
    name = name_of(parser)
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
    name = name_of(producer)
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
    name = name_of(screener)
    before = list(endpoints)
    kept = list(_sync(screener.screen(cycle(), request, endpoints), screener, "screen"))
    assert list(endpoints) == before, f"{name}: screen() mutated its input"
    ids = {e.id for e in before}
    assert all(isinstance(e, Endpoint) and e.id in ids for e in kept), (
        f"{name}: screen() returned endpoints it was not given"
    )
    assert len({e.id for e in kept}) == len(kept), f"{name}: screen() kept an endpoint twice"
    again = [e.id for e in screener.screen(cycle(), request, endpoints)]
    assert again == [e.id for e in kept], f"{name}: screen() differs for the same random seed"
    none = _sync(screener.screen(cycle(), request, []), screener, "screen")
    assert not list(none), f"{name}: screen() of no candidates kept {list(none)!r}"
    return kept


def check_admitter(
    admitter: Admitter, request: InferenceRequest, endpoints: Sequence[Endpoint]
) -> InferenceError | None:
    """``admit`` is synchronous, deterministic for one random seed, and answers ``None`` (admit)
    or an ``InferenceError``; endpoints are not mutated."""
    check_role(admitter, "admitter")
    name = name_of(admitter)
    before = list(endpoints)
    out = _sync(admitter.admit(cycle(), request, endpoints), admitter, "admit")
    assert out is None or isinstance(out, InferenceError), f"{name}: admit() returned {out!r}"
    again = admitter.admit(cycle(), request, endpoints)
    assert type(again) is type(out), f"{name}: admit() differs for the same random seed"
    assert list(endpoints) == before, f"{name}: admit() mutated its input"
    return out


def check_saturation_detector(detector: SaturationDetector, endpoints: Sequence[Endpoint]) -> float:
    """``saturation`` is synchronous, a finite number >= 0 (1.0 = saturated), deterministic, and
    defined for an empty pool."""
    check_role(detector, "saturation-detector")
    name = name_of(detector)
    for eps in (endpoints, []):
        value = _sync(detector.saturation(1000.0, eps), detector, "saturation")
        assert isinstance(value, (int, float)), f"{name}: saturation() returned {value!r}"
        assert 0.0 <= value < float("inf"), f"{name}: saturation {value} is not in [0, inf)"
        assert detector.saturation(1000.0, eps) == value, f"{name}: saturation() not deterministic"
    return float(detector.saturation(1000.0, endpoints))


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
    name = name_of(handler)
    state = cycle()
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
    out = _sync(decider.disaggregate(cycle(), request, endpoint), decider, "disaggregate")
    assert isinstance(out, bool), f"{name_of(decider)}: disaggregate() returned {out!r}"
    assert decider.disaggregate(cycle(), request, endpoint) is out, (
        f"{name_of(decider)}: disaggregate() is not deterministic"
    )
    return out


def check_hooks(plugin: Any, request: InferenceRequest, result: SchedulingResult) -> None:
    """Every request-header / pre-request / response hook ``plugin`` implements runs synchronously
    on a request routed to ``result`` and its 200 response without raising; response headers it
    sets are strings; ``request.body`` is still ``None`` when the request-header hook runs."""
    name = name_of(plugin)
    if isinstance(plugin, RequestHeaderProcessor):
        check_role(plugin, "request-header")
        early = InferenceRequest(request_id=request.request_id, headers=request.headers)
        _call(plugin.request_header, early)
    if isinstance(plugin, PreRequest):
        check_role(plugin, "pre-request")
        _call(plugin.pre_request, request, result)
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

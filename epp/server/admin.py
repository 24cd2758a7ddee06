"""The admin gRPC API (``proto/epp/admin/v1/admin.proto``), served on the ext_proc port by
``epp.server.h2`` (each method a unary handler: request bytes and the ``authorization`` header
in, response bytes out, an :class:`AdminError` for a gRPC status).

- ``Explain``: the request is parsed, its target model and candidates resolved, the data
  producers run and the scheduler scores every candidate with every scorer, as for a routed
  request (``Director.decide(dry_run=True)``), but nothing is admitted, no pre-request hook runs
  and nothing is recorded: explaining a request changes no routing state. The answer is the
  entry ``/debug/decisions`` would show (``decision_entry``), with every candidate.
- ``ListEndpoints``: the endpoints with their last scraped metrics, the metrics' age, extractor
  attributes, role and rank.
- ``DumpState``: what each ``StateDumper`` plugin reports (prefix index, sessions, ...), the
  flow-control queues and the cross-replica sharing lag.

Auth is the debug views' (``--metrics-endpoint-auth``): every call carries ``authorization:
Bearer <token>``, judged as a ``get`` of the non-resource path ``/debug/admin`` (in Kubernetes
mode a TokenReview and SubjectAccessReview, so a grant of ``/debug/*`` covers it; else
``$EPP_METRICS_TOKEN``). ``--admin-token-file`` adds a token of its own that is always accepted.
A missing or wrong token gets UNAUTHENTICATED, a refused one PERMISSION_DENIED, a review that
fails UNAVAILABLE. With neither configured the API is open, as the debug views are.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from epp._proto import epp_admin_v1_pb2 as pb
from epp.config.loader import ConfigError
from epp.flowcontrol.controller import FlowController
from epp.observability.auth import Reviewer
from epp.observability.decisions import EXPLAIN_HEADER, clip, decision_entry
from epp.plugin import Endpoint, InferenceError, StateDumper, wire
from epp.plugin.roles import role_of
from epp.requestcontrol.director import Director
from epp.state.sync import StateSync

# gRPC status codes the API answers with
UNAUTHENTICATED: Final = 16
PERMISSION_DENIED: Final = 7
UNAVAILABLE: Final = 14

ADMIN_PATH = "/debug/admin"
"""The non-resource path an admin call is reviewed as (a grant of ``/debug/*`` covers it)."""
SERVICE = "epp.admin.v1.Admin"
DEFAULT_PATH = "/v1/completions"


@dataclass(frozen=True)
class AdminSources:
    """What the admin API reads, each when asked."""

    director: Director
    endpoints: Callable[[], Sequence[Endpoint]]
    dumpers: Sequence[StateDumper]
    flow: FlowController | None = None
    sync: StateSync | None = None
    token: str = ""
    """``--admin-token-file``'s token, always accepted; empty: none."""
    reviewer: Reviewer | None = None
    """The metrics port's reviewer (``epp.observability.auth``); ``None``: no auth there."""


def read_token(path: str) -> str:
    """The bearer token in the file at ``path`` (``""`` for no path); a file that cannot be read
    or holds no token stops the EPP at startup."""
    if not path:
        return ""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--admin-token-file: {exc}") from None
    if not token:
        raise ConfigError(f"--admin-token-file: {path} holds no token")
    return token


class AdminError(Exception):
    """A call refused with gRPC status ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_UNAUTHENTICATED = AdminError(UNAUTHENTICATED, "a valid bearer token is required")


class AdminServicer:
    def __init__(self, sources: AdminSources) -> None:
        self._src = sources
        self._methods: dict[str, Callable[[bytes, str], Awaitable[bytes]]] = {
            "Explain": self._unary(self.explain, pb.ExplainRequest),
            "ListEndpoints": self._unary(self.list_endpoints, pb.ListEndpointsRequest),
            "DumpState": self._unary(self.dump_state, pb.DumpStateRequest),
        }

    def method(self, name: str) -> Callable[[bytes, str], Awaitable[bytes]] | None:
        """The handler of method ``name`` of ``epp.admin.v1.Admin`` (``None``: no such method):
        (request bytes, ``authorization`` header) → response bytes."""
        return self._methods.get(name)

    def _unary(
        self, fn: Callable[[Any], Awaitable[Any]], request: Any
    ) -> Callable[[bytes, str], Awaitable[bytes]]:
        async def call(payload: bytes, authorization: str) -> bytes:
            await self._authorize(authorization)
            reply = await fn(request.FromString(payload))
            return bytes(reply.SerializeToString())

        return call

    async def _authorize(self, authorization: str) -> None:
        """Raises :class:`AdminError` unless ``authorization`` carries an accepted token."""
        own, reviewer = self._src.token, self._src.reviewer
        if not own and reviewer is None:
            return
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise _UNAUTHENTICATED
        if own and hmac.compare_digest(token.encode(), own.encode()):
            return
        if reviewer is None:
            raise _UNAUTHENTICATED
        try:
            verdict = await reviewer.review(token, ADMIN_PATH, "get")
        except Exception as exc:  # the cluster could not be asked: refuse, never allow
            raise AdminError(UNAVAILABLE, f"token review failed: {exc!r}") from None
        if verdict.status == 401:
            raise _UNAUTHENTICATED
        if verdict.status != 200:
            raise AdminError(PERMISSION_DENIED, f"may not get {ADMIN_PATH}")

    async def explain(self, req: pb.ExplainRequest) -> pb.ExplainResponse:
        headers = {k.lower(): v for k, v in req.headers.items()}
        headers.setdefault(":path", DEFAULT_PATH)
        headers[EXPLAIN_HEADER] = "true"  # every scorer's score, whatever the pool size
        metadata: dict[str, Any] = {}
        if req.has_subset_hint:
            metadata[wire.SUBSET_NAMESPACE] = {wire.SUBSET_KEY: list(req.subset_hint)}
        director = self._src.director
        request = director.new_request(headers)
        t0 = time.perf_counter()
        try:
            decision = await director.decide(request, req.body, metadata, dry_run=True)
        except InferenceError as err:
            return pb.ExplainResponse(
                outcome="rejected",
                request_id=clip(request.request_id),
                path=clip(request.path),
                model=clip(request.incoming_model),
                status=err.code.http_status,
                error=clip(err.body),
            )
        entry = decision_entry(
            decision.request,
            decision.result,
            decision.candidates,
            time.perf_counter() - t0,
            top=len(decision.candidates),
        )
        return _explain_response(entry, decision.destination)

    async def list_endpoints(self, _: pb.ListEndpointsRequest) -> pb.ListEndpointsResponse:
        now = time.monotonic()
        return pb.ListEndpointsResponse(
            endpoints=[_endpoint(e, now) for e in self._src.endpoints()]
        )

    async def dump_state(self, _: pb.DumpStateRequest) -> pb.DumpStateResponse:
        plugins = [
            pb.PluginState(
                type=p.typed_name.type,
                name=p.typed_name.name,
                json=json.dumps(dict(p.dump_state()), default=str, sort_keys=True),
            )
            for p in self._src.dumpers
        ]
        flow, sync = self._src.flow, self._src.sync
        flow_state = pb.FlowControlState(enabled=flow is not None)
        if flow is not None:
            flow_state.in_flight = flow.in_flight()
            for priority in flow.priorities():
                flow_state.queued_by_priority[priority] = flow.queued(priority)
        sharing = pb.SharingState(enabled=sync is not None)
        if sync is not None:
            sharing.lag_seconds = sync.lag()
            sharing.bootstrapped = sync.bootstrapped
            sharing.outbox_facts = sync.outbox_size
        return pb.DumpStateResponse(plugins=plugins, flow_control=flow_state, sharing=sharing)


def _explain_response(entry: Mapping[str, Any], destination: str) -> pb.ExplainResponse:
    profiles = [
        pb.ProfileExplain(
            name=name,
            targets=profile["targets"],
            scores=[
                pb.CandidateScore(
                    endpoint=s["endpoint"],
                    id=s["id"],
                    total=s["total"],
                    scorers=s.get("scorers", {}),
                )
                for s in profile["scores"]
            ],
        )
        for name, profile in entry["profiles"].items()
    ]
    return pb.ExplainResponse(
        outcome=entry["outcome"],
        request_id=entry["requestId"],
        path=entry["path"],
        model=entry["model"],
        target_model=entry["targetModel"],
        objective=entry["objective"],
        priority=entry["priority"],
        fairness_id=entry["fairnessId"],
        candidates=entry["candidates"],
        primary_profile=entry["primaryProfile"],
        profiles=profiles,
        destination=destination,
        scheduling_seconds=entry["schedulingSeconds"],
    )


def _endpoint(e: Endpoint, now: float) -> pb.EndpointInfo:
    info = pb.EndpointInfo(
        id=e.id, address=e.hostport, rank=e.rank, role=role_of(e), labels=dict(e.labels)
    )
    m = e.metrics
    if m is None:
        return info
    info.scraped = bool(m.update_time)
    info.age_seconds = now - m.update_time if m.update_time else 0.0
    info.waiting_queue_size = m.waiting_queue_size
    info.running_requests_size = m.running_requests_size
    info.kv_cache_usage_percent = m.kv_cache_usage_percent
    info.active_models.extend(sorted(m.active_models))
    info.waiting_models.extend(sorted(m.waiting_models))
    info.max_active_models = m.max_active_models
    info.cache_block_size = m.cache_block_size
    info.cache_num_blocks = m.cache_num_blocks
    info.custom.update(m.custom)
    for key, value in m.attributes.items():
        info.attributes[str(key)] = clip(str(value))
    return info

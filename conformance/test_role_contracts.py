"""Every role of every installed plugin type, checked by the contract kit (``epp.plugin.testing``)
with a small realistic input. Filters, scorers and pickers are in ``test_plugin_contract``; this
module covers every other role, and asserts that no built-in type goes unchecked.

Types that need an external service (Redis, a KV-event publisher, a DCGM exporter, a model
server's ``/metrics``) are checked in their degraded mode: the service is a loopback port this
test bound and closed, and the plugin must answer (an exception, no data) within its bound.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.test_plugin_contract import TYPES, build
from epp._proto import epp_vertexai_v1_pb2 as vertex
from epp._proto import epp_vllmgrpc_v1_pb2 as vllm
from epp.plugin import Endpoint, Lifecycle, ProfileResult, SchedulingResult
from epp.plugin.conformance import ROLES, SCHEDULING_ROLES, refusals, slotted_roles
from epp.plugin.protocols import Profile
from epp.plugin.testing import (
    check_admitter,
    check_data_source,
    check_decider,
    check_discovery,
    check_endpoint_listener,
    check_eviction_filter_policy,
    check_eviction_ordering_policy,
    check_extractor,
    check_fairness_policy,
    check_hooks,
    check_notification_listener,
    check_ordering_policy,
    check_parser,
    check_priority_adjuster,
    check_producer,
    check_profile_handler,
    check_replica_syncer,
    check_saturation_detector,
    check_screener,
    check_shared_state,
    check_usage_limit_policy,
    sample_endpoints,
    sample_eviction_items,
    sample_queue,
    sample_request,
)
from epp.plugins.parsers.grpcwire import frame

CHAT = b'{"model":"m","messages":[{"role":"user","content":"Hello there, how are you today?"}]}'
# parser type -> (path, a valid body, a malformed body or None when every body is valid)
PARSER_SAMPLES: dict[str, tuple[str, bytes, bytes | None]] = {
    "openai-parser": ("/v1/chat/completions", CHAT, b'{"model": "m", "messages": '),
    "anthropic-parser": (
        "/v1/messages",
        b'{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}',
        b'["not", "an", "object"]',
    ),
    "vllmhttp-parser": (
        "/inference/v1/generate",
        b'{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":16}}',
        b'{"model":"m","token_ids":"1,2,3"}',
    ),
    "sglanghttp-parser": (
        "/generate",
        b'{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":16}}',
        b'{"text":"no input_ids"}',
    ),
    "vertexai-parser": (
        "/google.cloud.aiplatform.v1.PredictionService/ChatCompletions",
        frame(
            vertex.ChatCompletionsRequest(http_body=vertex.HttpBody(data=CHAT)).SerializeToString()
        ),
        frame(b"\x12\x03{}]"),  # an HttpBody whose JSON is no chat request
    ),
    "vllmgrpc-parser": (
        "/vllm.grpc.engine.VllmEngine/Generate",
        frame(
            vllm.GenerateRequest(
                tokenized=vllm.TokenizedInput(input_ids=[1, 2, 3])
            ).SerializeToString()
        ),
        frame(vllm.GenerateRequest(request_id="no input").SerializeToString()),
    ),
    "passthrough-parser": ("/v1/anything", b"any bytes at all", None),  # accepts every body
}
# producer type -> why it may publish nothing for the sample chat request
DEGRADED_PRODUCERS: dict[str, str] = {
    "mm-embeddings-cache-producer": "publishes only for requests with image, audio or video parts",
    "p2p-source-producer": "publishes only when a candidate caches part of the prompt",
    "predicted-latency-producer": "publishes once its in-process model has learned from completed "
    "requests (or its sidecar answers); warmed up, it is checked in its unit tests",
}
METRICS = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n"
# extractor type -> a payload of its source
PAYLOADS: dict[str, bytes] = {
    "dcgm-extractor": b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 42\n',
    "models-data-extractor": b'{"object":"list","data":[{"id":"m","object":"model"}]}',
    "multicluster-metrics-extractor": (
        b'llm_d_epp_average_kv_cache_utilization{name="pool"} 0.25\n'
        b'llm_d_epp_average_queue_size{name="pool"} 1.5\n'
    ),
}


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port this test bound and closed: nothing listens there."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    yield port


def chat_request() -> Any:
    parser = build("openai-parser")
    parsed = parser.parse_request("/v1/chat/completions", CHAT, {})
    headers = {"content-type": "application/json", "x-session-id": "session-1"}
    return sample_request(
        path="/v1/chat/completions", headers=headers, body=parsed.body, size_bytes=len(CHAT)
    )


def routed(endpoints: list[Endpoint]) -> SchedulingResult:
    result = ProfileResult(targets=tuple(endpoints[:1]), scores={endpoints[0].id: 1.0})
    return SchedulingResult({"decode": result, "prefill": result}, "decode")


def profiles_for(handler: Any) -> dict[str, Profile]:
    picker = build("max-score-picker")
    names = {
        getattr(source, attr, None)
        for source in (handler, handler.params)
        for attr in ("decode_profile", "prefill_profile", "encode_profile")
    } - {None}
    return {str(n): Profile(str(n), (), (), picker) for n in (names or {"default"})}


async def check_all_roles(type_name: str, plugin: Any, port: int, tmp_path: Path) -> set[str]:
    """Run the kit's check of every role start-up would slot ``plugin`` into; those roles."""
    roles = set(slotted_roles(plugin))
    assert not refusals(plugin), f"{type_name}: start-up refuses it: {refusals(plugin)}"
    eps = sample_endpoints(5)
    dead = Endpoint(
        id="default/dead", name="dead", namespace="default", address="127.0.0.1", port=port
    )
    request = chat_request()
    if "parser" in roles:
        check_parser(plugin, *PARSER_SAMPLES[type_name])
    if "producer" in roles:
        if isinstance(plugin, Lifecycle):
            await plugin.start()
        try:
            degraded = type_name in DEGRADED_PRODUCERS
            await check_producer(plugin, request, eps, must_publish=not degraded)
        finally:
            if isinstance(plugin, Lifecycle):
                await plugin.stop()
    if "data-source" in roles:
        await check_data_source(plugin, dead)
    if "extractor" in roles:
        check_extractor(plugin, PAYLOADS.get(type_name, METRICS), eps[0])
    if roles & {"endpoint-source", "endpoint-extractor"}:
        check_endpoint_listener(plugin, eps[0])
    if roles & {"notification-source", "notification-extractor"}:
        check_notification_listener(plugin)
    if "discovery" in roles:
        await check_discovery(build_discovery(tmp_path, type_name))
    if "screener" in roles:
        check_screener(plugin, request, eps)
    if "admitter" in roles:
        check_admitter(plugin, request, eps)
    if "saturation-detector" in roles:
        check_saturation_detector(plugin, eps)
    if "profile-handler" in roles:
        check_profile_handler(plugin, profiles_for(plugin), request, eps)
    if "decider" in roles:
        check_decider(plugin, request, eps[0])
    if roles & {"request-header", "pre-request", "response-headers", "response-streaming",
                "response-complete"}:  # fmt: skip
        check_hooks(plugin, request, routed(eps))
    if "ordering-policy" in roles:
        check_ordering_policy(plugin, sample_queue(6))
    if "fairness-policy" in roles:
        queues = [sample_queue(3, fairness_id=f) for f in ("a", "b", "c")]
        check_fairness_policy(plugin, build("fcfs-ordering-policy"), queues)
    if "usage-limit-policy" in roles:
        check_usage_limit_policy(plugin, [10, 5, 0, -5])
    if "priority-adjuster" in roles:
        check_priority_adjuster(plugin, request)
    if "eviction-filter-policy" in roles:
        check_eviction_filter_policy(plugin, sample_eviction_items(8))
    if "eviction-ordering-policy" in roles:
        check_eviction_ordering_policy(plugin, sample_eviction_items(8))
    if "shared-state" in roles:
        check_shared_state(plugin, build(type_name))
    if "replica-syncer" in roles:
        syncer = build_syncer(port)
        await check_replica_syncer(syncer)
        assert syncer.dump_state()["lastError"], "the syncer does not say Redis is unreachable"
    return roles


# Every role has a check: above, or for filters, scorers and pickers in test_plugin_contract;
# "consumer" is a declaration only (``refusals`` checks its keys).
CHECKED_ROLES = frozenset(ROLES) - {"consumer"}


def build_discovery(tmp_path: Path, type_name: str) -> Any:
    path = tmp_path / "endpoints.yaml"
    path.write_text("endpoints:\n- name: vllm-0\n  address: 127.0.0.1\n  port: 8000\n")
    return build(type_name, {"path": str(path)})


def build_syncer(port: int) -> Any:
    return build("redis-syncer", {"url": f"redis://127.0.0.1:{port}/0"})


@pytest.mark.parametrize("type_name", TYPES)
async def test_every_role_contract(type_name: str, dead_port: int, tmp_path: Path) -> None:
    plugin = build(type_name)
    roles = await check_all_roles(type_name, plugin, dead_port, tmp_path)
    assert roles, f"{type_name} fills no role the contract kit knows"


def test_no_builtin_type_is_skipped() -> None:
    """Every installed type (the 70-odd built-in ones included) fills at least one role the kit
    checks: none is skipped."""
    unchecked = sorted(t for t in TYPES if not set(slotted_roles(build(t))) & CHECKED_ROLES)
    assert not unchecked
    assert len(TYPES) >= 70


def test_every_role_has_a_check() -> None:
    """A role added to ``epp.plugin.conformance.ROLES`` without a branch in ``check_all_roles``
    fails here: the branches are read from the source of ``check_all_roles``."""
    import inspect

    source = inspect.getsource(check_all_roles)
    elsewhere = set(SCHEDULING_ROLES)  # test_plugin_contract.test_role_contract
    missing = sorted(r for r in CHECKED_ROLES - elsewhere if f'"{r}"' not in source)
    assert not missing

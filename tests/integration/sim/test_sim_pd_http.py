"""P/D between simulated pods over real HTTP on 127.0.0.1: a decode pod given
``x-prefiller-host-port`` runs the prefill leg on that pod, pulls the KV and decodes; a prefill
pod serves only prefills; a failed prefill reaches the client. Then through a real Envoy and an
EPP whose only P/D piece is a plugin setting the header, to show any such config works."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar

import aiohttp
import pytest

from epp.plugin import InferenceRequest, PluginBase, SchedulingResult
from epp.plugin.registry import GROUP, PluginInfo, PluginRegistry
from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet
from tests.conftest import post, registry_with_test_plugins

MODEL = "sim-model"
PROMPT = "disaggregate this prompt " * 40
TOKENS = 259  # the rendered chat prompt: 17 blocks of 16, the last one partial


def chat(max_tokens: int = 6, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def stream_usage(raw: bytes) -> tuple[int, dict[str, Any]]:
    """(content chunks, usage) of a streamed chat answer."""
    chunks, usage = 0, {}
    for line in raw.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        chunks += sum(1 for c in event["choices"] if c["delta"].get("content"))
    return chunks, usage


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    roles = (("pod-p", "prefill"), ("pod-d", "decode"), ("pod-b", "both"))
    configs = [
        PodConfig(name=name, role=role, time_scale=50.0, lora_adapters=("ad1",) * (i > 0))  # type: ignore[arg-type]
        for i, (name, role) in enumerate(roles)
    ]
    async with SimFleet(configs) as f:
        yield f


async def stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/sim/stats") as r:
        return dict(await r.json())


async def test_decode_pod_prefills_on_the_named_pod_then_decodes_when_header_is_set(
    fleet: SimFleet,
) -> None:
    prefill, decode = fleet.urls[0], fleet.urls[1]
    header = {"x-prefiller-host-port": f"127.0.0.1:{fleet.ports[0]}"}
    status, headers, raw = await post(f"{decode}/v1/chat/completions", chat(), header)
    assert status == 200, raw[:300]
    assert (headers["x-sim-pod"], headers["x-sim-role"]) == ("pod-d", "decode")
    assert headers["x-sim-prefill-pod"] == "pod-p"
    chunks, usage = stream_usage(raw)
    assert (chunks, usage["completion_tokens"], usage["prompt_tokens"]) == (6, 6, TOKENS)
    p, d = await stats(prefill), await stats(decode)
    assert (p["role"], p["requests_received"], p["prefill_legs"], p["generation_tokens"]) == (
        "prefill",
        1,
        1,
        1,
    )
    assert (d["remote_prefills"], d["kv_transfer_blocks"], d["requests_received"]) == (1, 17, 1)
    assert d["kv_cached_blocks"] >= 16  # the pulled full blocks stay cached on the decode pod

    # Again: the prefill pod now hits its cache and the decode pod reports that count (as the
    # sidecar rewrites usage); the decode pod holds the full blocks, so it pulls only the tail.
    status, headers, raw = await post(f"{decode}/v1/chat/completions", chat(), header)
    _, usage = stream_usage(raw)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 256
    d = await stats(decode)
    assert (d["remote_prefills"], d["kv_transfer_blocks"]) == (2, 18)

    # Without the header (the decider kept the request aggregated) the decode pod prefills.
    status, headers, raw = await post(f"{decode}/v1/chat/completions", chat(model="ad1"))
    assert (status, headers["x-sim-prefill-pod"], stream_usage(raw)[0]) == (200, "pod-d", 6)
    assert (await stats(decode))["remote_prefills"] == 2


async def test_prefill_pod_answers_one_token_with_kv_params_when_called_directly(
    fleet: SimFleet,
) -> None:
    status, headers, raw = await post(
        f"{fleet.urls[0]}/v1/chat/completions", chat(50, stream=False)
    )
    assert status == 200
    assert (headers["x-sim-role"], headers["x-sim-prefill-pod"]) == ("prefill", "pod-p")
    answer = json.loads(raw)
    assert answer["usage"]["completion_tokens"] == 1
    assert answer["choices"][0]["finish_reason"] == "length"
    params = answer["kv_transfer_params"]
    assert (params["do_remote_prefill"], params["remote_engine_id"]) == (True, "pod-p")
    assert (len(params["remote_block_ids"]), params["remote_port"]) == (17, fleet.ports[0])
    # A prefill pod has no sidecar: the header is ignored there.
    header = {"x-prefiller-host-port": f"127.0.0.1:{fleet.ports[2]}"}
    status, headers, raw = await post(f"{fleet.urls[0]}/v1/chat/completions", chat(), header)
    assert (status, stream_usage(raw)[0], headers["x-sim-prefill-pod"]) == (200, 1, "pod-p")
    assert (await stats(fleet.urls[2]))["requests_received"] == 0


async def test_both_pod_serves_a_prefill_leg_when_the_body_asks_for_remote_decode(
    fleet: SimFleet,
) -> None:
    leg = chat(
        1,
        stream=False,
        kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False},
    )
    status, _, raw = await post(f"{fleet.urls[2]}/v1/chat/completions", leg)
    assert status == 200
    assert json.loads(raw)["kv_transfer_params"]["remote_engine_id"] == "pod-b"
    # The decode leg a real sidecar would send next: served with a KV pull, no prefill here.
    decode_leg = chat(4, kv_transfer_params=json.loads(raw)["kv_transfer_params"])
    status, headers, raw = await post(f"{fleet.urls[1]}/v1/chat/completions", decode_leg)
    assert (status, stream_usage(raw)[0], headers["x-sim-prefill-pod"]) == (200, 4, "pod-b")
    d = await stats(fleet.urls[1])
    assert (d["remote_prefills"], d["prefill_legs"]) == (1, 0)


async def test_failed_prefill_reaches_the_client_when_the_prefill_pod_refuses_or_is_gone(
    fleet: SimFleet,
) -> None:
    decode = f"{fleet.urls[1]}/v1/chat/completions"
    # pod-p has no LoRA adapter ad1: its 404 goes back as it is.
    header = {"x-prefiller-host-port": f"127.0.0.1:{fleet.ports[0]}"}
    status, headers, raw = await post(decode, chat(model="ad1"), header)
    assert status == 404
    assert headers["x-sim-pod"] == "pod-d" and "x-sim-prefill-pod" not in headers
    assert json.loads(raw)["error"]["message"] == "The model `ad1` does not exist."
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{sock.getsockname()[1]}"
    status, _, raw = await post(decode, chat(), {"x-prefiller-host-port": gone})
    assert status == 502
    assert f"prefill request to {gone} failed" in json.loads(raw)["error"]["message"]
    d = await stats(fleet.urls[1])
    assert (d["prefill_failures"], d["requests_received"]) == (2, 0)


# ---- through Envoy and the EPP ---------------------------------------------------------------


class FixedPrefiller(PluginBase):
    """Any EPP config that sets the header will do; this one names a fixed prefill pod."""

    TYPE: ClassVar[str] = "test-fixed-prefiller"

    @dataclass(frozen=True)
    class Params:
        hostport: str = ""

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        request.upstream_headers["x-prefiller-host-port"] = self.params.hostport


def registry() -> PluginRegistry:
    base = registry_with_test_plugins()
    target = f"{__name__}:FixedPrefiller"
    entry = metadata.EntryPoint(FixedPrefiller.TYPE, target, GROUP)
    extra = PluginInfo(FixedPrefiller.TYPE, target, "tests", "0", entry)
    return PluginRegistry([base.info(t) for t in base.types()] + [extra])


@pytest.mark.envoy
async def test_prefill_runs_on_the_pod_the_epp_names_when_routed_through_envoy(
    fleet: SimFleet, start_app: Any, envoy: Any
) -> None:
    ports: Sequence[int] = fleet.ports
    labels: Mapping[int, dict[str, str]] = {0: {"llm-d.ai/role": "prefill"}}
    app = await start_app(
        ports,
        f"""\
        plugins:
        - type: test-fixed-prefiller
          parameters: {{hostport: "127.0.0.1:{ports[0]}"}}
        - type: test-constant-scorer
          parameters: {{value: 1.0, ports: [{ports[1]}]}}
        """,
        labels=dict(labels),
        registry=registry(),
    )
    proxy = envoy(app)
    forged = {"x-prefiller-host-port": f"127.0.0.1:{ports[2]}"}  # removed by the EPP
    status, headers, raw = await post(f"{proxy.url}/v1/chat/completions", chat(), forged)
    assert status == 200, raw[:300]
    assert (headers["x-sim-pod"], headers["x-sim-prefill-pod"]) == ("pod-d", "pod-p")
    assert headers["x-sim-saw-prefiller"] == f"127.0.0.1:{ports[0]}"
    assert stream_usage(raw)[0] == 6
    assert (await stats(fleet.urls[0]))["prefill_legs"] == 1
    assert (await stats(fleet.urls[2]))["requests_received"] == 0

"""The load signal that listens to the model servers (``estimated-load-scorer`` fed by
``inflight-load-producer``'s ``LoadEstimate``), through a real Envoy to simulated vLLM pods.

The scraped queue is the truth, this EPP's own in-flight requests the freshest part of it: a pod
busy with traffic this EPP never saw gets nothing while others have room, and a burst from this
EPP alone is spread even between scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from typing import Any

import grpc
import pytest
import yaml

from epp.config.schema import DEFAULT_CONFIG_TEXT, UPSTREAM_DEFAULT_CONFIG_TEXT
from epp.server import extproc_rpc
from tests.conftest import (
    COMPLETION,
    body_msg,
    headers_msg,
    post,
    set_headers_of,
    set_overrides,
    settle,
    wait_for,
)

pytestmark = [pytest.mark.envoy]

CONFIG = """\
plugins:
- type: estimated-load-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: estimated-load-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


async def _send(url: str, n: int, *, tag: str, max_tokens: int = 4) -> list[str]:
    """``n`` concurrent completions with distinct short prompts; the pods that served them."""

    async def one(i: int) -> str:
        body = {**COMPLETION, "prompt": f"{tag} {i}", "max_tokens": max_tokens}
        status, headers, _ = await post(f"{url}/v1/completions", body)
        assert status == 200, headers
        return headers["x-sim-pod"]

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def _builtin_default_body(text: str = DEFAULT_CONFIG_TEXT) -> str:
    """The built-in default's plugins and profile (the fixture adds discovery and sources)."""
    doc = yaml.safe_load(text)
    for key in ("apiVersion", "kind", "dataLayer"):
        doc.pop(key)
    sources = ("metrics-data-source", "core-metrics-extractor")
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] not in sources]
    return str(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize(
    "config",
    [pytest.param(CONFIG, id="load-and-prefix"), pytest.param("builtin", id="builtin-default")],
)
async def test_pod_busy_with_foreign_traffic_gets_no_request(
    start_app, sim_pods, envoy, config: str
) -> None:
    if config == "builtin":
        config = _builtin_default_body()
    fleet = await sim_pods(3)
    # pod-2 reports 10 waiting requests from clients this EPP never sees; the others 0
    for url, q in zip(fleet.urls, [0, 0, 10], strict=True):
        await set_overrides(url, num_requests_waiting=q)
    app = await start_app(fleet.ports, config)
    await settle(
        app,
        lambda m: (
            all(x is not None and x.update_time for x in m.values())
            and m[fleet.ports[2]].waiting_queue_size == 10
        ),
    )
    proxy = envoy(app)
    served = []
    for i in range(4):  # one at a time, from an idle EPP: in-flight counts alone would all tie
        served += await _send(proxy.url, 1, tag=f"sequential {i}")
    served += await _send(proxy.url, 8, tag="burst")  # at most 8 in flight: pod-2 stays worse
    assert "pod-2" not in served, served
    assert set(served) == {"pod-0", "pod-1"}, served


async def test_requests_sent_straight_to_a_pod_count_as_its_load(
    start_app, sim_pods, envoy
) -> None:
    # real time: 3000 tokens take ~20 s, so the foreign requests outlast the EPP's and Envoy's
    # start on a busy machine (300 tokens, ~2 s, were done before the first request was routed)
    fleet = await sim_pods(3, time_scale=1.0)
    app = await start_app(fleet.ports, CONFIG)
    foreign = asyncio.gather(  # another client, straight to pod-0, never seen by this EPP
        *(
            post(f"{fleet.urls[0]}/v1/completions", {**COMPLETION, "max_tokens": 3000})
            for _ in range(6)
        )
    )
    try:
        await settle(
            app,
            lambda m: (
                m[fleet.ports[0]] is not None and m[fleet.ports[0]].running_requests_size >= 6
            ),
        )
        proxy = envoy(app)
        served = await _send(proxy.url, 1, tag="first")
        served += await _send(proxy.url, 4, tag="burst")
        assert "pod-0" not in served, served
    finally:
        foreign.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await foreign


async def test_burst_from_this_epp_alone_is_spread(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(4, time_scale=5.0)  # each request stays in flight for ~50 ms
    app = await start_app(fleet.ports, CONFIG)
    await settle(app, lambda m: all(x is not None and x.update_time for x in m.values()))
    proxy = envoy(app)
    served = Counter(await _send(proxy.url, 24, tag="spread", max_tokens=40))
    mean = 24 / len(fleet.ports)
    busiest = max(served.values())
    assert busiest <= 1.5 * mean, served
    assert len(served) == len(fleet.ports), served


async def _route_then_hang_up(app: Any, prompt: str) -> str:
    """One request on its own ext_proc stream, cancelled by the client right after the routing
    answer (headers and body replies): the endpoint it was routed to."""
    body = json.dumps({**COMPLETION, "prompt": prompt}).encode()
    headers = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call = extproc_rpc.process(channel)()
        await call.write(headers_msg(headers))
        await call.write(body_msg(body))
        routed = await asyncio.wait_for(call.read(), 30)
        await asyncio.wait_for(call.read(), 30)  # the body reply
        call.cancel()
    return set_headers_of(routed)["x-gateway-destination-endpoint"]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(DEFAULT_CONFIG_TEXT, id="builtin-default"),
        pytest.param(UPSTREAM_DEFAULT_CONFIG_TEXT, id="upstream-default"),
    ],
)
async def test_idle_epp_sends_cold_requests_to_the_least_loaded_pod(
    start_app, sim_pods, text: str
) -> None:
    """llm-d's "select lower queue and kv cache" case, one request after another, each stream
    ended by the client once routed: the EPP is idle again before each request, so every one
    goes to the pod with the shortest queue and the emptiest cache. (The built-in default once
    sent the second to the pod with 3 waiting: ``no-hit-lru-scorer`` at weight 1 spread the cold
    requests regardless of load.)"""
    fleet = await sim_pods(3)
    for url, q, kv in zip(fleet.urls, [3, 0, 10], [0.2, 0.1, 0.2], strict=True):
        await set_overrides(url, num_requests_waiting=q, kv_cache_usage_perc=kv)
    app = await start_app(fleet.ports, _builtin_default_body(text))
    await settle(
        app,
        lambda m: (
            [getattr(m[port], "waiting_queue_size", None) for port in fleet.ports] == [3, 0, 10]
        ),
    )
    served = [await _route_then_hang_up(app, f"cold request {i}") for i in range(4)]
    assert served == [f"127.0.0.1:{fleet.ports[1]}"] * 4
    # every request ended: none is open in the KV tracker (and the in-flight load, if any)
    plugins = {p.TYPE: p for p in app.pipeline.instances.values()}
    kv = plugins["kv-cache-utilization-scorer"]
    await wait_for(lambda: len(kv.tracker) == 0)
    if "inflight-load-producer" in plugins:
        assert plugins["inflight-load-producer"].dump_state()["open"] == 0

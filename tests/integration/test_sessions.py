"""Sessions and agent identity through a real Envoy (FULL_DUPLEX_STREAMED) to simulated pods.

Every follow-up carries an unrelated random prompt, so prefix-cache affinity cannot explain
where it lands: only the session can."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from tests.conftest import metrics_text, wait_for

pytestmark = [pytest.mark.envoy]

FOLLOW_UPS = 24
SCORERS = """\
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
"""
PROFILE_SCORERS = """\
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


def _completion() -> dict[str, Any]:
    return {"model": "sim-model", "prompt": f"unrelated {uuid.uuid4().hex}", "max_tokens": 2}


async def _ask(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """One completion; returns the pod that served it and the response headers (lower-cased)."""
    async with session.post(f"{url}/v1/completions", json=_completion(), headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-sim-pod"], {k.lower(): v for k, v in r.headers.items()}


def _token_pod(token: str) -> str:
    """The pod a session token names (file discovery ids are ``default/<pod>``)."""
    namespace, _, pod = base64.b64decode(token, validate=True).decode().partition("/")
    assert namespace == "default"
    return pod


def _keep_pods(path: Path, ports: list[int], keep: list[int]) -> None:
    """Rewrite the discovery file with only the pods ``keep`` (names stay pod-<i>)."""
    lines = ["endpoints:"]
    for i in keep:
        lines += [f"- name: pod-{i}", "  namespace: default", "  address: 127.0.0.1"]
        lines.append(f"  port: '{ports[i]}'")
    path.write_text("\n".join(lines) + "\n")


async def _cookie_client(url: str) -> tuple[str, list[str]]:
    """A client that only keeps its cookies (no header echo)."""
    jar = aiohttp.CookieJar(unsafe=True)  # unsafe: accept cookies from an IP-address host
    async with aiohttp.ClientSession(cookie_jar=jar) as s:
        first, headers = await _ask(s, url)
        assert headers["set-cookie"].startswith("llm-d-session=")
        assert "HttpOnly" in headers["set-cookie"]
        assert _token_pod(jar.filter_cookies(URL(url))["llm-d-session"].value) == first
        return first, [(await _ask(s, url))[0] for _ in range(FOLLOW_UPS)]


async def _header_client(url: str) -> tuple[str, list[str]]:
    """A client that echoes x-session-token and keeps no cookies."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
        first, headers = await _ask(s, url)
        token = headers["x-session-token"]
        assert _token_pod(token) == first
        pods = []
        for _ in range(FOLLOW_UPS):
            pod, headers = await _ask(s, url, {"x-session-token": token})
            token = headers["x-session-token"]
            pods.append(pod)
        return first, pods


async def test_cookie_and_header_sessions_stick_to_their_pod(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(4)
    app = await start_app(
        fleet.ports,
        f"""\
        plugins:
        - type: session-affinity-filter
          parameters:
            encodedEndpointHeaderConfig: {{cookieName: llm-d-session}}
        {SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: session-affinity-filter
        {PROFILE_SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        """,
        allow_experimental_plugins=True,
    )
    url = envoy(app).url
    (cookie_pod, cookie_pods), (header_pod, header_pods) = await asyncio.gather(
        _cookie_client(url), _header_client(url)
    )
    for pod, pods in ((cookie_pod, cookie_pods), (header_pod, header_pods)):
        assert len(pods) == FOLLOW_UPS
        assert pods.count(pod) / len(pods) >= 0.99, Counter(pods)

    # Without a session the same traffic spreads: the pin is the session's doing.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
        spread = {(await _ask(s, url))[0] for _ in range(FOLLOW_UPS)}
    assert len(spread) >= 2, spread

    # The session's pod leaves: the session moves to a healthy pod and sticks there.
    gone = int(cookie_pod.rpartition("-")[2])
    keep = [i for i in range(4) if i != gone]
    _keep_pods(app.endpoints_file, fleet.ports, keep)
    await wait_for(lambda: len(app.store.snapshot()) == 3, 10)
    jar = aiohttp.CookieJar(unsafe=True)
    old_token = base64.b64encode(f"default/{cookie_pod}".encode()).decode()
    jar.update_cookies({"llm-d-session": old_token}, URL(url))
    async with aiohttp.ClientSession(cookie_jar=jar) as s:
        moved, headers = await _ask(s, url)
        after = [(await _ask(s, url))[0] for _ in range(FOLLOW_UPS)]
    assert moved != cookie_pod
    assert _token_pod(headers["x-session-token"]) == moved  # re-pinned: a new token and cookie
    assert after.count(moved) / len(after) >= 0.99, Counter(after)


async def test_session_id_cookie_via_session_id_producer_sticks(start_app, sim_pods, envoy) -> None:
    """Upstream's stateful path: the client's own ``llm-d-session`` cookie, read by
    ``session-id-producer`` and bound server-side by ``session-affinity-scorer``."""
    fleet = await sim_pods(4)
    app = await start_app(
        fleet.ports,
        f"""\
        plugins:
        - type: session-id-producer
          parameters: {{cookieName: llm-d-session}}
        - type: session-affinity-scorer
          parameters:
            strategy: session_id
            sessionIdConfig:
              sources:
              - {{attribute: SessionIDDataKey, producer: session-id-producer}}
              - {{attribute: agent-identity}}
        - type: agent-identity
        {SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: session-affinity-scorer
            weight: 10
        {PROFILE_SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        """,
        allow_experimental_plugins=True,
    )
    url = envoy(app).url

    async def cookie_session(sid: str) -> list[str]:
        jar = aiohttp.CookieJar(unsafe=True)
        jar.update_cookies({"llm-d-session": sid}, URL(url))
        async with aiohttp.ClientSession(cookie_jar=jar) as s:
            return [(await _ask(s, url))[0] for _ in range(FOLLOW_UPS + 1)]

    async def agent_session(sid: str) -> list[str]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            headers = {"x-claude-code-session-id": sid}
            return [(await _ask(s, url, headers))[0] for _ in range(FOLLOW_UPS + 1)]

    runs = await asyncio.gather(cookie_session("conv-1"), agent_session("agent-1"))
    for pods in runs:
        first, follow_ups = pods[0], pods[1:]
        assert follow_ups.count(first) / len(follow_ups) >= 0.99, Counter(pods)
    state = await _plugin_state(app)
    assert state["session-affinity-scorer/session-affinity-scorer"]["bindings"] == 2


async def test_session_id_from_a_body_field_sticks_within_its_limits(
    start_app, sim_pods, envoy
) -> None:
    """``session-id-producer`` reading ``bodyField`` (a dotted path) when no header carries a
    session; its ``lruSize`` and ``ttl`` bound the scorer's bindings."""
    fleet = await sim_pods(4)
    app = await start_app(
        fleet.ports,
        f"""\
        plugins:
        - type: session-id-producer
          parameters: {{bodyField: metadata.session_id, lruSize: 2, ttl: 10m}}
        - type: session-affinity-scorer
          parameters:
            strategy: session_id
            sessionIdConfig:
              sources:
              - {{attribute: SessionIDDataKey, producer: session-id-producer}}
        {SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: session-affinity-scorer
            weight: 10
        {PROFILE_SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        """,
        allow_experimental_plugins=True,
    )
    url = envoy(app).url

    async def body_session(sid: str) -> list[str]:
        pods = []
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            for _ in range(FOLLOW_UPS + 1):
                body = {**_completion(), "metadata": {"session_id": sid}}
                async with s.post(f"{url}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                    pods.append(r.headers["x-sim-pod"])
        return pods

    runs = await asyncio.gather(body_session("conv-a"), body_session("conv-b"))
    for pods in runs:
        first, follow_ups = pods[0], pods[1:]
        assert follow_ups.count(first) / len(follow_ups) >= 0.99, Counter(pods)
    await body_session("conv-c")  # a third session: lruSize 2 evicts the least recent
    state = (await _plugin_state(app))["session-affinity-scorer/session-affinity-scorer"]
    assert (state["bindings"], state["capacity"], state["ttlSeconds"]) == (2, 2, 600.0)


async def test_agent_identity_becomes_the_fairness_id(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(4)
    app = await start_app(
        fleet.ports,
        f"""\
        plugins:
        - type: agent-identity
        {SCORERS.replace(chr(10), chr(10) + "        ").rstrip()}
        """,
        allow_experimental_plugins=True,
    )
    url = envoy(app).url
    cases = {
        "rid-agent": ({"x-claude-code-session-id": "claude-sess-1"}, "claude-sess-1"),
        "rid-codex": ({"session-id": "codex-sess-2"}, "codex-sess-2"),
        "rid-explicit": (
            {"session-id": "codex-sess-2", "x-llm-d-inference-fairness-id": "tenant-a"},
            "tenant-a",
        ),
        "rid-none": ({}, "default-flow"),
    }
    async with aiohttp.ClientSession() as s:
        for rid, (headers, _) in cases.items():
            await _ask(s, url, {**headers, "x-request-id": rid})
        for rid, (_, fairness) in cases.items():
            decision_url = f"http://127.0.0.1:{app.metrics_port}/debug/decisions/{rid}"
            async with s.get(decision_url) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["fairnessId"] == fairness, rid
    text = await metrics_text(app)
    assert 'fairness_id="claude-sess-1"' in text


async def _plugin_state(app: Any) -> dict[str, Any]:
    url = f"http://127.0.0.1:{app.metrics_port}/debug/plugins/state"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return dict(json.loads(await r.text()))

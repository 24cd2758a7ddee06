"""The load generator's agent features against real simulated pods (in-process, loopback only):
Responses follow-ups and their resend after a 404, sub-agents waiting for their parent, and the
foreign load that keeps one pod's queue full."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
import pytest

from epp_tools.bench.runner.driver import run, send_turn
from epp_tools.bench.runner.foreign import ForeignTraffic
from epp_tools.bench.workloads.agentic import AgenticShape, build_agentic
from epp_tools.bench.workloads.oracle import compute_oracle
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec, ForeignLoad
from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet
from epp_tools.sim.tokenizer import render_chat

SHAPE = AgenticShape(
    sessions=2, turns=4, system_tokens=60, context_median=300, context_sigma=0.1,
    context_max=600, tool_median=40, tool_sigma=0.3, tool_max=200, output_median=12,
    output_sigma=0.2, output_max=30, responses_share=1.0,
)  # fmt: skip


async def test_responses_sessions_follow_up_on_one_pod_and_reach_the_oracle() -> None:
    workload = build_agentic(SHAPE, seed=4, fleet=FleetSpec(), concurrency=1)
    oracle = compute_oracle(workload.requests, 16)
    async with SimFleet([PodConfig(name="pod-0", time_scale=50.0)]) as fleet:
        outcomes = await run(fleet.urls[0], workload.requests, concurrency=1, time_scale=50.0)
    assert all(o.ok and o.api == "responses" and o.response_id for o in outcomes)
    assert [o.followup_status for o in outcomes] == [200 if r.turn else 0
                                                     for r in workload.requests]  # fmt: skip
    assert [o.tokens for o in outcomes] == [r.max_tokens for r in workload.requests]
    assert [(o.prompt_tokens, o.cached_tokens) for o in outcomes] == list(oracle.per_request)


async def test_follow_up_refused_with_404_is_resent_as_a_new_chain_when_the_pod_lacks_it() -> None:
    shape = replace(SHAPE, sessions=1)
    first, second = build_agentic(shape, seed=2, fleet=FleetSpec(), concurrency=1).requests[:2]
    configs = [PodConfig(name=f"pod-{i}", time_scale=50.0) for i in range(2)]
    async with SimFleet(configs) as fleet, aiohttp.ClientSession() as http:
        start = time.perf_counter()
        opened = await send_turn(http, fleet.urls[0], 0, first, start)
        moved = await send_turn(http, fleet.urls[1], 1, second, start, opened.response_id)
        stayed = await send_turn(http, fleet.urls[1], 1, second, start, moved.response_id)
    assert opened.ok and opened.followup_status == 0 and opened.pod == "pod-0"
    assert (moved.followup_status, moved.lost_pod, moved.pod) == (404, "pod-1", "pod-1")
    assert moved.ok and moved.response_id and moved.response_id != opened.response_id
    assert moved.prompt_tokens == len(render_chat(second.messages))  # the same prompt
    assert moved.sent < moved.ttft + moved.sent <= moved.sent + moved.latency
    assert stayed.ok and stayed.followup_status == 200


async def test_sub_agent_session_starts_after_its_parent_turn_when_it_depends_on_it() -> None:
    def req(session: str, turn: int, after: tuple[str, int] | None = None) -> BenchRequest:
        messages = ({"role": "user", "content": f"{session} {turn} " * 8},)
        return BenchRequest(session, turn, MODEL, messages, 30, after=after)

    requests = [req("parent", 0), req("child", 1, after=("parent", 0)), req("parent", 1)]
    missing = [req("orphan", 3, after=("gone", 2))]  # a parent outside the run: no wait
    async with SimFleet([PodConfig(name="pod-0", time_scale=5.0)]) as fleet:
        outcomes = await run(fleet.urls[0], requests + missing, concurrency=4, deadline=20)
    parent, child, _, orphan = outcomes
    assert all(o.ok for o in outcomes)
    assert child.sent >= parent.sent + parent.latency - 0.005
    assert orphan.sent < parent.sent + parent.latency


async def test_foreign_traffic_keeps_the_pod_queue_near_its_target_when_running() -> None:
    spec = ForeignLoad(pod=0, waiting=4, prompt_words=20, max_tokens=40)
    # Real-time pace: a request lasts ~240 ms, long against the time a busy machine takes to
    # send its replacement (at 20x it lasted 12 ms and the queue drained between refills).
    config = PodConfig(name="pod-0", time_scale=1.0, max_num_seqs=2)
    async with SimFleet([config]) as fleet:
        traffic = ForeignTraffic(spec, fleet.urls[0], max_num_seqs=2)
        await traffic.start(settle_timeout=30.0)
        traffic.begin()
        async with asyncio.timeout(60):  # six samples of the queue, however slow the machine
            while len(traffic._window.waiting) < 6:
                await asyncio.sleep(0.05)
        stats = await traffic.stop()
        left = fleet.runtime(0).engine
        await asyncio.sleep(0.1)
        assert left.num_waiting + left.num_running <= 6  # cancelled requests are aborted
    assert stats["in_flight"] == 6 and stats["served"] > 0 and stats["failed"] == 0
    assert stats["samples"] >= 6
    assert 2.0 <= stats["mean_waiting"] <= 4.5  # target 4; a busy machine refills late
    assert stats["mean_running"] >= 1.5


async def test_the_first_token_is_reported_while_the_answer_still_streams() -> None:
    # epp bench scale's join waits for the new agents' prefill, not for their longest answers
    (first,) = build_agentic(replace(SHAPE, sessions=1, turns=1), seed=2, fleet=FleetSpec(),
                             concurrency=1).requests  # fmt: skip
    marked: list[float] = []
    config = PodConfig(name="pod-0", time_scale=50.0, decode_base_ms=500.0)
    async with SimFleet([config]) as fleet, aiohttp.ClientSession() as http:
        start = time.perf_counter()
        out = await send_turn(http, fleet.urls[0], 0, first, start, "",
                              lambda: marked.append(time.perf_counter()))  # fmt: skip
        ended = time.perf_counter()
    assert out.ok and out.tokens > 1 and len(marked) == 1
    assert marked[0] - start == pytest.approx(out.sent + out.ttft, abs=0.05)
    assert ended - marked[0] >= (out.tokens - 1) * 0.5 / 50.0 * 0.9  # the decode came after

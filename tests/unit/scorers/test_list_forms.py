"""The built-in scorers of the default profile hand the scheduler a list in candidate order
(``ListScorer``): for every request of a seeded run of the default pipeline (cold and warm
prompts, dispatches and completions that the KV tracker, the no-hit LRU and the load estimates
remember, fresh and stale scrapes, endpoints without metrics or with out-of-range KV usage),
``score_list`` equals ``score`` keyed by id, over the whole pool and over shuffled subsets."""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, replace

from epp.config.loader import load_config
from epp.plugin import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ListScorer,
    Metrics,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
    Usage,
)
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_score_list
from epp_tools.bench.micro.cli import MicroHandle, chat_body

DEFAULT_SCORERS = {
    "kv-cache-utilization-scorer",
    "prefix-cache-scorer",
    "estimated-load-scorer",
    "no-hit-lru-scorer",
}


@dataclass
class ClockHandle(MicroHandle):
    now: float = 1000.0

    def clock(self) -> float:
        return self.now


def _pool(n: int, now: float, rng: random.Random) -> list[Endpoint]:
    kv = (0.0, 0.3, 1.0, 1.5, -0.2, math.nan)
    eps = []
    for i in range(n):
        metrics = Metrics(
            waiting_queue_size=rng.randrange(0, 3),
            running_requests_size=rng.randrange(0, 4),
            kv_cache_usage_percent=rng.choice(kv),
            cache_block_size=16,
            cache_num_blocks=rng.choice((0, 2_000)),
            update_time=now - rng.choice((0.0, 0.5, 5.0)),  # fresh, recent, stale
        )
        ep = Endpoint(
            id=f"default/pod-{i}-rank-0",
            name=f"pod-{i}",
            namespace="default",
            address=f"10.0.0.{i + 1}",
            port=8000,
            metrics=None if i % 9 == 4 else metrics,
        )
        eps.append(ep)
    return eps


async def _run() -> int:
    handle = ClockHandle()
    pipeline = load_config(
        None, registry=PluginRegistry.from_entry_points(), handle_for=lambda: handle
    )
    handle.instances = pipeline.instances
    parser = next(p for p in pipeline.parsers if p.typed_name.type == "openai-parser")
    profile = next(iter(pipeline.profiles.values()))
    scorers = [s for s, _ in profile.scorers]
    assert {s.typed_name.type for s in scorers} == DEFAULT_SCORERS
    assert all(isinstance(s, ListScorer) for s in scorers)
    rng = random.Random(3)
    bodies = [chat_body(300, seed=k) for k in range(12)]
    eps = handle.current = _pool(60, handle.now, rng)
    checked = 0
    for i in range(90):
        handle.now += 0.05
        if i % 30 == 29:
            eps = handle.current = _pool(60, handle.now, rng)
        parsed = parser.parse_request("/v1/chat/completions", rng.choice(bodies), {})
        request = InferenceRequest(
            request_id=f"r{i}",
            headers={},
            path="/v1/chat/completions",
            incoming_model=parsed.model,
            target_model=parsed.model,
            body=parsed.body,
        )
        for producer in pipeline.producers:
            await producer.produce(request, eps)
        subset = rng.sample(eps, rng.randrange(1, len(eps)))
        for scorer in scorers:
            for candidates in (eps, subset, eps[:1], [replace(eps[0], metrics=None)]):
                check_score_list(scorer, candidates, request)
                checked += 1
        target = rng.choice(eps)
        result = SchedulingResult({"default": ProfileResult(targets=(target,))}, "default")
        for hook in pipeline.pre_request:
            hook.pre_request(request, result)
        if i % 2:
            info = ResponseInfo(
                request_id=request.request_id,
                headers={},
                served_endpoint=target.id,
                usage=Usage(prompt_tokens=300, completion_tokens=rng.randrange(1, 99)),
                end_of_stream=True,
            )
            for complete in pipeline.response_complete:
                complete.response_complete(request, info)
    return checked


def test_list_and_mapping_forms_agree_on_every_request() -> None:
    assert asyncio.run(_run()) == 90 * 4 * 4


def test_the_forms_agree_without_producer_data() -> None:
    """No prefix match info, no load estimate: the fallbacks of both forms agree too."""
    handle = ClockHandle()
    pipeline = load_config(
        None, registry=PluginRegistry.from_entry_points(), handle_for=lambda: handle
    )
    profile = next(iter(pipeline.profiles.values()))
    eps = _pool(20, handle.now, random.Random(5))
    request = InferenceRequest(request_id="bare", headers={}, path="/", incoming_model="m")
    for scorer, _ in profile.scorers:
        check_score_list(scorer, eps, request)
        assert len(scorer.score_list(CycleState(0.0, random.Random(0)), request, [])) == 0  # type: ignore[attr-defined]

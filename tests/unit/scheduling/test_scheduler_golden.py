"""Pins the built-in default profile's decisions on a seeded pool, so a change made for speed
provably changes no pick, no score and no tie-break.

The golden (``golden_default_profile.json``) was recorded before the scheduling hot path was
optimised, and again when ``no-hit-lru-scorer``'s default weight became 0.25 (the memoised load and
KV estimates that came later changed no decision): per request, the picked endpoint, and a digest of
every endpoint's exact total score (``repr`` of each float) and, on the small pool, of the explain
view's per-scorer scores. The pipeline is the EPP's own (the built-in default configuration through
the normal loader), driven with a manual clock: producers, scheduling, PreRequest hooks, completions
every third request and a fresh scrape every 40 requests, so the KV tracker, the no-hit LRU and the
in-flight estimates all carry state from request to request.

Regenerate (only when a decision change is intended): ``EPP_WRITE_GOLDEN=1 pytest <this file>``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epp.config.loader import load_config
from epp.observability.decisions import EXPLAIN_KEY
from epp.plugin import CycleState, Endpoint, InferenceRequest, Metrics, ResponseInfo, Usage
from epp.plugin.registry import PluginRegistry
from epp.scheduling.scheduler import Scheduler
from epp_tools.bench.micro.cli import MicroHandle, chat_body

GOLDEN = Path(__file__).with_name("golden_default_profile.json")
REQUESTS = 150


@dataclass
class ClockHandle(MicroHandle):
    now: float = 1000.0

    def clock(self) -> float:
        return self.now


def pool(n: int, scraped_at: float, seed: int) -> list[Endpoint]:
    rng = random.Random(seed)
    return [
        Endpoint(
            id=f"default/pod-{i}-rank-0",
            name=f"pod-{i}",
            namespace="default",
            address=f"10.0.{i // 250}.{i % 250 + 1}",
            port=8000,
            metrics=Metrics(
                waiting_queue_size=rng.randrange(0, 3),
                running_requests_size=rng.randrange(0, 4),
                # coarse values, so equal totals (ties) happen and the seeded tie-break matters
                kv_cache_usage_percent=rng.choice((0.0, 0.25, 0.5, 0.75, 1.0)),
                cache_block_size=16,
                cache_num_blocks=2_000,
                update_time=scraped_at,
            ),
        )
        for i in range(n)
    ]


def _digest(values: Any) -> str:
    return hashlib.sha256(repr(values).encode()).hexdigest()[:16]


async def _run(n: int) -> dict[str, Any]:
    handle = ClockHandle()
    pipeline = load_config(
        None, registry=PluginRegistry.from_entry_points(), handle_for=lambda: handle
    )
    handle.instances = pipeline.instances
    parser = next(p for p in pipeline.parsers if p.typed_name.type == "openai-parser")
    scheduler = Scheduler(
        profiles=pipeline.profiles,
        handler=pipeline.profile_handler,
        observe=lambda *_: None,
        count_error=lambda *_: None,
    )
    rng = random.Random(7)
    bodies = [chat_body(400, seed=k) for k in range(60)]  # repeats and first sightings
    eps = handle.current = pool(n, handle.now, seed=n)
    picks: list[str] = []
    digests: list[str] = []
    open_requests: list[InferenceRequest] = []
    for i in range(REQUESTS):
        handle.now += 0.01
        if i % 40 == 39:
            eps = handle.current = pool(n, handle.now, seed=n + i)
        body = rng.choice(bodies)
        parsed = parser.parse_request("/v1/chat/completions", body, {})
        request = InferenceRequest(
            request_id=f"r{i}",
            headers={},
            path="/v1/chat/completions",
            incoming_model=parsed.model,
            target_model=parsed.model,
            body=parsed.body,
            size_bytes=len(body),
        )
        for producer in pipeline.producers:
            await producer.produce(request, eps)
        result = scheduler.schedule(CycleState(handle.now, rng), request, eps)
        for hook in pipeline.pre_request:
            hook.pre_request(request, result)
        primary = result.profile_results[result.primary_profile]
        assert primary is not None
        picks.append(primary.targets[0].id)
        explain = request.attributes.get(EXPLAIN_KEY)
        digests.append(_digest((sorted(primary.scores.items()), explain)))
        open_requests.append(request)
        if i % 3 == 2:
            done = open_requests.pop(rng.randrange(len(open_requests)))
            info = ResponseInfo(
                request_id=done.request_id,
                headers={},
                served_endpoint=picks[int(done.request_id[1:])],
                usage=Usage(prompt_tokens=400, completion_tokens=rng.randrange(1, 200)),
                end_of_stream=True,
            )
            for complete in pipeline.response_complete:
                complete.response_complete(done, info)
    return {"picks": picks, "digest": _digest(digests)}


def test_default_profile_decisions_match_the_golden() -> None:
    got = {str(n): asyncio.run(_run(n)) for n in (1000, 40)}
    if os.environ.get("EPP_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    for n in ("1000", "40"):
        assert got[n]["picks"] == want[n]["picks"], f"{n} endpoints: picks changed"
        assert got[n]["digest"] == want[n]["digest"], f"{n} endpoints: scores changed"
    assert len(set(want["1000"]["picks"])) > 20  # the golden spreads over the pool

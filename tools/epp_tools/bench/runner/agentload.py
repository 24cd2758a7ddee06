"""Closed-loop load for the replica scenarios of ``epp bench replicas``: ``clients`` agents, each
taking the next session from a shared supply and sending its turns one after the other (a
Responses API turn follows up on the previous answer, see
``epp_tools.bench.runner.driver.send_turn``), until a wall-clock end. A request started before the
end is finished (bounded by ``request_timeout``); none starts after it.

``agent_sessions`` builds the supply: agentic sessions shaped like workload (b) (a shared system
prompt, a first context, then tool results and the previous answers; half of them on the
Responses API) but more of them and shorter, so that sessions keep starting throughout a run and
a replica that misses one learns it from the others' traffic or not at all.

``windows`` buckets the outcomes by the time they were sent: requests, failures (anything but a
complete 200), and the hit ratio (``cached_tokens / prompt_tokens`` of the answered requests, as
the model servers reported them in the usage block).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from epp_tools.bench.runner import driver
from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.workloads.agentic import AGENTIC_SHAPES, build_agentic
from epp_tools.bench.workloads.spec import BenchRequest, FleetSpec

Session = list[BenchRequest]


def agent_sessions(sessions: int, turns: int, seed: int, fleet: FleetSpec) -> list[Session]:
    """``sessions`` agentic sessions of ``turns`` turns (inputs about a quarter of workload b's)."""
    shape = replace(
        AGENTIC_SHAPES["default"],
        sessions=sessions,
        turns=turns,
        context_median=4_000,
        context_max=8_000,
    )
    workload = build_agentic(shape, seed, fleet, concurrency=1)
    by_session: dict[str, Session] = {}
    for r in workload.requests:
        by_session.setdefault(r.session, []).append(r)
    return [sorted(s, key=lambda r: r.turn) for s in by_session.values()]


@dataclass
class AgentLoad:
    url: str
    supply: Iterable[Session]
    clients: int = 8
    request_timeout: float = 60.0
    backoff: float = 0.0
    """Seconds an agent waits after a failed turn, as a client does before it tries again (an
    outage is then not a loop of instant failures eating the session supply)."""
    stop_at: float = math.inf
    """An earlier end than ``run``'s ``until``, settable while it runs."""
    outcomes: list[Outcome] = field(default_factory=list)
    exhausted: bool = False
    """The supply ran out before the end (the run then has fewer requests than it could)."""

    async def run(self, start: float, until: float) -> list[Outcome]:
        """Send until ``until`` (``time.perf_counter()`` clock); ``Outcome.sent`` counts from
        ``start``."""
        supply: Iterator[Session] = iter(self.supply)
        connector = aiohttp.TCPConnector(limit=self.clients)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

            async def agent() -> None:
                for turns in supply:
                    chain = ""
                    for req in turns:
                        if time.perf_counter() >= min(until, self.stop_at):
                            return
                        i = len(self.outcomes)
                        out = await driver.send_turn(http, self.url, i, req, start, chain)
                        self.outcomes.append(out)
                        chain = out.response_id if out.ok else ""
                        if not out.ok and self.backoff:
                            await asyncio.sleep(self.backoff)
                self.exhausted = True

            await asyncio.gather(*(agent() for _ in range(self.clients)))
        return self.outcomes


def hit_ratio(outcomes: Sequence[Outcome]) -> float:
    answered = [o for o in outcomes if o.ok]
    prompt = sum(o.prompt_tokens for o in answered)
    return sum(o.cached_tokens for o in answered) / prompt if prompt else math.nan


def failed(outcomes: Sequence[Outcome]) -> int:
    return sum(1 for o in outcomes if not o.ok)


def failure_kinds(outcomes: Sequence[Outcome], limit: int = 5) -> dict[str, int]:
    """The most common kinds of failure: HTTP status and the start of the error."""
    kinds = Counter(f"{o.status} {o.reason or o.error[:60]}".strip() for o in outcomes if not o.ok)
    return dict(kinds.most_common(limit))


def between(outcomes: Sequence[Outcome], t0: float, t1: float) -> list[Outcome]:
    return [o for o in outcomes if t0 <= o.sent < t1]


def windows(outcomes: Sequence[Outcome], width: float, end: float) -> list[dict[str, float]]:
    """Per ``width`` seconds from 0 to ``end``: start, requests, failed, hit ratio."""
    out = []
    for k in range(max(1, math.ceil(end / width))):
        part = between(outcomes, k * width, (k + 1) * width)
        out.append(
            {"t": k * width, "requests": len(part), "failed": failed(part), "hit": hit_ratio(part)}
        )
    return out


def recovery_seconds(
    outcomes: Sequence[Outcome], since: float, level: float, *, width: float = 2.0, limit: float
) -> float:
    """Seconds after ``since`` until a ``width``-second window of sent requests first has a hit
    ratio of at least ``level`` (checked every 0.5 s up to ``limit``; ``inf`` if never)."""
    steps = int(limit / 0.5)
    for k in range(steps + 1):
        t0 = since + k * 0.5
        h = hit_ratio(between(outcomes, t0, t0 + width))
        if not math.isnan(h) and h >= level:
            return k * 0.5
    return math.inf

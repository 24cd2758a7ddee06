"""The client of ``epp bench scale``: live agents, each a closed loop of turns and think time.

``AgentPool.add(n, spread)`` starts ``n`` more main agents, each after a delay drawn uniformly in
``[0, spread]`` simulated seconds (so a step's new agents do not all send their first, long
prefill at once). An agent sends a turn (``epp_tools.bench.runner.driver.send_turn``: streamed, a
Responses follow-up resent as a new chain when answered 404), waits for the whole answer, records
it, maybe forks a sub-agent, thinks (``Agent.think_seconds``), and goes on until the pool stops; a
sub-agent ends after its turns. Simulated seconds become wall seconds divided by the
simulator's time scale. A turn the EPP refused by policy (429: shed as sheddable at saturation, or
evicted from a flow-control queue; 503 with ``x-llm-d-request-dropped-reason``) is recorded as
shed and the agent thinks before trying again; any other failure is an error.

Every answer becomes a ``Record`` (wall-clock send and completion times, the planned prompt, the
oracle's reusable tokens, the cached tokens the server reported, the pod). ``working_set()`` is
the KV the live agents' conversations hold now (each counted once, the harness prompt once).

Connections are kept alive and unbounded in number (one per request in flight); every request is
bounded by ``request_timeout`` simulated seconds (600: the ten minutes a coding agent's client
waits for an answer; a turn at a large batch writing the longest answer of the shape lasts about
six).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass

import aiohttp

from epp_tools.bench.runner import driver
from epp_tools.bench.scale.agents import Agent, Turn, harness_prompt
from epp_tools.bench.scale.shape import AgentShape, Scaling

REQUEST_TIMEOUT_S = 600.0
"""Simulated seconds a turn may last before the client gives up (see the module doc)."""


@dataclass(frozen=True)
class Record:
    agent: str
    sub: bool
    joined: bool
    """The agent's first turn (its whole context is new to the fleet)."""
    sent: float
    done: float
    status: int
    ok: bool
    shed: bool
    prompt_tokens: int
    reusable_tokens: int
    cached_tokens: int
    output_tokens: int
    compacting: bool
    pod: str
    error: str = ""
    followup_404: bool = False


class AgentPool:
    def __init__(
        self,
        url: str,
        shape: AgentShape,
        scaling: Scaling,
        seed: int = 1,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.shape = shape
        self.scaling = scaling
        self.seed = seed
        self.request_timeout = request_timeout
        self.system = harness_prompt(shape, scaling, seed)
        self.records: list[Record] = []
        self.prefilled: set[str] = set()
        """Main agents whose first turn has streamed its first token or ended: their whole
        context has been prefilled (or failed)."""
        self.live: dict[str, Agent] = {}
        self.started = 0
        self._rng = random.Random(seed * 104_729 + 11)
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._start = time.perf_counter()
        self._stopping = False

    async def __aenter__(self) -> AgentPool:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout / self.scaling.time_scale)
        self._http = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    @property
    def t0(self) -> float:
        """The pool's start on the ``time.perf_counter`` clock of the records."""
        return self._start

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def main_agents(self) -> int:
        return sum(1 for a in self.live.values() if not a.is_sub)

    def working_set(self) -> int:
        """KV tokens the live conversations hold (the shared harness prompt once)."""
        shared = len(self.system["content"]) // 4
        return shared + sum(a.context_tokens() - shared for a in self.live.values())

    def add(self, n: int, spread: float) -> None:
        """Start ``n`` more main agents over ``spread`` simulated seconds."""
        for _ in range(n):
            i = self.started
            self.started += 1
            agent = Agent.main(f"agent-{i}", self.shape, self.scaling, self.seed * 1_000_003 + i,
                               self.system)  # fmt: skip
            self._spawn(agent, self._rng.uniform(0.0, spread))

    async def stop(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _spawn(self, agent: Agent, delay: float) -> None:
        self.live[agent.name] = agent
        task = asyncio.create_task(self._run(agent, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, agent: Agent, delay: float) -> None:
        try:
            await asyncio.sleep(delay / self.scaling.time_scale)
            forks = 0
            while not self._stopping and not agent.done:
                record = await self._turn(agent, agent.next_turn())
                sub = agent.fork(forks) if record.ok else None
                if sub is not None:
                    forks += 1
                    self._spawn(sub, 0.0)
                await asyncio.sleep(agent.think_seconds() / self.scaling.time_scale)
        finally:
            self.live.pop(agent.name, None)

    async def _turn(self, agent: Agent, turn: Turn) -> Record:
        assert self._http is not None
        joining = not turn.added and not agent.is_sub
        mark = (lambda: self.prefilled.add(agent.name)) if joining else None
        out = await driver.send_turn(
            self._http, self.url, 0, turn.request, self._start, agent.response_id, mark
        )
        done = time.perf_counter()
        if joining:
            self.prefilled.add(agent.name)
        shed = out.status == 429 or (out.status == 503 and bool(out.reason))
        with contextlib.suppress(RuntimeError):
            agent.answered(out.ok, out.response_id)
        record = Record(
            agent=agent.name,
            sub=agent.is_sub,
            joined=joining,
            sent=self._start + out.sent,
            done=done,
            status=out.status,
            ok=out.ok,
            shed=shed,
            prompt_tokens=turn.prompt_tokens,
            reusable_tokens=turn.reusable_tokens,
            cached_tokens=out.cached_tokens,
            output_tokens=out.tokens,
            compacting=turn.compacting,
            pod=out.pod,
            error="" if out.ok else (out.reason or out.error or f"HTTP {out.status}")[:120],
            followup_404=out.followup_status == 404,
        )
        self.records.append(record)
        return record

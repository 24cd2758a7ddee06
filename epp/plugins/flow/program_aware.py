"""``program-aware-fairness``: least attained service (LAS) between programs of one band.

A *program* is a fairness id (``x-llm-d-inference-fairness-id``, default ``default-flow``): an
agentic workflow or a tenant. Each finished request charges its program::

    cost = 1 * input_tokens + 2 * output_tokens          # output tokens cost twice as much

Attained service decays in wall-clock time with a half-life ``H`` (``0`` = no decay), folded in
lazily whenever it is read or charged::

    service(t) = service(t0) * 2 ** (-(t - t0) / H)

Among the non-empty flows of a band, with ``wait`` = age of the flow's head in whole
milliseconds and ``norm(v) = (v - min) / (max - min)`` over those flows (``0.5`` when all are
equal)::

    score = lasWeightService * (1 - norm(service)) + lasWeightHeadWait * norm(wait)

The highest score dispatches (ties: the earliest head, then the smallest id). Programs with no
request in flight and no completion for ``evictionTtlSeconds`` are forgotten, checked every
``evictionSweepSeconds``. Fairness ids are chosen by clients, so the records are also bounded in
count: a new program beyond ``maxPrograms`` makes room by forgetting the program idle longest
(no request in flight, least recently dispatched or completed); programs with requests in
flight are never forgotten, so the records exceed the bound by at most the requests in flight.

Token counts come from the flow controller when a dispatched request is done: output tokens as
reported, input tokens from the request's ``TokenizedPrompt`` (or its body size / 4).

Parameters:

- ``strategy`` (``las``, the only one).
- ``lasWeightService`` (float, default 0.8, >= 0), ``lasWeightHeadWait`` (float, default 0.2,
  >= 0).
- ``lasHalfLifeSeconds`` (float, default 60, >= 0; 0 disables decay).
- ``evictionTtlSeconds`` (float, default 3600, >= 0; 0 turns the TTL sweep off, as upstream),
  ``evictionSweepSeconds`` (float, default 300, > 0).
- ``maxPrograms`` (int, default 10000, >= 1): the count bound above. Not an upstream parameter
  (upstream bounds the records by the TTL alone); its default leaves any deployment with fewer
  programs per TTL as upstream.

Metrics: ``llm_d_epp_program_aware_jains_fairness_index`` (Jain's index over the programs' mean
queue wait), ``llm_d_epp_program_aware_avg_wait_time_milliseconds{program_id}``,
``llm_d_epp_program_aware_attained_service_tokens{program_id}`` (at most 1000 program ids, then
``other``; an id over 128 characters reads ``other`` too).

YAML::

    plugins:
      - type: program-aware-fairness
        parameters:
          lasWeightService: 0.8
          lasWeightHeadWait: 0.2
          lasHalfLifeSeconds: 60
    flowControl:
      defaultPriorityBand:
        fairnessPolicyRef: program-aware-fairness
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from prometheus_client import Gauge

from epp.plugin import Handle, PluginBase
from epp.plugin.flow import BandView, FlowView, QueuedRequest

INPUT_TOKEN_WEIGHT: Final = 1
OUTPUT_TOKEN_WEIGHT: Final = 2
PROGRAM_LABEL_CAP: Final = 1000
MAX_PROGRAM_LABEL_CHARS: Final = 128


@dataclass
class Program:
    """What the policy remembers about one program."""

    service: float = 0.0
    decay_anchor: float | None = None
    in_flight: int = 0
    dispatched: int = 0
    wait_count: int = 0
    avg_wait_ms: float = 0.0
    last_completion: float = 0.0

    def decayed(self, now: float, half_life: float) -> float:
        """Fold the decay since the anchor into ``service`` and return it."""
        if self.decay_anchor is None:
            self.decay_anchor = now
            return self.service
        elapsed = now - self.decay_anchor
        if elapsed > 0:
            if half_life > 0:
                self.service *= 2.0 ** (-elapsed / half_life)
            self.decay_anchor = now
        return self.service


def range_norm(value: float, low: float, high: float) -> float:
    return 0.5 if high == low else (value - low) / (high - low)


def jain_index(values: list[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``; 1.0 for fewer than two values."""
    total_sq = sum(v * v for v in values)
    if len(values) <= 1 or total_sq == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * total_sq)


class ProgramAwareFairness(PluginBase):
    TYPE: ClassVar[str] = "program-aware-fairness"

    @dataclass(frozen=True)
    class Params:
        strategy: Literal["las"] = "las"
        las_weight_service: float = 0.8
        las_weight_head_wait: float = 0.2
        las_half_life_seconds: float = 60.0
        eviction_ttl_seconds: float = 3600.0
        eviction_sweep_seconds: float = 300.0
        max_programs: int = 10_000

        def __post_init__(self) -> None:
            for name in (
                "las_weight_service",
                "las_weight_head_wait",
                "las_half_life_seconds",
                "eviction_ttl_seconds",
            ):
                if getattr(self, name) < 0:
                    raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
            if self.eviction_sweep_seconds <= 0:
                raise ValueError(
                    f"evictionSweepSeconds must be > 0, got {self.eviction_sweep_seconds}"
                )
            if self.max_programs < 1:
                raise ValueError(f"maxPrograms must be >= 1, got {self.max_programs}")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.programs: dict[str, Program] = {}
        self._next_sweep: float | None = None
        # Fairness ids come from clients: the per-program series are capped like fairness_id.
        self._labelled: set[str] = set()
        self._fairness_index = self._gauge(
            "jains_fairness_index", "Jain's fairness index over the programs' mean queue wait", ()
        )
        self._avg_wait = self._gauge(
            "avg_wait_time_milliseconds", "Mean flow-control queue wait per program (ms)"
        )
        self._service = self._gauge(
            "attained_service_tokens", "Time-decayed attained service per program (weighted tokens)"
        )

    def _label(self, program_id: str) -> str:
        if program_id in self._labelled:
            return program_id
        if len(self._labelled) >= PROGRAM_LABEL_CAP or len(program_id) > MAX_PROGRAM_LABEL_CHARS:
            return "other"
        self._labelled.add(program_id)
        return program_id

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...] = ("program_id",)) -> Gauge:
        full = f"llm_d_epp_program_aware_{name}"
        try:
            return Gauge(full, doc, labels, registry=self.handle.registry)
        except ValueError:
            # A second instance of this policy: upstream's families are process-wide, one set.
            self.handle.logger(self.typed_name).warning(
                "%s is exported by another program-aware-fairness instance only", full
            )
            return Gauge(full, doc, labels, registry=None)

    # ---- fairness policy ----------------------------------------------------------------------

    def new_state(self) -> Any:
        return None

    def select_flow(self, band: BandView, now: float) -> FlowView | None:
        self._maybe_sweep(now)
        half_life = self.params.las_half_life_seconds
        entries: list[tuple[FlowView, float, float]] = []
        for flow in band.active_flows():
            head = flow.peek()
            if head is None:
                continue
            program = self.programs.get(flow.flow_id)
            service = program.decayed(now, half_life) if program else 0.0
            wait_ms = float(math.floor((now - head.enqueue_time) * 1000.0))
            entries.append((flow, service, wait_ms))
        if not entries:
            return None
        services = [e[1] for e in entries]
        waits = [e[2] for e in entries]
        s_lo, s_hi, w_lo, w_hi = min(services), max(services), min(waits), max(waits)
        p = self.params
        best: FlowView | None = None
        best_rank: tuple[Any, ...] = ()
        for flow, service, wait_ms in entries:
            score = p.las_weight_service * (
                1.0 - range_norm(service, s_lo, s_hi)
            ) + p.las_weight_head_wait * range_norm(wait_ms, w_lo, w_hi)
            rank = (-score, flow.head_key(), flow.flow_id)
            if best is None or rank < best_rank:
                best, best_rank = flow, rank
        return best

    def on_dispatch(self, band: BandView, flow: FlowView, item: QueuedRequest, now: float) -> None:
        program = self._program(flow.flow_id, now)
        program.in_flight += 1
        program.dispatched += 1
        wait_ms = float(math.floor((now - item.enqueue_time) * 1000.0))
        program.wait_count += 1
        program.avg_wait_ms += (wait_ms - program.avg_wait_ms) / program.wait_count
        self._avg_wait.labels(self._label(flow.flow_id)).set(program.avg_wait_ms)
        self._fairness_index.set(self.fairness_index())

    def on_complete(
        self, fairness_id: str, input_tokens: int, output_tokens: int, now: float
    ) -> None:
        program = self._program(fairness_id, now)
        cost = INPUT_TOKEN_WEIGHT * input_tokens + OUTPUT_TOKEN_WEIGHT * output_tokens
        service = program.decayed(now, self.params.las_half_life_seconds) + cost
        program.service = service
        program.in_flight = max(0, program.in_flight - 1)
        program.last_completion = now
        self._service.labels(self._label(fairness_id)).set(service)
        self._maybe_sweep(now)

    # ---- bookkeeping --------------------------------------------------------------------------

    def fairness_index(self) -> float:
        return jain_index([p.avg_wait_ms for p in self.programs.values() if p.wait_count])

    def dump_state(self) -> Mapping[str, Any]:
        return {
            "programs": {
                pid: {
                    "attainedService": p.service,
                    "inFlight": p.in_flight,
                    "dispatched": p.dispatched,
                    "avgWaitMs": p.avg_wait_ms,
                }
                for pid, p in self.programs.items()
            },
            "fairnessIndex": self.fairness_index(),
        }

    def _program(self, program_id: str, now: float) -> Program:
        """The program's record, moved to the end of ``programs`` (kept in order of activity)."""
        program = self.programs.pop(program_id, None)
        if program is None:
            if len(self.programs) >= self.params.max_programs:
                self._forget_idlest()
            # A program seen but never completing still becomes evictable after the TTL.
            program = Program(last_completion=now)
        self.programs[program_id] = program
        return program

    def _forget_idlest(self) -> None:
        """Forget the least recently active program with nothing in flight (busy ones are
        skipped: at most one per request in flight)."""
        for pid, p in self.programs.items():
            if p.in_flight == 0:
                self._forget(pid)
                return

    def _maybe_sweep(self, now: float) -> None:
        if self._next_sweep is None:
            self._next_sweep = now + self.params.eviction_sweep_seconds
            return
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.params.eviction_sweep_seconds
        ttl = self.params.eviction_ttl_seconds
        if ttl <= 0:
            return
        idle = [
            pid
            for pid, p in self.programs.items()
            if p.in_flight == 0 and now - p.last_completion > ttl
        ]
        for pid in idle:
            self._forget(pid)

    def _forget(self, pid: str) -> None:
        del self.programs[pid]
        if self._label(pid) != pid:
            return  # folded into "other", which other programs still feed
        for gauge in (self._avg_wait, self._service):
            with contextlib.suppress(KeyError):
                gauge.remove(pid)

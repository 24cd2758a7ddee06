"""``epp bench scale cores``: the EPP's CPU per request and per streamed chunk through the full
stack, and the cores it would need at the rate llm-d 1.0 was shown serving.

For ``--workers`` 1 and 2 (``epp --workers N``, the workers sharing state through a local
``redis-server``): a cold simulated fleet of ``pods`` pods, the EPP with the built-in default
config behind Envoy (full-duplex: every response chunk is an ext_proc message), one warm-up
request, the EPP's idle CPU over ``IDLE_S`` seconds, then for each rate of ``rates``, open loop
for ``duration`` seconds (``epp_tools.bench.rate.load``: small chat requests, ~200 prompt tokens):

* once with 1 output token per request: the EPP's CPU (its process and its workers, net of the
  idle rate) per answered request is the per-request cost;
* once with ``chunks`` output tokens streamed one per chunk: the per-request CPU minus the first
  run's, divided by ``chunks - 1``, is the per-chunk cost.

The largest rate at which every request was answered and the achieved rate was at least 95% of
the target gives the figures. Then, at ``big_rate`` per second, requests with a prompt of
``big_tokens`` (195,000: the study's median main-agent request, ~780 KB of JSON) give the
per-request cost of an agent's turn: the slope of the CPU between runs at a third of that rate
and at that rate (at a few such requests per second what the load costs whatever the rate, the
scrapes of busy pods and the sync rounds of every worker, is of the order of the requests' own
CPU, and the slope leaves it out; the idle rate, measured over ``BIG_IDLE_S`` just before, is
reported). Then the same for agents' turns: ``big_tokens`` prompts that share all but their last
``TURN_TAIL_TOKENS`` (one agent's context, sent once unmeasured before; the study found 96% of
main-agent turns reusing at least 90% of their input), whose blocks the index already holds: with
2 workers, what the other worker's facts add to such a request is the sharing's cost for agents.

The computed line: at llm-d's published peak (7,612 requests per minute, 6.6 million output
tokens per minute: 126.9 requests and 110,000 streamed tokens per second, one token per chunk as
vLLM streams them) this EPP needs ``126.9 * per_request(195k) + 110,000 * per_chunk`` cores; llm-d's
Go EPP, from its published 37 µs per chunk, ``110,000 * 37 µs`` = 4.07 cores for the chunks alone
(its per-request cost is not published). One worker serves at most one core, so the EPP needs
that many workers (or active-active replicas, which share nothing on the request path either);
whether that holds is what the 1- and 2-worker measurements show. With 2 workers each worker's
own CPU slope is measured too: one worker routes nearly every long request at these rates, so
the other's is what applying its facts costs, which each further worker adds to every request.
The EPP also times the applying itself, per plugin (``llm_d_epp_state_sync_apply_seconds_total``),
read after every run: its slope between the two rates is what each further worker adds to every
request (the computed line uses it), its mean per request also charges what the sync rounds cost
per second (``_applying``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.rate.load import Shot, bodies, open_loop
from epp_tools.bench.rate.stats import arrivals
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.scale.ramp import WORK
from epp_tools.bench.workloads.long import TURN_TAIL_TOKENS, big_bodies, turn_bodies
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.procs import cpu_seconds, descendants
from epp_tools.stack.replicas import EppSet

OUT = Path("docs/benchmarks/scale")
IDLE_S = 3.0
BIG_IDLE_S = 10.0
"""The idle rate subtracted from the long-prompt run is measured again just before it, over this
long: at a few requests per second a long prompt's CPU is of the order of the idle rate (the
scrapes of every worker, the sync rounds), so an idle rate read over 3 s right after start-up
(6-11% of a core with 2 workers from run to run) could swallow it."""
SEED_REQUESTS_PER_S = 7_612 / 60
SEED_CHUNKS_PER_S = 6_600_000 / 60
GO_US_PER_CHUNK = 37.0
REACHED_SHARE = 0.95


@dataclass(frozen=True)
class CoresOptions:
    rates: tuple[float, ...] = (50.0, 100.0, 200.0, 300.0)
    duration: float = 8.0
    chunks: int = 64
    big_tokens: int = 195_000
    big_rate: float = 6.0
    big_duration: float = 10.0
    workers: tuple[int, ...] = (1, 2)
    pods: int = 8
    seed: int = 1
    out: Path = OUT


QUICK = CoresOptions(rates=(20.0,), duration=2.0, chunks=8, big_tokens=20_000, big_rate=2.0,
                     big_duration=2.0, pods=2)  # fmt: skip


def log(message: str) -> None:
    print(f"bench scale cores: {message}", flush=True)


Bodies = Callable[[int, int], list[bytes]]
"""``(n, run)`` → ``n`` request bodies for the ``run``-th run of a long-prompt measurement."""


@dataclass
class _Group:
    eset: EppSet
    pid: int
    idle_cores: float = 0.0
    idle_by_pid: dict[int, float] = field(default_factory=dict)
    """Each process's idle rate (``--workers`` > 1: the supervisor and every worker)."""


def _cpu_by_pid(pid: int) -> dict[int, float]:
    return {p: cpu_seconds(p) for p in descendants(pid)}


async def _run(
    group: _Group, payloads: Sequence[bytes], rate: float, duration: float
) -> tuple[Sequence[Shot], float, dict[int, float]]:
    """Drive ``payloads`` open loop; the EPP's CPU net of idle, in all and per process."""
    times = arrivals(rate, duration, "uniform")
    c0, t0 = _cpu_by_pid(group.pid), time.perf_counter()
    shots, _ = await open_loop(group.eset.url, payloads, times, timeout=60.0, stream=True)
    c1, elapsed = _cpu_by_pid(group.pid), time.perf_counter() - t0
    by_pid = {p: c1[p] - c0.get(p, 0.0) - group.idle_by_pid.get(p, 0.0) * elapsed for p in c1}
    cpu = sum(c1.values()) - sum(c0.values()) - group.idle_cores * elapsed
    return shots, max(0.0, cpu), by_pid


APPLY_FAMILY = "llm_d_epp_state_sync_apply_seconds_total"


def apply_seconds(metrics_text: str) -> float:
    """The time the EPP's workers spent applying each other's facts, summed over the workers
    and plugins of a ``/metrics`` page (0 without sharing)."""
    return sum(apply_seconds_by_plugin(metrics_text).values())


def apply_seconds_by_plugin(metrics_text: str) -> dict[str, float]:
    """The same per ``plugin_name`` (summed over the workers)."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith(APPLY_FAMILY + "{") or line.startswith(APPLY_FAMILY + " "):
            labels, value = line.rsplit(" ", 1)
            name = labels.partition('plugin_name="')[2].partition('"')[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _ok(shots: Sequence[Shot]) -> int:
    return sum(1 for s in shots if s.ok)


async def _step(group: _Group, rate: float, opts: CoresOptions) -> dict[str, Any]:
    n = max(1, math.ceil(rate * opts.duration))
    one = bodies(n, opts.seed, max_tokens=1, stream=True)
    many = bodies(n, opts.seed + 1, max_tokens=opts.chunks, stream=True)
    shots1, cpu1, _ = await _run(group, one, rate, opts.duration)
    shots2, cpu2, _ = await _run(group, many, rate, opts.duration)
    ok1, ok2 = _ok(shots1), _ok(shots2)
    per_req = cpu1 / max(ok1, 1)
    per_chunk = max(0.0, cpu2 / max(ok2, 1) - per_req) / (opts.chunks - 1)
    errors = len(shots1) - ok1 + len(shots2) - ok2
    achieved = min(ok1, ok2) / opts.duration
    return {
        "rate": rate,
        "achieved": round(achieved, 1),
        "errors": errors,
        "reached": errors == 0 and achieved >= REACHED_SHARE * rate,
        "us_per_request": round(per_req * 1e6, 1),
        "us_per_chunk": round(per_chunk * 1e6, 2),
        "cores": round(cpu2 / opts.duration, 3),
    }


async def _idle(group: _Group, seconds: float = IDLE_S) -> None:
    """Set the group's idle rate, in all and per process, from ``seconds`` without traffic."""
    c0, t0 = _cpu_by_pid(group.pid), time.perf_counter()
    await asyncio.sleep(seconds)
    c1, elapsed = _cpu_by_pid(group.pid), time.perf_counter() - t0
    group.idle_by_pid = {p: (c1[p] - c0.get(p, 0.0)) / elapsed for p in c1}
    group.idle_cores = (sum(c1.values()) - sum(c0.values())) / elapsed


async def _big(group: _Group, opts: CoresOptions, make: Bodies) -> dict[str, Any]:
    """The long prompts' cost per request: the slope of the CPU between runs at a third of
    ``big_rate`` and at ``big_rate`` (twice each, interleaved), so what the load costs whatever
    the rate (scrapes of busy pods, sync rounds) is not charged to the few requests of a run."""
    low = max(opts.big_rate / 3.0, 0.5)
    sharing = group.eset.workers > 1
    applied = [await _applied(group)] if sharing else []
    runs: list[tuple[float, int, int, float, dict[int, float]]] = []
    for i, rate in enumerate((low, opts.big_rate, low, opts.big_rate)):
        n = max(1, math.ceil(rate * opts.big_duration))
        shots, cpu, each = await _run(group, make(n, i), rate, opts.big_duration)
        runs.append((rate, _ok(shots), len(shots) - _ok(shots), cpu, each))
        if sharing:
            applied.append(await _applied(group))
    slope = _slope([(r[0] == low, r[1], r[3]) for r in runs])
    return {
        **(_applying(applied, [(r[0] == low, r[1]) for r in runs]) if sharing else {}),
        **_by_process(group, [(r[0] == low, r[1], r[4]) for r in runs]),
        "tokens": opts.big_tokens,
        "rate": opts.big_rate,
        "low_rate": round(low, 2),
        "answered": sum(r[1] for r in runs),
        "errors": sum(r[2] for r in runs),
        "us_per_request": round(max(slope, 0.0) * 1e6, 1),
        "us_per_request_at": {
            f"{rate:g}": round(sum(r[3] for r in rs) / max(sum(r[1] for r in rs), 1) * 1e6, 1)
            for rate, rs in (
                (low, [r for r in runs if r[0] == low]),
                (opts.big_rate, [r for r in runs if r[0] != low]),
            )
        },
    }


async def _applied(group: _Group) -> dict[str, float]:
    """The workers' applying time so far, per plugin (``apply_seconds_by_plugin``)."""
    return apply_seconds_by_plugin(await asyncio.to_thread(group.eset.scrape, 0))


def _applying(
    applied: Sequence[dict[str, float]], runs: Sequence[tuple[bool, int]]
) -> dict[str, Any]:
    """What applying the other workers' facts cost per request, from the EPP's own timing read
    before the first run and after each (``applied``; ``runs``: low rate?, answered).

    The mean (``us_applied_per_request``) charges the requests with what the sync rounds cost
    whatever the rate: a plugin whose facts are periodic (the in-flight load producer's full
    refresh every second, one update per round) costs per second, not per request, and at a few
    requests per second that is most of its mean. The slope between the low- and high-rate runs
    (``us_applied_slope``) is what one more request adds, the figure that grows with the rate."""
    answered = max(sum(n for _, n in runs), 1)
    plugins = sorted(applied[-1])
    by_plugin = {p: (applied[-1][p] - applied[0].get(p, 0.0)) / answered * 1e6 for p in plugins}
    slopes = {
        p: max(0.0, _slope([(low, n, applied[i + 1].get(p, 0.0) - applied[i].get(p, 0.0))
                            for i, (low, n) in enumerate(runs)])) * 1e6
        for p in plugins
    }  # fmt: skip
    return {
        "us_applied_per_request": round(sum(by_plugin.values()), 1),
        "us_applied_by_plugin": {p: round(v, 1) for p, v in by_plugin.items()},
        "us_applied_slope": round(sum(slopes.values()), 1),
        "us_applied_slope_by_plugin": {p: round(v, 1) for p, v in slopes.items()},
    }


def _slope(runs: Sequence[tuple[bool, int, float]]) -> float:
    """CPU seconds per answered request between the low-rate and the high-rate runs
    (``(low?, answered, cpu)`` each); the plain average when the rates answered alike."""
    d_req = sum(n for low, n, _ in runs if not low) - sum(n for low, n, _ in runs if low)
    d_cpu = sum(c for low, _, c in runs if not low) - sum(c for low, _, c in runs if low)
    answered = sum(n for _, n, _ in runs)
    return d_cpu / d_req if d_req > 0 else sum(c for _, _, c in runs) / max(answered, 1)


def _by_process(
    group: _Group, runs: Sequence[tuple[bool, int, dict[int, float]]]
) -> dict[str, Any]:
    """With ``--workers`` > 1, each worker's own slope, the busiest first. Envoy holds few
    connections at a few requests per second, so one worker routes nearly all of them and the
    other's CPU is what sharing costs the side that applies the facts (receive, decode, apply),
    measured on that process alone instead of as the difference of two noisy totals."""
    workers = {p for _, _, each in runs for p in each} - {group.pid}
    if len(workers) < 2:
        return {}
    slopes = {p: _slope([(low, n, each.get(p, 0.0)) for low, n, each in runs]) for p in workers}
    ranked = sorted(slopes.values(), reverse=True)
    return {"us_per_request_by_worker": [round(max(v, 0.0) * 1e6, 1) for v in ranked]}


async def _turns(group: _Group, opts: CoresOptions) -> dict[str, Any]:
    """``_big`` for agents' turns, after the shared context has gone in once (unmeasured)."""
    warm, _, _ = await _run(group, turn_bodies(1, opts.big_tokens, opts.seed, -1), 1.0, 1.0)
    if _ok(warm) != len(warm):
        raise RuntimeError("the agent's first turn was not answered")
    row = await _big(group, opts, lambda n, i: turn_bodies(n, opts.big_tokens, opts.seed, i))
    row["tail_tokens"] = TURN_TAIL_TOKENS
    return row


async def measure(workers: int, opts: CoresOptions, workdir: Path) -> dict[str, Any]:
    fleet = FleetSpec(pods=opts.pods, time_scale=4.0, num_gpu_blocks=100_000,
                      max_model_len=1 << 19)  # fmt: skip
    sim = SimProcess(fleet, workdir)
    eset: EppSet | None = None
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        sim.start()
        eps = workdir / "endpoints.yaml"
        eps.write_text(endpoints_yaml(sim))
        eset = EppSet(workdir, epp_config_text(eps, ()), workers=workers, shared=workers > 1)
        eset.start()
        await warm_up(eset.url)
        group = _Group(eset, eset.pids()["epp"])
        await _idle(group)
        steps = []
        for rate in opts.rates:
            steps.append(await _step(group, rate, opts))
            log(f"{workers} worker(s) @ {rate:g}/s: {steps[-1]}")
        first_idle = group.idle_cores
        await _idle(group, min(BIG_IDLE_S, max(IDLE_S, opts.big_duration)))
        big_idle = group.idle_cores
        big_row = await _big(
            group, opts, lambda n, i: big_bodies(n, opts.big_tokens, opts.seed + i)
        )
        big_row["idle_cores"] = round(big_idle, 4)
        log(f"{workers} worker(s), {opts.big_tokens:,}-token prompts: {big_row}")
        turn_row = await _turns(group, opts)
        log(f"{workers} worker(s), {opts.big_tokens:,}-token agent turns: {turn_row}")
        return {"workers": workers, "status": "ok", "idle_cores": round(first_idle, 4),
                "steps": steps, "big": big_row, "turns": turn_row}  # fmt: skip
    except Exception as exc:
        log(f"{workers} worker(s): failed: {type(exc).__name__}: {exc}")
        return {"workers": workers, "status": "failed", "reason": f"{exc}"[:500], "steps": []}
    finally:
        if eset is not None:
            eset.stop()
        sim.stop()


def peak_cores(us_per_request: float, us_per_chunk: float) -> float:
    """Cores at llm-d's published peak for these costs per request and per streamed chunk."""
    return (SEED_REQUESTS_PER_S * us_per_request + SEED_CHUNKS_PER_S * us_per_chunk) / 1e6


def computed(group: dict[str, Any]) -> dict[str, Any]:
    """The cores at llm-d's published peak from one group's largest reached rate."""
    reached = [s for s in group.get("steps", []) if s["reached"]] or group.get("steps", [])
    if not reached or not group.get("big"):
        return {}
    top = max(reached, key=lambda s: s["rate"])
    per_req = group["big"]["us_per_request"] / 1e6
    per_chunk = top["us_per_chunk"] / 1e6
    ours = peak_cores(group["big"]["us_per_request"], top["us_per_chunk"])
    go = SEED_CHUNKS_PER_S * GO_US_PER_CHUNK / 1e6
    turns = group.get("turns") or {}
    per_turn = {
        "us_per_request_turn": turns["us_per_request"],
        "cores_turns": round(peak_cores(turns["us_per_request"], top["us_per_chunk"]), 2),
    } if turns else {}  # fmt: skip
    applied = {  # what applying the other worker's facts cost per request: as the EPP timed it
        # (llm_d_epp_state_sync_apply_seconds_total), else the least busy worker's own CPU
        key: row.get(
            "us_applied_slope",
            row.get("us_applied_per_request", row["us_per_request_by_worker"][-1]),
        )
        for key, row in (("us_applied_195k", group["big"]), ("us_applied_turn", turns))
        if row.get("us_per_request_by_worker")
    }
    return {
        **per_turn,
        **applied,
        "at_rate": top["rate"],
        "us_per_request_195k": group["big"]["us_per_request"],
        "us_per_chunk": top["us_per_chunk"],
        "cores": round(ours, 2),
        "cores_requests": round(SEED_REQUESTS_PER_S * per_req, 2),
        "cores_chunks": round(SEED_CHUNKS_PER_S * per_chunk, 2),
        "workers_needed": math.ceil(ours),
        "go_cores_chunks_only": round(go, 2),
    }


SCALING_WORKERS = (1, 2, 3, 4, 8)


def scaling(groups: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The cores at llm-d's peak with N workers, computed from the 1- and 2-worker costs.

    What a worker adds to every request is the other's prefix-index facts applied to its own
    index, paid once per other worker: ``per_request(N) = per_request(1) + (N - 1) x added``.
    ``added`` is what applying the other worker's facts cost per request with 2 workers
    (``us_applied_*``: the EPP's own timing of it, ``llm_d_epp_state_sync_apply_seconds_total``,
    or from reports without that the least busy worker's CPU slope), or, from reports without
    either, ``max(0, per_request(2) - per_request(1))``, which is also
    kept (``us_added_per_worker*``). A chunk touches no shared state: its 1-worker cost holds
    for any N. The same from the agents' turns' costs (``us_per_request_turn``) where both groups
    measured them. Empty without both groups."""
    by = {g["workers"]: g.get("computed") or {} for g in groups if g.get("status") == "ok"}
    one, two = by.get(1), by.get(2)
    if not one or not two:
        return {}
    out: dict[str, Any] = {}
    rows: list[dict[str, Any]] = [{"workers": n} for n in SCALING_WORKERS]
    for key, suffix, cores_key in (("us_per_request_195k", "", "cores"),
                                   ("us_per_request_turn", "_turn", "cores_turns")):  # fmt: skip
        if key not in one or key not in two:
            continue
        added = max(0.0, two[key] - one[key])
        out[f"us_added_per_worker{suffix}"] = round(added, 1)
        applied = two.get(f"us_applied{suffix or '_195k'}")
        if applied is not None:
            out[f"us_applied_per_worker{suffix}"] = applied
            added = applied
        for row in rows:
            per_req = one[key] + (row["workers"] - 1) * added
            row[key] = round(per_req, 1)
            row[cores_key] = round(peak_cores(per_req, one["us_per_chunk"]), 2)
    return {**out, "rows": rows}


async def run(opts: CoresOptions) -> dict[str, Any]:
    groups = [await measure(w, opts, WORK / f"cores-w{w}") for w in opts.workers]
    for g in groups:
        g["computed"] = computed(g)
    seed = {"requests_per_s": SEED_REQUESTS_PER_S, "chunks_per_s": SEED_CHUNKS_PER_S,
            "go_us_per_chunk": GO_US_PER_CHUNK}  # fmt: skip
    return {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
            "seed": seed, "groups": groups, "scaling": scaling(groups)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="epp bench scale cores", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="one low rate, small prompts (CI)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    from dataclasses import replace

    from epp_tools.bench.scale.cores_report import cores_md

    opts = replace(QUICK if args.quick else CoresOptions(), out=args.out)
    report = asyncio.run(run(opts))
    report["command"] = "epp bench scale cores" + (" --quick" if args.quick else "")
    name = "cores-quick" if args.quick else "cores"
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = cores_md(report)
    (opts.out / f"{name}.md").write_text(markdown)
    print(markdown)
    return 0 if all(g["status"] == "ok" for g in report["groups"]) else 1

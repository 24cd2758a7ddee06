"""EPP-side scenarios of ``epp bench day2``: rolling upgrades (active-active and leader-elected),
a leader crash and a bad config rolled out (see ``epp_tools.bench.day2.cli`` for what each
expects)."""

from __future__ import annotations

import asyncio
import math
import time

import yaml

from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp_tools.bench.day2.report import Row
from epp_tools.bench.day2.rig import (
    RECOVERED,
    Day2Options,
    Phases,
    Stage,
    ha_args,
    log,
    run_load,
    stage,
)
from epp_tools.bench.runner.agentload import between, hit_ratio, recovery_seconds
from epp_tools.bench.runner.driver import Outcome
from epp_tools.stack.eppconfig import with_syncer


def _recovery(outcomes: list[Outcome], phases: Phases, until: float) -> float:
    level = RECOVERED * hit_ratio(phases.before)
    if math.isnan(level):
        return math.nan
    return recovery_seconds(outcomes, phases.t1, level, limit=max(0.0, until - phases.t1 - 2.0))


async def _replace(st: Stage, old: int, new: int, tasks: list[asyncio.Task[None]]) -> None:
    """A Deployment's step with maxUnavailable 0: the new pod ready, then the old one stopped
    (SIGTERM: NOT_SERVING at once, in-flight streams served for the drain, then exit)."""
    await asyncio.to_thread(st.epp.start_replica, new)
    await st.wait_slots(lambda s: new in s)
    tasks.append(asyncio.create_task(asyncio.to_thread(st.epp.stop_replica, old)))
    await st.wait_slots(lambda s: old not in s)


async def upgrade_active_active(opts: Day2Options) -> Row:
    row = Row(
        "upgrade-active-active",
        "3 replicas + Redis replaced one at a time (new ready, then old SIGTERMed and drained)",
        "0 failed; hit ratio during >= 95% of before",
    )
    async with stage(opts, row.scenario, slots=6, initial=3, shared=True) as st:
        run = await run_load(opts, st.epp.url)
        t0 = run.now()
        stops: list[asyncio.Task[None]] = []
        for k in range(3):
            await _replace(st, k, 3 + k, stops)
            log(f"{row.scenario}: replica {k} replaced at {run.now():.1f}s")
        await asyncio.gather(*stops)
        t1 = run.now()
        outcomes = await run.finish(opts.after)
    phases = Phases(outcomes, t0, t1)
    row.measure(outcomes, phases)
    row.recovery_s = _recovery(outcomes, phases, t1 + opts.after)
    row.ok = row.failed == 0 and row.hit_during >= RECOVERED * row.hit_before
    row.notes.append(f"rolling upgrade took {t1 - t0:.1f} s (drain {opts.drain:g} s each)")
    return row


async def _watch_handover(
    st: Stage, new: set[int], until: asyncio.Event, t0: float
) -> tuple[float, float]:
    """Until ``until`` is set: seconds during which Envoy found no EPP replica SERVING, and when
    (``perf_counter``) one of ``new`` was first found SERVING (NaN: never)."""
    gap, first, last = 0.0, math.nan, time.perf_counter()
    while not until.is_set():
        slots = await asyncio.to_thread(st.healthy_slots)
        now = time.perf_counter()
        if not slots:
            gap += now - last
        if slots & new and math.isnan(first):
            first = now - t0
        last = now
        await asyncio.sleep(0.02)
    return gap, first


async def upgrade_ha(opts: Day2Options) -> Row:
    row = Row(
        "upgrade-ha",
        "leader + hot standby replaced (new pod started, old ones SIGTERMed: the leader "
        "releases its lease and drains)",
        "0 failed",
    )
    ha = [*ha_args(opts)]
    async with stage(opts, row.scenario, slots=4, initial=2, shared=True, extra=ha,
                     serving=1) as st:  # fmt: skip
        run = await run_load(opts, st.epp.url)
        (leader,) = await st.wait_slots(lambda s: len(s) == 1)
        done = asyncio.Event()
        t0 = run.now()
        # maxSurge 1, maxUnavailable 100% (deploy/kubernetes/ha): a new pod, then every old one
        await asyncio.to_thread(st.epp.start_replica, 2)
        stops = [asyncio.create_task(asyncio.to_thread(st.epp.stop_replica, k)) for k in (0, 1)]
        t_term = run.now()
        watch = asyncio.create_task(_watch_handover(st, {2, 3}, done, run.start))
        await asyncio.to_thread(st.epp.start_replica, 3)
        new_leader = await st.wait_slots(lambda s: bool(s & {2, 3}))
        await asyncio.gather(*stops)
        t1 = run.now()
        done.set()
        gap, t_led = await watch
        outcomes = await run.finish(opts.after)
    phases = Phases(outcomes, t0, t1)
    row.measure(outcomes, phases)
    row.recovery_s = _recovery(outcomes, phases, t1 + opts.after)
    row.figures = {"no_leader_s": gap, "new_leader_after_s": t_led - t_term}
    row.ok = row.failed == 0
    row.notes.append(
        f"old leader slot {leader}; new leader slot {sorted(new_leader)} serving "
        f"{t_led - t_term:.2f} s after the SIGTERM; no replica SERVING for {gap:.2f} s in all"
    )
    return row


async def leader_crash(opts: Day2Options) -> Row:
    row = Row(
        "leader-crash",
        "leader SIGKILLed (no lease release); the hot standby takes over",
        f"standby routing within the lease ({opts.lease:g} s) + 1 s; its first "
        f"{opts.window:g} s at >= 95% of the old leader's hit ratio",
    )
    ha = [*ha_args(opts)]
    async with stage(opts, row.scenario, slots=2, initial=2, shared=True, extra=ha,
                     serving=1) as st:  # fmt: skip
        run = await run_load(opts, st.epp.url)
        (leader,) = await st.wait_slots(lambda s: len(s) == 1)
        t_kill = run.now()
        await asyncio.to_thread(st.epp.stop_replica, leader, kill=True)
        await st.wait_slots(lambda s: bool(s - {leader}), timeout=opts.lease * 4 + 30)
        t_healthy = run.now()
        await asyncio.sleep(opts.window)
        outcomes = await run.finish(opts.after)
    first_ok = min((o.sent for o in outcomes if o.ok and o.sent >= t_kill), default=math.nan)
    t_route = first_ok if math.isfinite(first_ok) else t_healthy
    phases = Phases(outcomes, t_kill, t_route)
    row.measure(outcomes, phases)
    old = hit_ratio(between(outcomes, phases.settle, t_kill))
    new = hit_ratio(between(outcomes, t_route, t_route + opts.window))
    gap = t_route - t_kill
    row.hit_during = new  # the standby's first window is the column that matters here
    row.figures = {"gap_s": gap, "old_leader_hit": old, "standby_first_window_hit": new}
    row.ok = gap <= opts.lease + 1.0 and new >= RECOVERED * old
    row.notes.append(
        f"standby routed {gap:.2f} s after the kill (Envoy found it SERVING after "
        f"{t_healthy - t_kill:.2f} s); {row.failed} requests failed meanwhile (fail-closed "
        f"Envoy); hit ratio {100 * old:.1f}% before, {100 * new:.1f}% in its first "
        f'{opts.window:g} s ("during" column)'
    )
    return row


def bad_config() -> str:
    """The default config with a misspelt scorer parameter (``blockSizze``)."""
    doc = yaml.safe_load(DEFAULT_CONFIG_TEXT)
    for plugin in doc["plugins"]:
        if plugin["type"] == "prefix-cache-scorer":
            plugin["parameters"] = {"blockSizze": 16}
    return str(yaml.safe_dump(doc, sort_keys=False))


async def bad_config_rollout(opts: Day2Options) -> Row:
    row = Row(
        "bad-config",
        "a new replica with a misspelt config parameter rolled into 3 replicas + Redis",
        "0 failed; the new replica never ready, with a clear log line; the old ones serve",
    )
    path = opts.workdir / row.scenario / "bad-config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    args = {3: ["--config-file", str(path)]}
    async with stage(opts, row.scenario, slots=4, initial=3, shared=True,
                     slot_args=args) as st:  # fmt: skip
        assert st.epp.redis is not None
        path.write_text(with_syncer(bad_config(), st.epp.redis.url))
        run = await run_load(opts, st.epp.url)
        t0 = run.now()
        error = ""
        try:
            await asyncio.to_thread(st.epp.start_replica, 3, 20.0)
        except (RuntimeError, TimeoutError) as exc:
            error = str(exc)
        # the Deployment waits for the new pod, which never becomes ready (maxUnavailable 0)
        seen = set()
        deadline = time.perf_counter() + opts.after
        while time.perf_counter() < deadline:
            seen |= await asyncio.to_thread(st.healthy_slots)
            await asyncio.sleep(0.1)
        serving = await asyncio.to_thread(st.healthy_slots)
        t1 = run.now()
        outcomes = await run.finish(1.0)
        log_text = st.epp.procs[3].log_tail(20_000)
    phases = Phases(outcomes, t0, t1)
    row.measure(outcomes, phases)
    line = next((ln for ln in log_text.splitlines() if "blockSizze" in ln), "")
    row.ok = row.failed == 0 and 3 not in seen and serving == {0, 1, 2} and bool(line)
    row.notes.append(
        f"the new replica {'exited' if 'exited' in error else 'stayed unready'}; its log: "
        f"`{line.strip()[:160]}`; replicas SERVING at the end: {sorted(serving)}"
    )
    return row

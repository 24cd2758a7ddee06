"""Control-plane scenarios of ``epp bench chaos``: the EPP killed and restarted behind a
fail-open and a fail-closed Envoy, and the Kubernetes API server going away (see
``epp_tools.bench.chaos.cli``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp_tools.bench.chaos.load import Shot, StreamLoad, between, failures
from epp_tools.bench.chaos.pod_scenarios import loaded, rig
from epp_tools.bench.chaos.report import Row
from epp_tools.bench.chaos.rig import ChaosOptions
from epp_tools.bench.fleet import PodSet, sim_pod
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import PODS, POOLS, pod, pool
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.envoy import free_port
from epp_tools.stack.procs import START_TIMEOUT
from epp_tools.stack.replicas import EppSet, wait_endpoints

POOL = "vllm-pool"
LABELS = {"app": "vllm"}


async def epp_kill(opts: ChaosOptions, *, fail_open: bool) -> Row:
    name = "epp-kill-open" if fail_open else "epp-kill-closed"
    fault = f"EPP SIGKILLed, restarted after {opts.fault:g} s"
    expected = "0 failures" if fail_open else "failures counted; recovery after restart"
    row = Row(name, fault + (" (fail-open Envoy)" if fail_open else " (fail-closed Envoy)"),
              expected)  # fmt: skip
    async with rig(opts, name, 4, fail_open=fail_open) as r:
        load = await loaded(opts, r.epp.url)
        t_kill = time.perf_counter()
        await asyncio.to_thread(r.epp.stop_replica, 0, kill=True)
        await asyncio.sleep(opts.fault)
        t_restart = time.perf_counter()
        await asyncio.to_thread(r.epp.start_replica, 0)
        t_ready = time.perf_counter()
        await _answered_since(load, t_restart)
        await asyncio.sleep(opts.after)
        shots = await load.stop()
    row.count(shots)
    down = between(shots, t_kill, t_restart)
    if fail_open:
        row.ok = row.failed == 0
        row.notes.append(
            f"EPP down {t_restart - t_kill:.1f} s: {len(down)} requests sent meanwhile, "
            f"{sum(1 for s in down if s.ok)} answered (the fallback route); its process ready "
            f"{t_ready - t_restart:.1f} s after the restart"
        )
        return row
    row.recovery_s = _recovery(shots, t_restart)
    # every failure was in flight at the kill or sent before the EPP answered again
    row.attributed = len(
        [s for s in failures(shots) if s.ended >= t_kill and s.sent < t_restart + row.recovery_s]
    )
    row.ok = row.unexplained == 0 and row.recovery_s == row.recovery_s  # recovered (not NaN)
    cut = [s for s in failures(shots) if s.sent < t_kill]
    row.notes.append(
        f"EPP down {t_restart - t_kill:.1f} s; {len(cut)} streams in flight at the kill cut, "
        f"{row.failed - len(cut)} requests refused (500) until it answered again (clients "
        f"retry after 50 ms); its process ready {t_ready - t_restart:.1f} s after the restart, "
        f"first request answered {row.recovery_s:.2f} s after the restart"
    )
    return row


async def _answered_since(load: StreamLoad, t: float) -> None:
    """Until a request sent at or after ``t`` has succeeded (or ``START_TIMEOUT`` has passed):
    the ``after`` window starts once the restarted EPP answers, so a slow start on a busy machine
    still shows its recovery rather than end the run first."""
    deadline = time.perf_counter() + START_TIMEOUT
    while time.perf_counter() < deadline:
        if any(s.ok and s.sent >= t for s in reversed(load.shots)):
            return
        await asyncio.sleep(0.05)


def _recovery(shots: list[Shot], t_restart: float) -> float:
    """Seconds from ``t_restart`` to the first request sent after it that succeeded."""
    after = [s for s in shots if s.ok and s.sent >= t_restart]
    return min((s.sent - t_restart for s in after), default=float("nan"))


async def apiserver_gone(opts: ChaosOptions) -> Row:
    row = Row(
        "apiserver-gone",
        f"API server stopped {opts.fault:g} s; a pod deleted and one created meanwhile",
        "0 failures; the changes take effect after it is back",
    )
    workdir = opts.workdir / row.scenario
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    hosts = [f"127.0.0.{i + 2}" for i in range(5)]
    pods = PodSet(workdir, FleetSpec(pods=1, time_scale=opts.time_scale), 5, hosts, port)
    api = LocalApiServer(bookmark_interval=0.5)
    epp = EppSet(workdir, DEFAULT_CONFIG_TEXT)
    try:
        await asyncio.to_thread(pods.start)
        api.start()
        api.create(POOLS, pool(POOL, LABELS, (port,)))
        for i in range(4):
            api.create(PODS, pod(f"pod-{i}", hosts[i], LABELS))
        epp.extra_args = _kube_args(api, workdir)
        await asyncio.to_thread(epp.start)
        await asyncio.to_thread(wait_endpoints, epp.ports[0].metrics, 4)
        times = await _apiserver_outage(opts, api, epp, hosts)
    finally:
        await asyncio.to_thread(epp.stop)
        api.stop()
        await asyncio.to_thread(pods.stop)
    shots, t_gone, t_back = times
    row.count(shots)
    new = [s for s in shots if s.ok and sim_pod(s.pod) == "pod-4"]
    gone = [s for s in shots if s.ok and sim_pod(s.pod) == "pod-3" and s.sent >= t_back]
    row.recovery_s = min((s.sent - t_back for s in new), default=float("nan"))
    last_old = max((s.sent - t_back for s in gone), default=0.0)
    during = between(shots, t_gone, t_back)
    row.ok = row.failed == 0 and bool(new) and last_old < max(1.0, row.recovery_s + 1.0)
    row.notes.append(
        f"{len(during)} requests while the API server was away, "
        f"{len(failures(during))} failed; the created pod served its first request "
        f"{row.recovery_s:.2f} s after the API server came back, the deleted one its last "
        f"{last_old:.2f} s after"
    )
    return row


def _kube_args(api: LocalApiServer, workdir: Path) -> list[str]:
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    # In Kubernetes mode the metrics port asks the API server to review each caller's token (the
    # default, as upstream); the bench reads /metrics and /debug without one, and the local API
    # server reviews no tokens, so that check is off here.
    return [
        "--kubeconfig", str(kubeconfig), "--pool-name", POOL, "--pool-namespace", "default",
        "--metrics-endpoint-auth=false",
    ]  # fmt: skip


async def _apiserver_outage(
    opts: ChaosOptions, api: LocalApiServer, epp: EppSet, hosts: list[str]
) -> tuple[list[Shot], float, float]:
    load = await loaded(opts, epp.url)
    t_gone = time.perf_counter()
    await asyncio.to_thread(api.stop)
    api.delete(PODS, "pod-3")
    api.create(PODS, pod("pod-4", hosts[4], LABELS))
    await asyncio.sleep(opts.fault)
    await asyncio.to_thread(api.start)
    t_back = time.perf_counter()
    await asyncio.sleep(opts.after)
    return await load.stop(), t_gone, t_back

"""``epp stack``: a real Envoy, simulated vLLM pods and the EPP on this machine, one command.

It routes one request and shows where it went, drives a short seeded mixed workload through the
EPP, then the same workload on a fresh fleet through Envoy's own round robin, and prints a table
(requests per pod, prefix-cache hit ratio, TTFT p50/p90). Then a second table on a short agentic
workload (``epp_tools.stack.workload.agentic_workload``: coding agents resending a long, growing
context every turn, a harness prompt they share and a task context each), in real time
(``--agentic-time-scale``, default 1), TTFT counted to the first content token: there keeping an
agent on the pod that holds its context saves the prefill a router that spreads the turns pays
again. Everything it starts is stopped on exit or Ctrl-C (Envoy also dies with this process: it
sets PDEATHSIG).

With ``--pd`` it compares aggregated serving with disaggregated prefill/decode on unique long
prompts with long answers: first the pods all ``both`` behind the built-in default config, then
on a fresh fleet ``--prefill-pods`` of them (default half) as prefill pods and the others as
decode pods, labelled ``llm-d.ai/role``, behind ``deploy/configs/pd.yaml`` (or
``--config-file``); the table shows TTFT, ITL, output tokens per second and the share of answers
prefilled on another pod. When that config's plugins do not load the P/D run is skipped with the
reason.

With ``--replicas N`` (N ≥ 2) the EPP runs as N active-active replicas behind the one Envoy, which
balances ext_proc streams over the replicas its gRPC health check finds ready; they share routing
state (prefix-cache blocks, in-flight load) through a ``redis-server`` started on a free local
port (it must be installed), each config being the stack's plus the ``redis-syncer``
(``epp_tools.stack.replicas``). After the first table another shows each replica's ext_proc
streams, requests and cross-replica sync. ``--replicas`` does not combine with ``--pd``. With
``--keep-running`` the stack stays up after the first table (the agentic run does not happen).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from epp.plugins.sources.file_discovery import dump_endpoints
from epp_tools.sim.config import PodConfig, Role
from epp_tools.sim.fleet import SimFleet
from epp_tools.stack.envoy import Envoy
from epp_tools.stack.eppconfig import PD_CONFIG, epp_config_text, unloadable_plugins
from epp_tools.stack.procs import Proc, Terminated, until_terminated
from epp_tools.stack.replicas import EppSet, SetupError, check_replicas, report_table
from epp_tools.stack.workload import (
    Summary,
    WorkItem,
    agentic_workload,
    drive,
    long_prompt_workload,
    mixed_workload,
    pd_table,
    summarize,
    table,
)

MODEL = "sim-model"
ROLE_LABEL = "llm-d.ai/role"
Waves = list[list[WorkItem]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp stack", description=__doc__)
    p.add_argument("--pods", type=int, default=4, help="simulated model-server pods (default 4)")
    p.add_argument("--concurrency", type=int, default=8, help="client concurrency (default 8)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="simulator speed-up (default 10: simulated time runs 10x faster)",
    )
    p.add_argument(
        "--num-gpu-blocks",
        type=int,
        default=2000,
        help="KV blocks per simulated pod (default 2000 x 16 tokens)",
    )
    p.add_argument(
        "--config-file",
        default="",
        help="EndpointPickerConfig for the EPP (default: the built-in default config)",
    )
    p.add_argument(
        "--agentic-time-scale",
        type=float,
        default=1.0,
        help="simulator speed-up of the agentic run (default 1: real time, so that the prefill "
        "an EPP saves and the time it takes to route compare as they would in a deployment)",
    )
    p.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    p.add_argument("--skip-baseline", action="store_true", help="do not run the round-robin run")
    p.add_argument(
        "--pd",
        action="store_true",
        help="compare aggregated serving with disaggregated prefill/decode on long prompts "
        "(--config-file then names the P/D config, default deploy/configs/pd.yaml)",
    )
    p.add_argument(
        "--prefill-pods",
        type=int,
        default=0,
        help="with --pd: how many of the pods prefill (default: half of them)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="EPP replicas (default 1); 2 or more run active-active behind the one Envoy, "
        "sharing state through a local redis-server (which must be installed)",
    )
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="after the table, keep Envoy + EPP + pods up until Ctrl-C, and print the epp "
        "explain/endpoints/state commands that look inside this EPP",
    )
    return p


def _endpoints_file(ports: Sequence[int], workdir: Path, roles: Sequence[Role] = ()) -> Path:
    path = workdir / "endpoints.yaml"
    labels = {f"pod-{i}": {ROLE_LABEL: role} for i, role in enumerate(roles)}
    entries = ((f"pod-{i}", "127.0.0.1", p) for i, p in enumerate(ports))
    path.write_text(dump_endpoints(entries, labels=labels))
    return path


def _fleet(args: argparse.Namespace, roles: Sequence[Role] = ()) -> SimFleet:
    return SimFleet(
        [
            PodConfig(
                name=f"pod-{i}",
                model=MODEL,
                time_scale=args.time_scale,
                num_gpu_blocks=args.num_gpu_blocks,
                role=roles[i] if roles else "both",
            )
            for i in range(args.pods)
        ]
    )


def pd_roles(pods: int, prefill_pods: int) -> list[Role]:
    """``prefill_pods`` prefill pods (default half, at least one) first, then decode pods."""
    n = prefill_pods or max(1, pods // 2)
    if not 1 <= n < pods:
        raise ValueError(f"--prefill-pods must leave at least one of {pods} pods to decode")
    prefill: list[Role] = ["prefill"] * n
    decode: list[Role] = ["decode"] * (pods - n)
    return prefill + decode


FIRST_PROMPT = "Say hello to the endpoint picker."


async def _first_request(url: str, fleet: SimFleet) -> None:
    body = {"model": MODEL, "prompt": FIRST_PROMPT, "max_tokens": 8}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body) as r:
        pod = r.headers.get("x-sim-pod", "?")
        text = json.loads(await r.read())
    port = fleet.ports[int(pod.rsplit("-", 1)[1])] if pod.startswith("pod-") else "?"
    prefill = r.headers.get("x-sim-prefill-pod", pod)
    where = f", prefilled on {prefill}" if prefill != pod else ""
    print(
        f"routed: POST {url}/v1/completions -> {pod} (127.0.0.1:{port}){where}, HTTP {r.status}, "
        f"{text.get('usage', {}).get('completion_tokens', 0)} tokens"
    )


async def _wait_scraped(metrics_url: str, proc: Proc, pods: int, timeout: float = 60.0) -> None:
    """Until the EPP has scraped every pod once (its ``/debug/endpoints`` view); a busy machine
    can take tens of seconds to start it, so the bound is generous and its error says what."""
    try:
        await _poll_scraped(metrics_url, proc, pods, timeout)
    except TimeoutError:
        raise RuntimeError(
            f"the EPP had not scraped all {pods} pods after {timeout:.0f} s:\n{proc.log_tail()}"
        ) from None


async def _poll_scraped(metrics_url: str, proc: Proc, pods: int, timeout: float) -> None:
    async with asyncio.timeout(timeout), aiohttp.ClientSession() as s:
        while True:
            if not proc.alive():
                raise RuntimeError(f"the EPP exited:\n{proc.log_tail()}")
            try:
                async with s.get(f"{metrics_url}/debug/endpoints") as r:
                    eps = (await r.json())["endpoints"]
                    if len(eps) == pods and all(e.get("metrics") for e in eps):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)


async def _run_epp(
    args: argparse.Namespace,
    workdir: Path,
    waves: Waves,
    *,
    title: str = "EPP (default config)",
    base: str | None = None,
    roles: Sequence[Role] = (),
    announce: bool = True,
) -> tuple[Summary, str]:
    """The workload through Envoy and the stack's EPP replicas: its summary, and with several
    replicas the table of what each one did."""
    workdir.mkdir(parents=True, exist_ok=True)
    async with _fleet(args, roles) as fleet:
        eps = _endpoints_file(fleet.ports, workdir, roles)
        text = epp_config_text(eps, (), base)
        group = _epp_set(args, workdir, text, experimental=bool(roles)).launch()
        try:
            for i, proc in enumerate(group.procs):
                await _wait_scraped(group.http_url(i), proc, len(fleet.ports))
            envoy = group.start_envoy()
            if args.replicas > 1:
                await envoy.wait_healthy(args.replicas, timeout=30.0)
            if announce:
                print(group.describe(len(fleet.ports)))
                await _first_request(envoy.url, fleet)
            results = await drive(envoy.url, waves, model=MODEL, concurrency=args.concurrency)
            summary = summarize(title, results)
            report = ""
            if args.replicas > 1:
                report = report_table(await group.report(expected=len(results) + int(announce)))
            if args.keep_running:
                await _keep_running(args, group, summary, report)
        finally:
            group.stop()
    return summary, report


def _epp_set(args: argparse.Namespace, workdir: Path, text: str, *, experimental: bool) -> EppSet:
    """The stack's EPPs: each in its own process (as in production), TLS on as by default;
    several replicas share state through Redis, each with its own seed."""
    several = args.replicas > 1
    return EppSet(
        workdir, text, replicas=args.replicas, shared=several, tls=True, seeds=several,
        extra_args=["--allow-experimental-plugins"] if experimental else [],
    )  # fmt: skip


async def _keep_running(
    args: argparse.Namespace, group: EppSet, summary: Summary, report: str
) -> None:
    print(pd_table([summary]) if args.pd else table([summary]))
    if report:
        print(report)
    print("stack is up; Ctrl-C to stop. Look inside from another shell:")
    for command in group.admin_commands(MODEL, FIRST_PROMPT):
        print(f"  {command}")
    sys.stdout.flush()
    await asyncio.Event().wait()


async def _run_baseline(args: argparse.Namespace, waves: Waves) -> Summary:
    async with _fleet(args) as fleet:
        with Envoy("round-robin", fallback=[("127.0.0.1", p) for p in fleet.ports]) as envoy:
            results = await drive(envoy.url, waves, model=MODEL, concurrency=args.concurrency)
    return summarize("Envoy round robin", results)


def _pd_config(args: argparse.Namespace) -> tuple[str, str]:
    """(P/D config text, ``""``) or (``""``, the reason the P/D run cannot happen)."""
    path = Path(args.config_file) if args.config_file else PD_CONFIG
    if not path.is_file():
        return "", f"{path} not found (give a P/D config with --config-file)"
    text = path.read_text()
    missing = unloadable_plugins(text)
    if missing:
        return "", f"{path.name} needs plugin types not available here: {', '.join(missing)}"
    return text, ""


async def _main_pd(args: argparse.Namespace) -> int:
    roles = pd_roles(args.pods, args.prefill_pods)
    waves = long_prompt_workload(seed=args.seed)
    text, reason = _pd_config(args)
    with tempfile.TemporaryDirectory(prefix="epp-stack-") as tmp:
        if reason:
            print(f"P/D run skipped: {reason}")
            args.keep_running = False
        aggregated, _ = await _run_epp(
            args, Path(tmp) / "aggregated", waves, title="EPP aggregated"
        )
        rows = [aggregated]
        if not reason:
            title = f"EPP P/D ({roles.count('prefill')}P/{roles.count('decode')}D)"
            pd, _ = await _run_epp(
                args, Path(tmp) / "pd", waves, title=title, base=text, roles=roles
            )
            rows.append(pd)
    item = waves[0][0]
    print()
    print(
        f"{len(waves[0])} unique prompts of {len(item.messages[0]['content']) // 4} tokens, "
        f"{item.max_tokens} output tokens, fresh fleet each ({args.pods} pods, time scale "
        f"{args.time_scale:g}x; wall-clock ms, TTFT to the first content chunk):"
    )
    print(pd_table(rows))
    return 0 if all(r.errors == 0 for r in rows) else 1


async def _main(args: argparse.Namespace) -> int:
    if args.pd:
        return await _main_pd(args)
    with tempfile.TemporaryDirectory(prefix="epp-stack-") as tmp:
        base = Path(args.config_file).read_text() if args.config_file else None
        title = (
            f"EPP x{args.replicas} active-active" if args.replicas > 1 else "EPP (default config)"
        )
        summary, report = await _run_epp(
            args, Path(tmp) / "epp", mixed_workload(seed=args.seed), title=title, base=base
        )
        rows: list[Summary] = [summary]
        if not args.skip_baseline:
            rows.append(await _run_baseline(args, mixed_workload(seed=args.seed)))
        _print_mixed(args, rows, report)
        agentic = agentic_workload(seed=args.seed)
        real = argparse.Namespace(**{**vars(args), "time_scale": args.agentic_time_scale})
        summary, _ = await _run_epp(
            real, Path(tmp) / "agentic", agentic, title=title, base=base, announce=False
        )
        agent_rows: list[Summary] = [summary]
        if not args.skip_baseline:
            agent_rows.append(await _run_baseline(real, agentic))
    print()
    print(f"{_describe_agents(agentic)};")
    print(
        f"fresh fleet each (time scale {real.time_scale:g}x; TTFT to the first content token, "
        "its prefill included, in wall-clock ms):"
    )
    print(table(agent_rows, first_token=True))
    return 0 if all(r.errors == 0 for r in (*rows, *agent_rows)) else 1


def _print_mixed(args: argparse.Namespace, rows: Sequence[Summary], report: str) -> None:
    print()
    print(
        f"same seeded workload, fresh fleet each ({args.pods} pods, time scale "
        f"{args.time_scale:g}x; TTFT in wall-clock ms):"
    )
    print(table(rows))
    if report:
        print()
        print(
            f"{args.replicas} EPP replicas (streams: ext_proc streams Envoy sent each; requests, "
            "facts published to and applied from the other replicas, sync errors and lag: each "
            "replica's /metrics):"
        )
        print(report)
    sys.stdout.flush()


def _describe_agents(waves: Waves) -> str:
    """What the agentic workload is, in tokens (the simulator's 4 bytes per token)."""
    first, last = waves[0][0].messages, waves[-1][0].messages
    harness, context = (len(m["content"]) // 4 for m in first[:2])
    total = sum(len(m["content"]) for m in last) // 4
    return (
        f"{len(waves[0])} coding agents x {len(waves)} turns, each resending its whole context "
        f"(up to {total} tokens): a {harness}-token harness prompt they share, a {context}-token "
        "task context of its own, a tool result per turn"
    )


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot run, before anything starts."""
    if args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    if args.replicas > 1 and args.pd:
        parser.error("--replicas and --pd cannot be combined: the P/D comparison runs one EPP")
    if args.pd:
        try:
            pd_roles(args.pods, args.prefill_pods)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        check_replicas(args.replicas)
    except SetupError as exc:
        parser.error(str(exc))


async def _until_terminated(args: argparse.Namespace) -> int:
    """``_main``; SIGTERM stops it as Ctrl-C does (what it started is stopped, not orphaned)."""
    try:
        return await until_terminated(_main(args))
    except Terminated:
        print(f"\n{STOPPED} (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM


STOPPED = "stopped; everything started by this command is shut down"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_until_terminated(args))
    except KeyboardInterrupt:
        print(f"\n{STOPPED}", file=sys.stderr)
        return 130

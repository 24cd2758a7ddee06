"""``epp stack``: a real Envoy, simulated vLLM pods and the EPP on this machine, one command.

It routes one request and shows where it went, drives a short seeded mixed workload through the
EPP, then the same workload on a fresh fleet through Envoy's own round robin, and prints a table
(requests per pod, prefix-cache hit ratio, TTFT p50/p90). Everything it starts is stopped on exit
or Ctrl-C (Envoy also dies with this process: it sets PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from epp.localstack.envoy import Envoy, free_port
from epp.localstack.eppconfig import epp_config_text
from epp.localstack.procs import Proc
from epp.localstack.workload import Summary, drive, mixed_workload, summarize, table
from epp.plugins.sources.file_discovery import dump_endpoints
from epp.sim.config import PodConfig
from epp.sim.fleet import SimFleet

MODEL = "sim-model"


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
    p.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    p.add_argument("--skip-baseline", action="store_true", help="do not run the round-robin run")
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="after the table, keep Envoy + EPP + pods up until Ctrl-C",
    )
    return p


def _endpoints_file(ports: Sequence[int], workdir: Path) -> Path:
    path = workdir / "endpoints.yaml"
    path.write_text(dump_endpoints((f"pod-{i}", "127.0.0.1", p) for i, p in enumerate(ports)))
    return path


def _fleet(args: argparse.Namespace) -> SimFleet:
    return SimFleet(
        [
            PodConfig(
                name=f"pod-{i}",
                model=MODEL,
                time_scale=args.time_scale,
                num_gpu_blocks=args.num_gpu_blocks,
            )
            for i in range(args.pods)
        ]
    )


async def _first_request(url: str, fleet: SimFleet) -> None:
    body = {"model": MODEL, "prompt": "Say hello to the endpoint picker.", "max_tokens": 8}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body) as r:
        pod = r.headers.get("x-sim-pod", "?")
        text = json.loads(await r.read())
    port = fleet.ports[int(pod.rsplit("-", 1)[1])] if pod.startswith("pod-") else "?"
    print(
        f"routed: POST {url}/v1/completions -> {pod} (127.0.0.1:{port}), HTTP {r.status}, "
        f"{text.get('usage', {}).get('completion_tokens', 0)} tokens"
    )


async def _wait_scraped(metrics_url: str, proc: Proc, pods: int, timeout: float = 20.0) -> None:
    """Until the EPP has scraped every pod once (its ``/debug/endpoints`` view)."""
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


async def _run_epp(args: argparse.Namespace, workdir: Path) -> Summary:
    waves = mixed_workload(seed=args.seed)
    async with _fleet(args) as fleet:
        eps = _endpoints_file(fleet.ports, workdir)
        cfg = workdir / "epp-config.yaml"
        cfg.write_text(
            epp_config_text(
                eps, (), Path(args.config_file).read_text() if args.config_file else None
            )
        )
        grpc_port, metrics_port = free_port(), free_port()
        # The EPP runs in its own process (as in production), TLS on as by default.
        epp = Proc(
            "epp",
            [
                sys.executable,
                "-m",
                "epp",
                "--config-file",
                str(cfg),
                "--grpc-port",
                str(grpc_port),
                "--grpc-health-port",
                str(free_port()),
                "--metrics-port",
                str(metrics_port),
                "--bind-address",
                "127.0.0.1",
                "--drain-timeout",
                "0s",
            ],
            workdir / "epp.log",
        ).start()
        try:
            metrics_url = f"http://127.0.0.1:{metrics_port}"
            await _wait_scraped(metrics_url, epp, len(fleet.ports))
            with Envoy("full-duplex", epp_port=grpc_port, epp_tls=True) as envoy:
                print(
                    f"stack: envoy {envoy.url} -> EPP :{grpc_port} (TLS, pid {epp.pid}) -> "
                    f"{len(fleet.ports)} simulated vLLM pods; EPP metrics {metrics_url}/metrics, "
                    f"decisions {metrics_url}/debug/decisions"
                )
                await _first_request(envoy.url, fleet)
                results = await drive(envoy.url, waves, model=MODEL, concurrency=args.concurrency)
                summary = summarize("EPP (default config)", results)
                if args.keep_running:
                    print(table([summary]))
                    print("stack is up; Ctrl-C to stop")
                    await asyncio.Event().wait()
        finally:
            epp.stop()
    return summary


async def _run_baseline(args: argparse.Namespace) -> Summary:
    waves = mixed_workload(seed=args.seed)
    async with _fleet(args) as fleet:
        with Envoy("round-robin", fallback=[("127.0.0.1", p) for p in fleet.ports]) as envoy:
            results = await drive(envoy.url, waves, model=MODEL, concurrency=args.concurrency)
    return summarize("Envoy round robin", results)


async def _main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="epp-stack-") as tmp:
        epp_summary = await _run_epp(args, Path(tmp))
        rows = [epp_summary]
        if not args.skip_baseline:
            rows.append(await _run_baseline(args))
    print()
    print(
        f"same seeded workload, fresh fleet each ({args.pods} pods, time scale "
        f"{args.time_scale:g}x; TTFT in wall-clock ms):"
    )
    print(table(rows))
    return 0 if all(r.errors == 0 for r in rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        print("\nstopped; everything started by this command is shut down", file=sys.stderr)
        return 130

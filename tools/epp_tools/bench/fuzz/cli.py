"""``epp bench fuzz``: seeded adversarial ext_proc streams against an EPP, and its memory bound.

One EPP (an ``App`` in this process, the built-in default config plus every built-in parser,
``--max-request-body-bytes`` 256 KiB, gRPC messages up to 1 MiB) serves a simulated fleet of
``--pods`` pods (model ``sim-model``, LoRA adapters ``lora-a`` and ``lora-b``). Then, in order:

1. routing check (also the warm-up), then RSS and ``/metrics`` are measured: the *start*;
2. ``--model-names`` complete exchanges, each for a distinct model name nobody serves (answered
   404, as vLLM does); RSS and ``/metrics`` again;
3. ``--sequences`` fuzz cases (``epp_tools.bench.fuzz.gen``, ``epp_tools.bench.fuzz.mutate``),
   driven as Envoy would (``epp_tools.bench.fuzz.drive``), ``--concurrency`` at a time on one
   connection;
4. routing check again, in-flight requests left (``llm_d_epp_request_running`` must be back to 0),
   RSS and ``/metrics`` a last time.

The report (stdout, and ``--out`` as JSON) counts crashes (an exception out of the servicer, an
unexpected-error 500, or an ERROR logged by the EPP), hung streams, silent failures, control
headers passed through, destinations outside the pool, conforming sequences rejected, the
protocol errors by reason, RSS growth and the ``/metrics`` size. It exits 1 when any of these is
not zero, when the routing check fails, when RSS grew more than 20 MB over the model names or
50 MB over the fuzz run, or when ``/metrics`` is 1 MB or more. Examples::

    epp bench fuzz                                   # 10,000 sequences, seed 1
    epp bench fuzz --sequences 500 --model-names 0 --seed 7
    epp bench fuzz --replay 1234 --seed 7            # one case, verbose
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import aiohttp
import grpc

from epp_tools.bench.fuzz.drive import Timeouts, drive
from epp_tools.bench.fuzz.gen import Spec
from epp_tools.bench.fuzz.mutate import make_case
from epp_tools.bench.fuzz.run import (
    ErrorLog,
    Tally,
    case_rng,
    fuzz_config_body,
    routing_check,
    run_cases,
    unknown_models,
)
from epp_tools.stack.procs import rss_bytes

MB: Final = 1 << 20
NAMES_RSS_LIMIT: Final = 20 * MB
FUZZ_RSS_LIMIT: Final = 50 * MB
METRICS_LIMIT: Final = 1 * MB
ADAPTERS: Final = ("lora-a", "lora-b")


def _rss() -> int:
    gc.collect()
    return rss_bytes(os.getpid())


async def metrics_page(port: int) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        return await resp.read()


def running_requests(page: bytes) -> float:
    total = 0.0
    for line in page.decode(errors="replace").splitlines():
        if line.startswith("llm_d_epp_request_running{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Stage:
    """RSS and /metrics at one point of the run."""

    def __init__(self, name: str, page: bytes) -> None:
        self.name = name
        self.rss = _rss()
        self.metrics_bytes = len(page)
        self.series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))

    def as_dict(self) -> dict[str, Any]:
        return {"rssMB": round(self.rss / MB, 1), "metricsKB": round(self.metrics_bytes / 1024, 1),
                "series": self.series}  # fmt: skip


async def _run(args: argparse.Namespace, app: Any, fleet_pool: tuple[str, ...]) -> dict[str, Any]:
    spec = Spec(pool=fleet_pool, served_models=("sim-model", *ADAPTERS), max_body=256 << 10)
    timeouts = Timeouts(reply=args.reply_timeout, end=5.0)
    report: dict[str, Any] = {"seed": args.seed, "pods": len(fleet_pool)}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        ok, problem, _ = await routing_check(channel, spec, timeouts=timeouts)
        report["routingBefore"] = ok or problem
        start = Stage("start", await metrics_page(app.metrics_port))
        t0 = time.monotonic()
        names = await unknown_models(
            channel, spec, count=args.model_names, seed=args.seed, concurrency=args.concurrency
        )
        after_names = Stage("after model names", await metrics_page(app.metrics_port))
        report["modelNames"] = {"count": args.model_names, "verdicts": dict(names),
                                "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
        t0 = time.monotonic()
        with ErrorLog() as errors:
            tally = await run_cases(channel, spec, seed=args.seed, count=args.sequences,
                                    concurrency=args.concurrency, timeouts=timeouts)  # fmt: skip
        report["fuzzSeconds"] = round(time.monotonic() - t0, 1)
        await asyncio.sleep(0.5)  # let cancelled streams finish on the server side
        ok, problem, dests = await routing_check(channel, spec, timeouts=timeouts)
        page = await metrics_page(app.metrics_port)
        end = Stage("end", page)
    report["fuzz"] = tally.summary()
    report["fuzz"]["mutations"] = dict(tally.tags.most_common())
    report["errorLogs"] = {"count": errors.count, "first": errors.first}
    report["routingAfter"] = {"ok": ok, "problem": problem, "destinations": dict(dests)}
    report["runningAfter"] = running_requests(page)
    report["protocolErrors"] = _protocol_errors(page)
    report["metricsLargestFamilies"] = _largest_families(page)
    report["stages"] = {s.name: s.as_dict() for s in (start, after_names, end)}
    report["rssGrowthMB"] = {
        "modelNames": round((after_names.rss - start.rss) / MB, 1),
        "fuzz": round((end.rss - after_names.rss) / MB, 1),
    }
    report["verdict"] = _verdict(report, tally, errors, start, after_names, end)
    return report


def _largest_families(page: bytes, top: int = 8) -> dict[str, int]:
    sizes: Counter[str] = Counter()
    for line in page.decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            for suffix in ("_bucket", "_count", "_sum", "_created"):
                name = name.removesuffix(suffix)
            sizes[name] += len(line) + 1
    return dict(sizes.most_common(top))


def _protocol_errors(page: bytes) -> dict[str, float]:
    out = {}
    for line in page.decode(errors="replace").splitlines():
        if line.startswith("llm_d_epp_extproc_protocol_errors_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def _verdict(report: dict[str, Any], tally: Tally, errors: ErrorLog, *stages: Stage) -> list[str]:
    start, after_names, end = stages
    problems = [f"{n} {v}" for v, n in tally.verdicts.items() if v != "ok" and n]
    if errors.count:
        problems.append(f"{errors.count} ERROR logs")
    if report["routingAfter"]["ok"] is not True or report["routingBefore"] is not True:
        problems.append("routing check failed")
    if report["runningAfter"]:
        problems.append(f"{report['runningAfter']} requests still counted as running")
    if after_names.rss - start.rss > NAMES_RSS_LIMIT:
        problems.append("RSS grew more than 20 MB over the model names")
    if end.rss - after_names.rss > FUZZ_RSS_LIMIT:
        problems.append("RSS grew more than 50 MB over the fuzz run")
    if max(s.metrics_bytes for s in stages) >= METRICS_LIMIT:
        problems.append("/metrics reached 1 MB")
    bad = [v for v, n in report["modelNames"]["verdicts"].items() if v != "ok" and n]
    if bad:
        problems.append(f"model-name exchanges failed: {bad}")
    return problems


async def with_epp(args: argparse.Namespace, body: Callable[..., Any]) -> Any:
    """Start the simulated fleet and the EPP, run ``body(args, app, pool)``, stop both."""
    from epp.app import App
    from epp.plugins.sources.file_discovery import dump_endpoints
    from epp.settings import Settings
    from epp_tools.sim.config import PodConfig
    from epp_tools.sim.fleet import SimFleet
    from epp_tools.stack.eppconfig import epp_config_text

    pods = [PodConfig(name=f"pod-{i}", time_scale=50.0, lora_adapters=ADAPTERS)
            for i in range(args.pods)]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="epp-fuzz-") as tmp:
        async with SimFleet(pods) as fleet:
            path = Path(tmp) / "endpoints.yaml"
            path.write_text(dump_endpoints((f"pod-{i}", "127.0.0.1", port)
                                           for i, port in enumerate(fleet.ports)))  # fmt: skip
            base = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
            settings = Settings(
                grpc_port=0, grpc_health_port=0, metrics_port=0, bind_address="127.0.0.1",
                secure_serving=False, drain_timeout=0.0, seed=args.seed,
                config_text=epp_config_text(path, (), base + fuzz_config_body()),
                max_request_body_bytes=256 << 10, grpc_max_recv_msg_size=1 << 20,
            )  # fmt: skip
            async with App(settings) as app:
                await app.wait_ready(20)
                pool = tuple(f"127.0.0.1:{port}" for port in fleet.ports)
                return await body(args, app, pool)


async def _replay(args: argparse.Namespace, app: Any, pool: tuple[str, ...]) -> dict[str, Any]:
    spec = Spec(pool=pool, served_models=("sim-model", *ADAPTERS), max_body=256 << 10)
    case = make_case(case_rng(args.seed, args.replay), spec)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        result = await drive(channel, case, pool, Timeouts(reply=args.reply_timeout))
    return {
        "case": args.replay,
        "tags": case.tags,
        "legal": case.legal,
        "steps": [f"{s.action} {s.note} ({len(s.data)} bytes)" for s in case.steps],
        "verdict": result.verdict,
        "detail": result.detail,
        "status": result.status,
        "replies": result.kinds,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp bench fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--sequences", type=int, default=10_000, help="fuzz cases (default 10000)")
    p.add_argument("--model-names", type=int, default=10_000,
                   help="distinct unknown model names sent first (default 10000)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="seed (default 1)")
    p.add_argument("--concurrency", type=int, default=16, help="streams at a time (default 16)")
    p.add_argument("--pods", type=int, default=3, help="simulated pods (default 3)")
    p.add_argument("--reply-timeout", type=float, default=2.0,
                   help="seconds a reply may take before the stream counts as silent")  # fmt: skip
    p.add_argument("--replay", type=int, default=None, help="run only this case, verbosely")
    p.add_argument("--out", default="", help="also write the report here (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.sequences < 0 or args.model_names < 0 or args.concurrency < 1 or args.pods < 1:
        build_parser().error("--sequences/--model-names >= 0, --concurrency/--pods >= 1")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    body = _run if args.replay is None else _replay
    report = asyncio.run(with_epp(args, body))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    failed = report["verdict"] if args.replay is None else report["verdict"] != "ok"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

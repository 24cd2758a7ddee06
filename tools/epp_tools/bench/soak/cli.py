"""``epp bench soak --minutes N``: mixed load for N minutes, sampling what must stay flat::

    epp bench soak --minutes 30 --out out/soak

One EPP process behind Envoy, four simulated pods (one ``epp sim`` process, two LoRA adapters),
the built-in default config plus flow control (``concurrency-detector``,
``program-aware-fairness`` on the default band, 5 s TTL) and ``session-affinity-scorer``
(``strategy: session_id``). The load, closed-loop:

- ``--agents`` clients running agentic sessions (``epp_tools.bench.runner.agentload``: a growing
  conversation; half on the Responses API with ``previous_response_id`` follow-ups), the
  session supply cycled for the whole run;
- ``--streams`` clients sending streamed completions with unique prompts, in turn to the base
  model and each LoRA adapter, under 32 fairness ids, each block of 8 requests one
  ``x-session-id`` session (so sessions keep starting and expiring), each client pausing
  ``--pause`` seconds between requests.

``response-affinity-filter`` runs with a 5-minute TTL (default 1 h), and the pods hold 64,000
tokens of KV each (the prefix index is sized by it), so that every map reaches its bound (TTL or
capacity) within the warm-up and growth after it means a leak.

Every ``--sample`` seconds it records the EPP process's RSS, open descriptors, threads and
asyncio tasks (``/debug/runtime``), the sizes of its bounded maps (``/debug/plugins/state``:
prefix index entries, response-id bindings, session bindings, in-flight requests, program-aware
records) and the requests queued in flow control (``/metrics``). Verdict: RSS growth after the
warm-up (the first fifth of the run) under 5% (median of the last three samples against the
first three after warm-up), descriptors and tasks within a small band. Writes ``results.json``
and ``report.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp_tools.bench.chaos.load import StreamLoad, failures
from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.runner.agentload import AgentLoad, agent_sessions, failed
from epp_tools.bench.soak.report import Sample, render, sample, verdict
from epp_tools.bench.workloads.spec import MODEL, FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.procs import Terminated, until_terminated
from epp_tools.stack.replicas import EppSet

LORAS = ("sql-lora", "chat-lora")
FLEET = FleetSpec(
    pods=4,
    lora_adapters=LORAS,
    max_loras=2,
    time_scale=10.0,
    num_gpu_blocks=4_000,
    max_model_len=65_536,
)
"""KV for 64,000 tokens per pod, so the prefix index (sized by the pods' KV) fills within the
warm-up."""


@dataclass
class SoakOptions:
    minutes: float = 30.0
    sample: float = 30.0
    agents: int = 2
    streams: int = 3
    pause: float = 0.2
    out: Path = Path("out/soak")
    seed: int = 1
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="epp-soak-")))


def soak_config(endpoints: Path) -> str:
    doc = yaml.safe_load(DEFAULT_CONFIG_TEXT)
    doc["featureGates"] = ["flowControl"]
    for plugin in doc["plugins"]:
        if plugin["type"] == "response-affinity-filter":  # reaches its TTL bound in the warm-up
            plugin["parameters"] = {"ttl": "5m"}
    doc["plugins"] += [
        {"type": "concurrency-detector", "parameters": {"maxConcurrency": 16}},
        {"type": "program-aware-fairness"},
        {"type": "session-affinity-scorer", "parameters": {"strategy": "session_id"}},
    ]
    doc["schedulingProfiles"][0]["plugins"].append(
        {"pluginRef": "session-affinity-scorer", "weight": 2}
    )
    doc["flowControl"] = {
        "defaultRequestTTL": "5s",
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "priorityBands": [{"priority": 0, "fairnessPolicyRef": "program-aware-fairness"}],
    }
    return epp_config_text(endpoints, (), base=yaml.safe_dump(doc, sort_keys=False))


def stream_headers(i: int) -> dict[str, str]:
    return {"x-llm-d-inference-fairness-id": f"tenant-{i % 32}", "x-session-id": f"s-{i // 8}"}


def epp_args(opts: SoakOptions) -> list[str]:
    """The EPP's flags beyond the ports: experimental plugins on."""
    return ["--allow-experimental-plugins"]


async def run(opts: SoakOptions) -> dict[str, Any]:
    opts.workdir.mkdir(parents=True, exist_ok=True)
    fleet = SimProcess(FLEET, opts.workdir)
    epp: EppSet | None = None
    try:
        await asyncio.to_thread(fleet.start)
        endpoints = opts.workdir / "endpoints.yaml"
        endpoints.write_text(endpoints_yaml(fleet))
        epp = EppSet(opts.workdir, soak_config(endpoints), extra_args=epp_args(opts))
        await asyncio.to_thread(epp.start)
        return await _load_and_sample(opts, epp)
    finally:
        if epp is not None:
            await asyncio.to_thread(epp.stop)
        await asyncio.to_thread(fleet.stop)


async def _load_and_sample(opts: SoakOptions, epp: EppSet) -> dict[str, Any]:
    sessions = agent_sessions(48, 10, opts.seed, FLEET)
    start = time.perf_counter()
    end = start + opts.minutes * 60.0
    agents = AgentLoad(epp.url, itertools.cycle(sessions), clients=opts.agents)
    agent_task = asyncio.ensure_future(agents.run(start, end))
    streams = StreamLoad(
        epp.url,
        clients=opts.streams,
        models=(MODEL, *LORAS),
        headers=stream_headers,
        pause=opts.pause,
    ).start()
    samples: list[Sample] = []
    next_at = start
    while True:
        samples.append(await asyncio.to_thread(sample, epp, time.perf_counter() - start))
        s = samples[-1]
        print(f"bench soak: {s.t / 60:5.1f} min RSS {s.rss_mb:.1f} MB fds {s.fds} tasks "
              f"{s.tasks} maps {s.maps}", flush=True)  # fmt: skip
        next_at += opts.sample
        if next_at > end:
            break
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    shots = await streams.stop()
    outcomes = await agent_task
    return {
        "minutes": opts.minutes,
        "agents": opts.agents,
        "streams": opts.streams,
        "requests": len(shots) + len(outcomes),
        "failed": len(failures(shots)) + failed(outcomes),
        "samples": [s.as_json() for s in samples],
        "verdict": verdict(samples),
    }


def options(argv: list[str] | None = None) -> SoakOptions:
    """The command line's options (argparse exits with a message on bad ones)."""
    p = argparse.ArgumentParser(prog="epp bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--minutes", type=float, default=30.0, help="duration (default 30)")
    p.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--agents", type=int, default=2, help="agentic session clients")
    p.add_argument("--streams", type=int, default=3, help="streaming completion clients")
    p.add_argument("--pause", type=float, default=0.2, help="streaming clients' think time (s)")
    p.add_argument("--out", default="out/soak")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.sample <= 0 or args.agents < 0 or args.streams < 1:
        p.error("--minutes and --sample must be > 0, --agents >= 0, --streams >= 1")
    return SoakOptions(args.minutes, args.sample, args.agents, args.streams, args.pause,
                       Path(args.out), args.seed)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    opts = options(argv)
    try:
        result = asyncio.run(until_terminated(run(opts)))
    except Terminated:
        print("bench soak: stopped by SIGTERM; the EPP, Envoy and the pods are stopped")
        return 128 + signal.SIGTERM
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "results.json").write_text(json.dumps(result, indent=2))
    text = render(result)
    (opts.out / "report.md").write_text(text)
    print(text)
    return 0 if result["verdict"]["flat"] and not result["failed"] else 1

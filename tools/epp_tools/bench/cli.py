"""``epp bench``: the side-by-side benchmark, and ``epp bench micro``: the hot-path micro-benchmark.

``epp bench`` runs each workload (seeded, reproducible) against each target on the same
simulated fleet, restarted cold for every target, and writes ``results.json``, ``report.md`` and
PNG plots to ``--out``::

    epp bench                                   # every workload, every target, default scale
    epp bench --workloads a,b --targets epp,rr --scale full --out out/bench-full
    epp bench --workloads a --targets epp,rr --requests 20 --time-scale 20 --seed 7
    epp bench --workloads d --targets epp,epp:deploy/configs/flow-control.yaml --out out/bench-d
    epp bench --workloads b,b-foreign,b-pressure --targets epp,rr,vllm --out out/bench-agents
    epp bench --workloads e --targets epp,epp-pd --out out/bench-pd

Workloads: ``a`` shared system prompts, ``b`` agentic multi-turn sessions (half of them on the
Responses API with ``previous_response_id`` follow-ups), ``b-foreign`` the same sessions while
pod-0 is kept busy (batch full, ~10 waiting) by traffic sent straight to it that the router never
sees, ``b-pressure`` agent sessions with sub-agents, compaction and one-shots on a fleet with KV
at 1.6x the hot set and one pod at 0.4x the others' KV, ``c`` multi-LoRA, ``d`` overload at 2x
capacity with priorities, tenants and shedding, ``e`` long prompts served aggregated and
disaggregated (P/D) (``tools/epp_tools/bench/workloads/catalog.py``,
``tools/epp_tools/bench/workloads/agentic.py``, ``tools/epp_tools/bench/runner/foreign.py``,
``tools/epp_tools/bench/workloads/pressure.py``, ``tools/epp_tools/bench/workloads/overload.py``).
Besides hit ratio, TTFT and throughput, the agent workloads report per target the session-turn
colocation (share of a session's turns served by the pod of its previous turn), Responses follow-up
success (share answered 200 rather than 404; a 404 is resent as a new chain so the run completes)
and, for ``b-foreign``, the share of the target's requests sent to the busy pod and the imbalance
among the others (``tools/epp_tools/bench/runner/sessions.py``). Targets: ``epp`` (this EPP behind
Envoy, built-in default config), ``epp:<config.yaml>`` (the same with that config, alpha plugins
allowed), ``rr`` / ``lr`` (Envoy round robin / least request), ``sglang`` / ``vllm`` (the PyPI
routers, installed into ``.venv-sglang-router`` / ``.venv-vllm-router`` on first use), ``epp-pd``
(the EPP with ``deploy/configs/pd.yaml`` on the workload's P/D fleet; ``epp-pd:<config.yaml>``
another P/D config; not in the default list, but a run without ``--targets`` adds it to workload
``e``, and it is skipped with the reason when the config's plugins do not load). Workload ``d`` also
runs its latency-sensitive class alone on an idle fleet (the reference of its latency target);
against ``epp`` and ``epp:deploy/configs/flow-control.yaml`` it takes about 2.5 minutes, about a
minute per target. Workloads a to c take about 4 minutes on an idle 2-core machine with every target
(the first run also installs the two routers, ~20 s each); b, b-foreign and b-pressure against
epp, rr and vllm about 1.5 minutes. TTFT is wall-clock time: compare targets within one run.

``epp bench micro [--runs N]`` prints the median time of each hot-path step (body parse, prefix
hashing, scheduling at 10/100/1000 endpoints), see ``tools/epp_tools/bench/micro/cli.py``.

``epp bench rate [--rates 100,250,500,750] [--servers aio,h2]`` sends open-loop traffic at fixed
rates through Envoy to 10 simulated pods, the EPP (upstream's default config) pinned to one CPU,
and reports per rate the per-pick latency percentiles, errors and CPU, see
``tools/epp_tools/bench/rate/cli.py``.

``epp bench replicas [--scenarios outage,restart,workers]`` runs active-active replicas through a
Redis outage and a replica restart under load, and ``epp --workers 2`` against one process, see
``tools/epp_tools/bench/replicas/cli.py``.

``epp bench fuzz [--sequences N] [--model-names N] [--seed S]`` drives seeded adversarial ext_proc
streams at an in-process EPP and reports crashes, hung streams, silent failures, control headers
passed through, RSS growth and the ``/metrics`` size, see ``tools/epp_tools/bench/fuzz/cli.py``.

``epp bench chaos [--scenarios ...]`` kills pods and the EPP, breaks ``/metrics``, black-holes a
pod, churns discovery and stops the Kubernetes API server under load through Envoy, and reports
each fault's client-visible outcome in numbers, see ``tools/epp_tools/bench/chaos/cli.py``.

``epp bench day2 [--scenarios ...]`` runs EPP rolling upgrades (active-active and leader-elected),
a leader crash, a bad config and model-server rollouts under agentic load through Envoy, and
reports each one's failed requests, hit ratio and recovery against its target, see
``tools/epp_tools/bench/day2/cli.py``.

``epp bench soak --minutes N`` runs mixed load (agentic, streaming, LoRA, flow control on) and
samples RSS, descriptors, asyncio tasks and the bounded maps over time, see
``tools/epp_tools/bench/soak/cli.py``.

``epp bench engines [--chunks N] [--requests N] [--rounds N]`` measures the ext_proc server's
CPU per streamed chunk and per request on libnghttp2, hyper's ``h2`` and the previous
hand-written framing, side by side, see ``tools/epp_tools/bench/engines/cli.py``.
``epp bench scale [--quick]`` ramps coding agents from 250 to 3,000 against the EPP on a simulated
fleet with KV capacity and preemption; ``epp bench scale growth`` and ``epp bench scale cores``
measure how the EPP's cost grows and the cores it needs at llm-d's published rate, see
``tools/epp_tools/bench/scale/__init__.py``.

``epp bench latency [--rate R] [--duration S] [--seeds 1,2,3]`` runs a workload with TTFT and TPOT
SLOs against upstream's default profile, llm-d's latency-predictor profile and
``deploy/configs/latency-slo.yaml`` (both with the in-process model) and reports the SLO
attainment and the prediction error, see ``epp/bench/latency.py``.

``epp bench together --workload a --targets epp,sglang [--burners N]`` drives two or more targets
at the same time, each on its own fleet, optionally beside N busy-looping processes, so that they
meet the same machine load, see ``tools/epp_tools/bench/runner/together.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from pathlib import Path

from epp_tools.bench.runner.targets import NAMED_ONLY, TARGETS, is_known
from epp_tools.bench.workloads.catalog import SCALES, WORKLOADS, resolve


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated: " + ", ".join(f"{k} ({v})" for k, v in WORKLOADS.items()),
    )
    p.add_argument(
        "--targets",
        default=None,
        help="comma-separated: "
        + ", ".join((*TARGETS, *NAMED_ONLY, "epp-pd"))
        + " (default: all but epp-pd and the buffered, streamed and sampled ones, plus each"
        " workload's own, e.g. epp-pd for e)",
    )
    p.add_argument("--scale", choices=SCALES, default="default", help="workload size")
    p.add_argument(
        "--out",
        default="docs/benchmarks/latest",
        help="report directory (default docs/benchmarks/latest, the report the docs show)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.0,
        help="simulator speed-up for every workload (default: each workload's own)",
    )
    p.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    p.add_argument(
        "--requests", type=int, default=0, help="at most this many requests per workload"
    )
    p.add_argument(
        "--probe", type=int, default=10, help="fresh-connection probe requests per target"
    )
    p.add_argument(
        "--deadline", type=float, default=600.0, help="wall-clock cap of one target's run (s)"
    )
    return p


SUBCOMMANDS = {
    "micro": "epp_tools.bench.micro.cli",
    "replicas": "epp_tools.bench.replicas.cli",
    "fuzz": "epp_tools.bench.fuzz.cli",
    "chaos": "epp_tools.bench.chaos.cli",
    "day2": "epp_tools.bench.day2.cli",
    "soak": "epp_tools.bench.soak.cli",
    "rate": "epp_tools.bench.rate.cli",
    "together": "epp_tools.bench.runner.together",
    "engines": "epp_tools.bench.engines.cli",
    "scale": "epp_tools.bench.scale.cli",
    "latency": "epp_tools.bench.latency",
}
"""``epp bench <name>``: the module whose ``main(argv)`` runs it (imported only when asked)."""


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[args_list[0]])
        return int(module.main(args_list[1:]))
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        workloads = [resolve(w) for w in _csv(args.workloads)]
    except ValueError as exc:
        parser.error(str(exc))
    auto_targets = args.targets is None
    keys = list(TARGETS) if auto_targets else _csv(args.targets)
    unknown = [t for t in keys if not is_known(t)]
    if unknown:
        known = ", ".join((*TARGETS, *NAMED_ONLY, "epp-pd"))
        parser.error(f"unknown target(s) {', '.join(unknown)} (known: {known})")
    if args.time_scale < 0 or args.requests < 0 or args.probe < 0 or args.deadline <= 0:
        parser.error("--time-scale, --requests and --probe must be >= 0, --deadline > 0")

    from epp_tools.bench.runner.report import write
    from epp_tools.bench.runner.run import Options, log, run

    opts = Options(
        workloads=workloads,
        targets=keys,
        auto_targets=auto_targets,
        out=Path(args.out),
        scale=args.scale,
        seed=args.seed,
        time_scale=args.time_scale,
        requests=args.requests,
        probe=args.probe,
        deadline=args.deadline,
    )
    try:
        report = asyncio.run(run(opts))
    except KeyboardInterrupt:
        print("\nbench: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    paths = write(report, opts.out)
    print((opts.out / "report.md").read_text())
    log("wrote " + ", ".join(str(p) for p in paths))
    # a peer (or a P/D config whose plugins do not load) is reported and skipped; our own
    # targets must run
    own = {"epp", "rr", "lr", "epp-pd"}
    failed = [
        r
        for w in report["workloads"]
        for r in w["results"]
        if r["target"] in own and r["status"] == "failed"
    ]
    return 1 if failed else 0

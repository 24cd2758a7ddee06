"""``epp bench chaos``: faults under load, through Envoy to simulated pods, in numbers::

    epp bench chaos                                    # every scenario, about 4 minutes
    epp bench chaos --scenarios pod-kill,epp-kill-open --out out/chaos

Each scenario starts its own pods (one ``epp sim`` process each), one EPP process (the built-in
default config unless the scenario says otherwise) behind Envoy, runs ``--clients`` closed-loop
clients sending small streamed completions (``epp_tools.bench.chaos.load``) for ``--before``
seconds, injects its fault, and keeps the load on for ``--after`` seconds after the fault ends.
Scenarios (expected client-visible outcome in brackets):

- ``pod-kill``: one of 4 pods is SIGKILLed [failures only for requests in flight on it and
  requests routed to it before the EPP noticed; no request routed to it more than one scrape
  interval after its death];
- ``metrics-faults``: of 5 pods, one's ``/metrics`` stalls, one answers 400 ms late, one answers
  garbage and one 503, for ``--fault`` seconds [0 failures: inference still works];
- ``black-hole`` / ``black-hole-exclude``: one of 4 pods accepts every connection and answers
  nothing for ``--fault`` seconds, under the default config and with the utilization detector's
  ``stalenessPolicy: exclude`` [requests routed there time out; with ``exclude`` none is routed
  there once its metrics are older than the 200 ms staleness threshold];
- ``churn``: 6 live pods, the endpoints file rewritten every second with 3 to 5 of them [0
  failures, no request routed to a pod after discovery dropped it (beyond the file poll)];
- ``apiserver-gone``: Kubernetes mode against the local API server
  (``epp_tools.bench.kube.apiserver``); it goes away for ``--fault`` seconds, during which one pod
  is deleted and another created, then comes back [0 failures; the changes take effect after];
- ``epp-kill-open`` / ``epp-kill-closed``: the EPP is SIGKILLed, and restarted after ``--fault``
  seconds, behind the fail-open Envoy config (``deploy/envoy/buffered-failopen.yaml``) and the
  fail-closed one (``full-duplex.yaml``) [fail-open: 0 failures; fail-closed: failures counted,
  recovery time after the restart shown].

Writes ``results.json`` and ``report.md`` to ``--out``; exits 1 when a scenario's outcome is not
the expected one. Timings are wall-clock on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from epp_tools.bench.chaos.report import Row, render
from epp_tools.bench.chaos.rig import ChaosOptions, log

SCENARIOS = (
    "pod-kill",
    "metrics-faults",
    "black-hole",
    "black-hole-exclude",
    "churn",
    "apiserver-gone",
    "epp-kill-open",
    "epp-kill-closed",
)


def _runners() -> dict[str, Callable[[ChaosOptions], Awaitable[Row]]]:
    from epp_tools.bench.chaos import epp_scenarios, pod_scenarios

    return {
        "pod-kill": pod_scenarios.pod_kill,
        "metrics-faults": pod_scenarios.metrics_faults,
        "black-hole": lambda o: pod_scenarios.black_hole(o, exclude=False),
        "black-hole-exclude": lambda o: pod_scenarios.black_hole(o, exclude=True),
        "churn": pod_scenarios.churn,
        "apiserver-gone": epp_scenarios.apiserver_gone,
        "epp-kill-open": lambda o: epp_scenarios.epp_kill(o, fail_open=True),
        "epp-kill-closed": lambda o: epp_scenarios.epp_kill(o, fail_open=False),
    }


async def run(opts: ChaosOptions) -> list[Row]:
    runners = _runners()
    rows: list[Row] = []
    for name in opts.scenarios:
        log(f"{name}: running")
        row = await runners[name](opts)
        log(f"{name}: {row.requests} requests, {row.failed} failed, ok={row.ok}")
        rows.append(row)
    return rows


def header(opts: ChaosOptions) -> str:
    return (
        f"{opts.clients} closed-loop clients, streamed completions of 48 tokens, simulator time "
        f"scale {opts.time_scale:g}; {opts.before:g} s of load before each fault, faults of "
        f"{opts.fault:g} s, {opts.after:g} s after; EPP scrape interval 50 ms.\n"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp bench chaos", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    p.add_argument("--out", default="out/chaos", help="report directory")
    p.add_argument("--clients", type=int, default=6, help="closed-loop clients (default 6)")
    p.add_argument("--before", type=float, default=4.0, help="seconds of load before a fault")
    p.add_argument("--fault", type=float, default=4.0, help="seconds a fault lasts")
    p.add_argument("--after", type=float, default=4.0, help="seconds of load after a fault")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulator speed-up")
    p.add_argument("--seed", type=int, default=1)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if min(args.before, args.fault, args.after) <= 0 or args.clients <= 0:
        parser.error("--before, --fault, --after and --clients must be > 0")
    opts = ChaosOptions(
        out=Path(args.out),
        scenarios=scenarios,
        clients=args.clients,
        before=args.before,
        fault=args.fault,
        after=args.after,
        time_scale=args.time_scale,
        seed=args.seed,
    )
    try:
        rows = asyncio.run(run(opts))
    except KeyboardInterrupt:
        print("\nbench chaos: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "results.json").write_text(
        json.dumps({"options": header(opts), "rows": [r.as_json() for r in rows]}, indent=2)
    )
    text = render(rows, header(opts))
    (opts.out / "report.md").write_text(text)
    print(text)
    return 0 if all(r.ok for r in rows) else 1

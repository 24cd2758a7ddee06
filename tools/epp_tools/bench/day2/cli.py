"""``epp bench day2``: the operations a platform team does every week, under steady agentic load
through the Envoy config ``epp envoy-config`` generates, in numbers::

    epp bench day2                                     # every scenario, about 4 minutes
    epp bench day2 --scenarios leader-crash --lease 15 --out out/day2

Every scenario runs 4 simulated model servers registered in the local Kubernetes API server
(``epp_tools.bench.kube.apiserver``), EPP processes in Kubernetes mode (``--drain-timeout``
``--drain``, 3 s) behind Envoy (fail-closed full-duplex, its model-server cluster knowing the pool:
retries go to another pod, failing pods are ejected), and ``--clients`` agents sending agentic
sessions for ``--before`` seconds before the event and ``--after`` seconds after it
(``epp_tools.bench.day2.rig``). Scenarios, with their targets:

- ``upgrade-active-active``: 3 replicas sharing state through a local ``redis-server``,
  replaced one at a time as a Deployment with ``maxUnavailable: 0`` does: the new replica started
  and SERVING, then the old one SIGTERMed (NOT_SERVING at once, its streams served for the
  drain) [0 failed; hit ratio during >= 95% of before];
- ``upgrade-ha``: leader + hot standby (leader election on a Lease of the API server; the
  standby applies the leader's shared facts, so its prefix index is warm), replaced as
  ``deploy/kubernetes/ha`` does (``maxUnavailable: 100%``): a new pod started, the old ones
  SIGTERMed (the leader releases the lease), a second new pod [0 failed];
- ``leader-crash``: the leader SIGKILLed (the lease is not released) [the standby routes within
  the lease's expiry (``--lease``, 4 s; renew deadline 0.7x, retry period 0.2x) plus 1 s; its
  first ``--window`` seconds at >= 95% of the old leader's hit ratio];
- ``bad-config``: a fourth replica with a misspelt config parameter added to 3 [it never becomes
  ready and logs the field; the old replicas serve on; 0 failed];
- ``model-roll``: ``--rolled`` model servers replaced one at a time, as a Deployment does: the
  pod marked terminating and SIGTERMed (it stops accepting connections and finishes what it
  serves), then a new pod on a new address with an empty cache [0 failed; no request served by a
  terminating pod more than 100 ms after its termination];
- ``model-kill``: a model server SIGKILLed mid-stream [failures only among the requests that
  were streaming from it].

Writes ``results.json`` and ``report.md`` to ``--out``; exits 1 when a target is not met. Timings
are wall-clock on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from epp_tools.bench.day2.report import Row, render
from epp_tools.bench.day2.rig import Day2Options, log
from epp_tools.stack.replicas import SetupError

SCENARIOS = (
    "upgrade-active-active",
    "upgrade-ha",
    "leader-crash",
    "bad-config",
    "model-roll",
    "model-kill",
)


def _runners() -> dict[str, Callable[[Day2Options], Awaitable[Row]]]:
    from epp_tools.bench.day2 import epp_scenarios, pod_scenarios

    return {
        "upgrade-active-active": epp_scenarios.upgrade_active_active,
        "upgrade-ha": epp_scenarios.upgrade_ha,
        "leader-crash": epp_scenarios.leader_crash,
        "bad-config": epp_scenarios.bad_config_rollout,
        "model-roll": pod_scenarios.model_roll,
        "model-kill": pod_scenarios.model_kill,
    }


async def run(opts: Day2Options) -> list[Row]:
    runners = _runners()
    rows: list[Row] = []
    for name in opts.scenarios:
        log(f"{name}: running")
        row = await runners[name](opts)
        log(f"{name}: {row.requests} requests, {row.failed} failed, target met: {row.ok}")
        rows.append(row)
    return rows


def header(opts: Day2Options) -> str:
    return (
        f"{opts.clients} agents (agentic sessions), simulator time scale {opts.time_scale:g}, "
        f"4 model servers; {opts.before:g} s of load before each event, {opts.after:g} s after; "
        f"EPP --drain-timeout {opts.drain:g} s, lease {opts.lease:g} s; Envoy fail-closed "
        f"(full-duplex), retries 2, outlier detection on.\n"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp bench day2", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    p.add_argument("--out", default="out/day2", help="report directory")
    p.add_argument("--clients", type=int, default=6, help="agents sending sessions (default 6)")
    p.add_argument("--before", type=float, default=8.0, help="seconds of load before an event")
    p.add_argument("--after", type=float, default=8.0, help="seconds of load after an event")
    p.add_argument("--drain", type=float, default=15.0, help="EPP --drain-timeout (s)")
    p.add_argument("--lease", type=float, default=4.0, help="HA lease duration (s)")
    p.add_argument("--window", type=float, default=10.0, help="leader-crash: standby window (s)")
    p.add_argument("--rolled", type=int, default=4, help="model-roll: pods replaced (1-4)")
    p.add_argument("--time-scale", type=float, default=10.0, help="simulator speed-up")
    p.add_argument("--seed", type=int, default=1)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if min(args.before, args.after, args.drain, args.lease, args.window) <= 0:
        parser.error("--before, --after, --drain, --lease and --window must be > 0")
    if args.clients <= 0 or not 1 <= args.rolled <= 4:
        parser.error("--clients must be > 0 and --rolled 1 to 4")
    opts = Day2Options(
        out=Path(args.out), scenarios=scenarios, clients=args.clients, before=args.before,
        after=args.after, drain=args.drain, lease=args.lease, window=args.window,
        rolled=args.rolled, time_scale=args.time_scale, seed=args.seed,
    )  # fmt: skip
    try:
        rows = asyncio.run(run(opts))
    except SetupError as exc:
        print(f"epp bench day2: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nbench day2: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "results.json").write_text(
        json.dumps({"options": header(opts), "rows": [r.as_json() for r in rows]}, indent=2)
    )
    text = render(rows, header(opts))
    (opts.out / "report.md").write_text(text)
    print(text)
    return 0 if all(r.ok for r in rows) else 1

"""``epp bench scale``: the command line (see ``epp_tools.bench.scale`` for what each part
measures).

::

    epp bench scale                       # the ramp 250 .. 3,000 agents against the EPP
    epp bench scale --quick               # the same in under a minute (CI)
    epp bench scale --targets epp,rr,sglang --steps 3000
    epp bench scale --kv-factor 0.8 --targets epp:deploy/configs/agents-flow-control.yaml,rr
    epp bench scale growth [--quick]      # CPU per request against pods, sessions, context
    epp bench scale cores [--quick]       # per-request and per-chunk cost, the computed cores
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from epp_tools.bench.scale.ramp import RampOptions
from epp_tools.bench.scale.shape import Scaling

OUT = Path("docs/benchmarks/scale")
PARTS = {"growth": "epp_tools.bench.scale.growth", "cores": "epp_tools.bench.scale.cores"}
"""``epp bench scale <part>``: the module whose ``main(argv)`` runs it."""
QUICK = RampOptions(
    steps=(8, 16),
    pods=4,
    scaling=Scaling(time_scale=4.0),
    join_s=2.0,
    join_cap_s=16.0,
    settle_s=2.0,
    window_s=16.0,
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(v < 1 for v in values) or list(values) != sorted(values):
        raise argparse.ArgumentTypeError("increasing agent counts, each >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    d = RampOptions()
    p.add_argument("--quick", action="store_true", help="a small ramp in under a minute")
    p.add_argument("--steps", type=_ints, default=None, help="agents per step (250,...,3000)")
    p.add_argument("--targets", default="epp", help="comma-separated bench targets (epp)")
    p.add_argument("--pods", type=int, default=None, help=f"simulated pods ({d.pods})")
    p.add_argument(
        "--kv-factor",
        type=float,
        default=d.kv_factor,
        help="fleet KV / estimated working set at the largest step (1.2)",
    )
    p.add_argument(
        "--length-factor",
        type=int,
        default=None,
        help=f"real tokens per simulated token ({d.scaling.length_factor})",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help=f"simulated seconds per wall second ({d.scaling.time_scale:g})",
    )
    p.add_argument(
        "--window",
        type=float,
        default=None,
        help=f"measured simulated seconds per step ({d.window_s:g})",
    )
    p.add_argument(
        "--hold-minutes",
        type=float,
        default=0.0,
        help="wall minutes to hold the last step, sampling the target's RSS",
    )
    p.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="run the EPP under PYTHONTRACEMALLOC=FRAMES: the hold reports the allocation sites "
        "that grew the most (slows the EPP; for finding where memory goes)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT, help=f"report directory ({OUT})")
    return p  # fmt: skip


def options(args: argparse.Namespace) -> RampOptions:
    base = QUICK if args.quick else RampOptions()
    scaling = base.scaling
    if args.length_factor is not None:
        scaling = replace(scaling, length_factor=args.length_factor)
    if args.time_scale is not None:
        scaling = replace(scaling, time_scale=args.time_scale)
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    return replace(
        base,
        steps=args.steps or base.steps,
        targets=targets,
        pods=args.pods or base.pods,
        kv_factor=args.kv_factor,
        scaling=scaling,
        window_s=args.window or base.window_s,
        hold_minutes=args.hold_minutes,
        tracemalloc=args.tracemalloc,
        seed=args.seed,
        out=args.out,
    )


def write(report: dict[str, Any], out: Path, name: str = "ramp") -> list[Path]:
    from epp_tools.bench.scale.plots import ramp_plots
    from epp_tools.bench.scale.report import ramp_md

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(ramp_md(report))
    paths += ramp_plots(report, out, name)
    return paths


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in PARTS:
        module = importlib.import_module(PARTS[args_list[0]])
        return int(module.main(args_list[1:]))
    parser = build_parser()
    args = parser.parse_args(args_list)
    from epp_tools.bench.runner import targets as bench_targets
    from epp_tools.bench.scale.ramp import run

    opts = options(args)
    unknown = [t for t in opts.targets if not bench_targets.is_known(t)]
    if unknown or not opts.targets:
        parser.error(f"unknown target(s): {', '.join(unknown) or '(none)'}")
    try:
        opts.fleet()
    except ValueError as exc:
        parser.error(str(exc))
    report = asyncio.run(run(opts))
    report["run"]["command"] = "epp bench scale " + " ".join(args_list)
    name = "ramp-quick" if args.quick else "ramp"
    paths = write(report, opts.out, name)
    print(paths[1].read_text())
    print("bench scale: wrote " + ", ".join(str(p) for p in paths), flush=True)
    own = [t for t in report["targets"] if t["target"].startswith(("epp", "rr", "lr"))]
    return 0 if all(t["status"] == "ok" for t in own) else 1

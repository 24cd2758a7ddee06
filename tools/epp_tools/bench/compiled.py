"""The EPP's CPU per request behind Envoy with its hot modules compiled by mypyc, side by side
with the same source run by the interpreter.

``python -m epp_tools.bench.compiled --pairs 3 --workloads a,b``:

1. copies the checkout's ``epp/``, ``scorers/`` and ``filters/`` into a temporary folder and
   compiles ``MODULES`` there with mypyc (``mypy`` from the ``dev`` extra, and a C compiler);
2. runs ``epp bench --targets epp`` on each workload ``--pairs`` times, taking turns: once as
   installed, once with ``PYTHONPATH`` naming the compiled copy (the bench starts the EPP with
   ``python -P``, so the working directory's ``epp`` does not shadow it);
3. prints the EPP process's CPU per request, net of idle, for each and their ratio.

The compiled copy is the same source: mypyc turns each module into a C extension and checks
declared types at run time. ``MODULES`` are the server's per-message path and the core the
routing and each chunk go through. Plugins stay interpreted: mypyc compiles no class nested in a
class (every plugin's ``Params``), and an interpreted class cannot subclass a compiled one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from epp_tools.bench.peers.routers import repo_root

MODULES = (
    "epp/server/h2conn.py",
    "epp/server/h2.py",
    "epp/server/h2wire.py",
    "epp/server/messages.py",
    "epp/server/stream.py",
    "epp/scheduling/scheduler.py",
    "epp/requestcontrol/director.py",
    "epp/requestcontrol/responses.py",
    "epp/requestcontrol/exchange.py",
    "epp/plugin/fastmetrics.py",
    "epp/plugin/kvusage.py",
    "epp/plugin/paths.py",
    "epp/observability/families.py",
    "epp/observability/recorder.py",
    "epp/observability/decisions.py",
    "epp/plugins/parsers/usage.py",
    "epp/plugins/producers/prefix_index.py",
    "epp/plugins/producers/inflight_metrics.py",
)

_SETUP = """\
import sys
from mypyc.build import mypycify
from setuptools import setup

modules = sys.argv[sys.argv.index("--") + 1 :]
del sys.argv[sys.argv.index("--") :]
setup(name="epp-compiled", packages=[], py_modules=[],
      ext_modules=mypycify(["--config-file=pyproject.toml", *modules], opt_level="3"))
"""


def compile_copy(root: Path, into: Path) -> Path:
    """Copy the service's packages from ``root`` into ``into`` and compile ``MODULES``."""
    for package in ("epp", "scorers", "filters"):
        shutil.copytree(root / package, into / package, ignore=shutil.ignore_patterns("*.so"))
    shutil.copy(root / "pyproject.toml", into)  # the project's mypy settings
    (into / "setup.py").write_text(_SETUP)
    argv = [sys.executable, "setup.py", "build_ext", "--inplace", "--", *MODULES]
    done = subprocess.run(argv, cwd=into, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    probe = "import epp.server.h2conn as m; print(m.__file__)"
    env = {**os.environ, "PYTHONPATH": str(into)}
    probe_argv = [sys.executable, "-P", "-c", probe]
    found = subprocess.run(probe_argv, env=env, capture_output=True, text=True, timeout=120)
    if not found.stdout.strip().endswith(".so"):  # the bench would time the interpreted source
        raise SystemExit(f"the compiled copy does not load: {found.stdout}{found.stderr}")
    return into


def epp_ms(results: dict[str, Any]) -> dict[str, float]:
    """Workload name -> the EPP process's CPU ms per successful request, net of idle."""
    out: dict[str, float] = {}
    for workload in results["workloads"]:
        for r in workload["results"]:
            if r["target"] == "epp" and r.get("ok"):
                out[workload["name"]] = r["cpu_net_s"]["epp"] / r["ok"] * 1000
    return out


def _bench(workloads: str, out: Path, pythonpath: Path | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    epp = Path(sys.executable).parent / "epp"
    argv = [str(epp), "bench", "--workloads", workloads, "--targets", "epp", "--out", str(out)]
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=1800)
    return epp_ms(json.loads((out / "results.json").read_text()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m epp_tools.bench.compiled", description=__doc__)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workloads", default="a,b")
    ap.add_argument("--out", type=Path, default=None, help="keep the bench reports here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epp-compiled-") as tmp:
        work = Path(tmp)
        print(f"compiling {len(MODULES)} modules with mypyc ...", flush=True)
        compiled = compile_copy(repo_root(), work / "src")
        reports = args.out or work / "reports"
        print("| workload | pair | interpreted ms | compiled ms | compiled / interpreted |")
        print("|---|---|---|---|---|")
        for i in range(1, args.pairs + 1):
            pure = _bench(args.workloads, reports / f"interpreted-{i}", None)
            fast = _bench(args.workloads, reports / f"compiled-{i}", compiled)
            for name, ms in pure.items():
                if name in fast:
                    ratio = fast[name] / ms
                    print(f"| {name} | {i} | {ms:.2f} | {fast[name]:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()

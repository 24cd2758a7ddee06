"""``epp bench micro`` rows for idle CPU: the EPP process with no traffic, scraping its pods.

A simulated fleet of ``pods`` pods (``epp sim``) and the EPP (``epp`` with the built-in default
config, file discovery of the pods, ``--refresh-metrics-interval`` 50 ms, behind its Envoy as in
``epp bench``) start; after a warm-up of ``warmup`` seconds the EPP process's CPU time (user +
system, ``/proc/<pid>/stat``) is read over ``seconds`` seconds of no traffic: the share of one
core that scraping, the pool gauges and the other background work take.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from epp.bench.fleet import SimProcess
from epp.bench.replicaset import EppSet
from epp.bench.spec import FleetSpec
from epp.bench.targets import endpoints_yaml
from epp.bench.wire import cpu_seconds
from epp.localstack.eppconfig import epp_config_text

POD_COUNTS = (4, 100)


def idle_share(pods: int, *, seconds: float = 10.0, warmup: float = 3.0) -> float:
    """The EPP's CPU over ``seconds`` of no traffic, as a share of one core."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fleet = SimProcess(FleetSpec(pods=pods), work / "sim").start(timeout=120)
        try:
            eps = work / "endpoints.yaml"
            eps.write_text(endpoints_yaml(fleet))
            group = EppSet(work / "epp", epp_config_text(eps, ())).start()
            try:
                pid = group.pids()["epp"]
                time.sleep(warmup)
                t0, c0 = time.monotonic(), cpu_seconds(pid)
                time.sleep(seconds)
                return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
            finally:
                group.stop()
        finally:
            fleet.stop()

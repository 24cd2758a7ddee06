"""The options and the log of ``epp bench chaos``. The rig itself is shared with the other
scenarios: simulated pods as separate processes (``epp_tools.bench.fleet.PodSet``, so that one
can be killed, and fault controls), the EPP behind Envoy (``epp_tools.stack.replicas.EppSet``)
and the local Kubernetes API server (``epp_tools.bench.kube``)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ChaosOptions:
    out: Path = Path("out/chaos")
    scenarios: list[str] = field(default_factory=list)
    clients: int = 6
    before: float = 4.0
    fault: float = 4.0
    after: float = 4.0
    time_scale: float = 1.0
    seed: int = 1
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="epp-chaos-")))


def log(message: str) -> None:
    print(f"bench chaos: {message}", flush=True)

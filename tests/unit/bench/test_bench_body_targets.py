"""The bench targets that compare response-body handling start what their names say: the
streamed one behind Envoy's streamed config, the sampled one reading a tenth of the bodies nothing
needs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from epp_tools.bench.runner import targets
from epp_tools.bench.workloads.catalog import build
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.replicas import EppSet


@pytest.mark.parametrize(
    ("key", "envoy", "args"),
    [
        ("epp", "full-duplex", []),
        ("epp-streamed", "streamed", ["--response-body-sample-ratio", "0.1"]),
        ("epp-sampled", "full-duplex", ["--response-body-sample-ratio", "0.1"]),
        ("epp-asyncio", "full-duplex", ["--event-loop", "asyncio"]),
    ],
)
def test_each_target_runs_its_envoy_config_and_flags(
    key: str, envoy: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[EppSet] = []

    def start(group: EppSet, timeout: float = 0.0) -> EppSet:
        started.append(group)
        group.ports = [SimpleNamespace(metrics=1)]  # type: ignore[list-item]
        return group

    monkeypatch.setattr(EppSet, "start", start)
    monkeypatch.setattr(EppSet, "pids", lambda group: {})
    fleet: Any = SimpleNamespace(
        pods=["pod-0"], hostports=[("127.0.0.1", 1)], spec=FleetSpec(pods=1)
    )
    assert targets.is_known(key)
    targets.start(key, fleet, build("a"), tmp_path / key)
    (group,) = started
    assert group.envoy_config == envoy
    assert list(group.extra_args) == args

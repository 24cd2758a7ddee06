from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from epp.config.loader import parse_config
from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp_tools.bench.cli import main
from epp_tools.bench.fleet import parse_ready, stats_delta
from epp_tools.bench.peers.routers import (
    SGLANG,
    VLLM,
    PeerSpec,
    PeerUnavailable,
    _run,
    ensure_installed,
    no_egress_env,
)
from epp_tools.bench.runner import targets
from epp_tools.bench.runner.run import Options, run
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.procs import Proc, cpu_seconds, peak_rss_bytes


def test_proc_readings_come_from_proc_when_the_process_exists() -> None:
    me = os.getpid()
    assert cpu_seconds(me) > 0.0
    assert peak_rss_bytes(me) > 10 * 2**20


def test_proc_readings_are_zero_when_the_process_is_gone(tmp_path: Path) -> None:
    proc = Proc("true", [sys.executable, "-c", "pass"], tmp_path / "t.log").start()
    assert proc.popen is not None
    proc.popen.wait(timeout=30)
    assert cpu_seconds(proc.pid) == 0.0
    assert peak_rss_bytes(proc.pid) == 0
    proc.stop()  # a no-op on an exited process


def test_proc_stop_ends_a_running_child_when_asked(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    proc = Proc("sleeper", argv, tmp_path / "s.log").start()
    assert proc.alive()
    proc.stop(grace=5)
    assert not proc.alive()


def test_ready_lines_give_pod_urls_when_the_simulator_prints_them() -> None:
    log = (
        "sim pod pod-0 listening on http://127.0.0.1:4001\n"
        "noise\n"
        "sim pod pod-1 listening on http://127.0.0.1:4002\n"
    )
    assert parse_ready(log) == {"pod-0": "http://127.0.0.1:4001", "pod-1": "http://127.0.0.1:4002"}


def test_stats_delta_subtracts_numeric_counters_when_given_two_snapshots() -> None:
    before = {"pod-0": {"pod": "pod-0", "requests_received": 2, "prefix_hit_tokens": 16}}
    after = {"pod-0": {"pod": "pod-0", "requests_received": 7, "prefix_hit_tokens": 80}}
    assert stats_delta(before, after) == {
        "pod-0": {"requests_received": 5, "prefix_hit_tokens": 64}
    }


def test_fleet_args_carry_the_workload_fleet_when_rendered() -> None:
    args = FleetSpec(
        pods=3, num_gpu_blocks=123, time_scale=2.5, lora_adapters=("x", "y")
    ).sim_args()
    assert args[args.index("--pods") + 1] == "3"
    assert args[args.index("--num-gpu-blocks") + 1] == "123"
    assert args[args.index("--time-scale") + 1] == "2.5"
    assert args[args.index("--lora") + 1] == "x,y"
    assert args[args.index("--port") + 1] == "0"
    assert args[args.index("--decode-base-ms") + 1] == "6"


def test_epp_config_points_an_existing_file_discovery_at_the_run_when_rendered(
    tmp_path: Path,
) -> None:
    base = (Path(__file__).resolve().parents[3] / "deploy/configs/flow-control.yaml").read_text()
    doc = yaml.safe_load(epp_config_text(tmp_path / "eps.yaml", (), base))
    discovery = [p for p in doc["plugins"] if p["type"] == "file-discovery"]
    assert discovery == [
        {"type": "file-discovery", "parameters": {"path": str(tmp_path / "eps.yaml"),
                                                  "watchFile": False}}
    ]  # fmt: skip
    assert doc["dataLayer"]["discovery"] == {"pluginRef": "file-discovery"}
    assert doc["featureGates"] == ["flowControl"]


DEFAULT_WEIGHTS = {  # a filter in the profile has no weight
    p["pluginRef"]: p.get("weight")
    for p in yaml.safe_load(DEFAULT_CONFIG_TEXT)["schedulingProfiles"][0]["plugins"]
}


@pytest.mark.parametrize(
    ("extra", "weights"),
    [
        pytest.param((), DEFAULT_WEIGHTS, id="default"),
        pytest.param((("lora-affinity-scorer", 2),),
                     {**DEFAULT_WEIGHTS, "lora-affinity-scorer": 2}, id="lora"),
    ],
)  # fmt: skip
def test_epp_config_is_the_default_plus_discovery_when_rendered(
    tmp_path: Path, extra: tuple[tuple[str, int], ...], weights: dict[str, int]
) -> None:
    text = epp_config_text(tmp_path / "eps.yaml", extra)
    cfg = parse_config(text)
    doc = yaml.safe_load(text)
    profile = doc["schedulingProfiles"][0]["plugins"]
    assert {p["pluginRef"]: p.get("weight") for p in profile} == weights
    assert doc["dataLayer"]["discovery"] == {"pluginRef": "file-discovery"}
    assert cfg.kind == "EndpointPickerConfig"


@pytest.mark.parametrize("spec", [pytest.param(SGLANG, id="sglang"), pytest.param(VLLM, id="vllm")])
def test_peer_command_binds_loopback_and_uses_cache_aware_when_built(spec: PeerSpec) -> None:
    argv = spec.argv(Path("/r"), 30001, 29001, ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    assert argv[0] == f"/r/{spec.venv}/bin/{spec.console}"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    i = argv.index("--worker-urls")
    assert argv[i + 1 : i + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def test_no_egress_env_points_proxies_at_loopback_when_built() -> None:
    env = no_egress_env()
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:")
    assert env["ALL_PROXY"] == env["HTTP_PROXY"] == env["https_proxy"]
    assert "127.0.0.1" in env["NO_PROXY"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--targets", "epp,nginx"], "unknown target", id="target"),
        pytest.param(["--workloads", "z"], "unknown workload", id="workload"),
        pytest.param(["--requests", "-1"], "must be >= 0", id="requests"),
        pytest.param(["--scale", "huge"], "invalid choice", id="scale"),
    ],
)
def test_cli_rejects_bad_arguments_when_parsing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_peer_install_reports_why_when_a_step_fails() -> None:
    with pytest.raises(PeerUnavailable, match=r"step failed \(3\): boom"):
        _run([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], "step")


def test_peer_install_reuses_the_venv_when_the_router_is_there(tmp_path: Path) -> None:
    binary = SGLANG.binary(tmp_path)
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert ensure_installed(SGLANG, tmp_path) == binary


async def test_runner_reports_an_unavailable_peer_as_skipped_when_it_cannot_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(key: str) -> None:
        raise PeerUnavailable(f"{key}: no index reachable")

    monkeypatch.setattr(targets, "prepare", refuse)
    opts = Options(workloads=["a"], targets=["vllm"], out=tmp_path, requests=5)
    report = await run(opts)
    (workload,) = report["workloads"]
    assert workload["requests"] == 5
    assert [(r["target"], r["status"], r["reason"]) for r in workload["results"]] == [
        ("vllm", "skipped", "vllm: no index reachable")
    ]

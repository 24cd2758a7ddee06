"""``epp stack --replicas``: what is refused before anything starts, the replicas' command lines
and config, and how their metrics and Envoy's per-replica counts are read and shown. The run
itself is ``tests/integration/test_stack_replicas.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from epp.config.loader import LoadOptions, load_config
from epp.plugin.registry import PluginRegistry
from epp_tools.stack import cli as stack_cli
from epp_tools.stack import replicas
from epp_tools.stack.envoy import Envoy
from epp_tools.stack.eppconfig import with_syncer
from epp_tools.stack.replicas import (
    EppSet,
    ReplicaReport,
    metric_sums,
    report_table,
    rq_totals,
)
from tests.builders import handle


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--replicas", "0"], "--replicas must be at least 1, got 0", id="zero"),
        pytest.param(
            ["--replicas", "2", "--pd"], "--replicas and --pd cannot be combined", id="with-pd"
        ),
    ],
)
def test_stack_refuses_replicas_it_cannot_run_when_parsing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        stack_cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_stack_says_to_install_redis_when_replicas_need_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(replicas, "available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        stack_cli.main(["--replicas", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--replicas 2 needs a shared Redis" in err
    assert "apt-get install redis-server" in err
    replicas.check_replicas(1)  # one replica needs no Redis


def test_one_replica_keeps_the_single_epp_command_line_when_built(tmp_path: Path) -> None:
    args = stack_cli._parser().parse_args([])
    one = stack_cli._epp_set(args, tmp_path / "one", "", experimental=False).prepare()
    argv = list(one.procs[0].argv)
    assert argv[:4] == [sys.executable, "-P", "-m", "epp"]
    assert "--health-checking" not in argv and "--seed" not in argv
    assert "--secure-serving=false" not in argv  # TLS, as the EPP serves by default
    assert argv[argv.index("--grpc-port") + 1] == str(one.ports[0].grpc)
    assert one.procs[0].name == "epp" and one.redis is None
    several = EppSet(tmp_path / "two", "", replicas=2, tls=True).prepare()
    argv = list(several.procs[1].argv)
    assert "--health-checking" in argv and argv[argv.index("--seed") + 1] == "2"
    assert several.procs[1].name == "epp-1"
    assert several.ports[1].grpc not in (several.ports[0].grpc, one.ports[0].grpc)


def test_the_benchmarks_epps_serve_plaintext_with_a_seed_each_when_built(tmp_path: Path) -> None:
    group = EppSet(tmp_path, "", extra_args=["--seed", "7"]).prepare()
    argv = list(group.procs[0].argv)
    assert "--secure-serving=false" in argv
    assert argv[argv.index("--seed") + 1] == "1"
    assert argv[-2:] == ["--seed", "7"]  # extra arguments come after: a later flag wins


def test_replica_config_is_the_stack_config_plus_the_redis_syncer_when_loaded() -> None:
    base = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: prefix-cache-scorer\n"
    )
    text = with_syncer(base, "redis://127.0.0.1:6390/0", replicas.SYNC_INTERVAL)
    doc = yaml.safe_load(text)
    assert doc["plugins"][-1] == {
        "type": "redis-syncer",
        "parameters": {"url": "redis://127.0.0.1:6390/0"},
    }
    assert doc["dataLayer"] == {
        "crossReplicaSyncerPluginRef": "redis-syncer",
        "crossReplicaSyncInterval": "200ms",
    }
    pipeline = load_config(
        text, registry=PluginRegistry.from_entry_points(), handle_for=handle, options=LoadOptions()
    )
    assert pipeline.syncer is not None and pipeline.sync_interval == pytest.approx(0.2)


def test_single_epp_banner_is_unchanged_when_described(tmp_path: Path) -> None:
    group = EppSet(tmp_path, "", tls=True, seeds=False).prepare()
    group.envoy = Envoy("full-duplex", listen_port=1)  # where it would listen; not started
    url = group.http_url(0)
    assert group.describe(4) == (
        f"stack: envoy http://127.0.0.1:1 -> EPP :{group.ports[0].grpc} (TLS, pid 0) -> 4 "
        f"simulated vLLM pods; EPP metrics {url}/metrics, decisions {url}/debug/decisions"
    )


def test_metric_sums_add_up_every_label_set_when_parsed() -> None:
    labels = 'target_model_name="m",fairness_id="",priority="0"'
    text = (
        "# TYPE llm_d_epp_request_total counter\n"
        f'llm_d_epp_request_total{{model_name="a",{labels}}} 3\n'
        f'llm_d_epp_request_total{{model_name="b",{labels}}} 4\n'
        "# TYPE llm_d_epp_state_sync_lag_seconds gauge\n"
        "llm_d_epp_state_sync_lag_seconds 0.25\n"
    )
    sums = metric_sums(text)
    assert sums["llm_d_epp_request_total"] == 7
    assert sums["llm_d_epp_state_sync_lag_seconds"] == 0.25
    assert metric_sums("") == {}


def test_envoy_streams_are_read_per_epp_port_when_parsed() -> None:
    clusters = (
        "epp::observability_name::epp\n"
        "epp::127.0.0.1:9002::cx_total::2\n"
        "epp::127.0.0.1:9002::rq_total::31\n"
        "epp::127.0.0.1:9012::rq_total::30\n"
        "epp::127.0.0.1:9012::health_flags::healthy\n"
        "pool::127.0.0.1:8000::rq_total::99\n"
    )
    assert rq_totals(clusters, "epp") == {9002: 31, 9012: 30}


def test_report_table_shows_each_replicas_share_when_printed() -> None:
    rows = [
        ReplicaReport("epp-0", 11, 9002, 31, 31, 11, 6, 0, 0.04, True),
        ReplicaReport("epp-1", 12, 9012, 30, 30, 10, 11, 0, None, None),
    ]
    head, rule, first, second = report_table(rows).splitlines()
    assert head.split()[:5] == ["replica", "pid", "ext_proc", "streams", "requests"]
    assert len(rule) == len(head)
    assert first.split() == ["epp-0", "11", ":9002", "31", "31", "11", "6", "0", "0.04s", "yes"]
    assert second.split()[-2:] == ["-", "-"]

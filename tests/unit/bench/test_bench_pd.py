"""Workload (e) and the P/D target: the long-prompt workload, the P/D fleet, how the runner picks
and skips ``epp-pd``, and what the report shows for it."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.plugins.sources.file_discovery import parse_endpoints
from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.runner import targets
from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.runner.report import render_workload
from epp_tools.bench.runner.results import TargetResult, summarize
from epp_tools.bench.runner.run import Options, _skip_reason, _workload_targets, run
from epp_tools.bench.workloads.catalog import PD_ROLES, WORKLOADS, build
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack import cli as stack_cli
from epp_tools.stack.eppconfig import unloadable_plugins
from epp_tools.stack.workload import Result as StackResult
from epp_tools.stack.workload import long_prompt_workload, pd_table
from epp_tools.stack.workload import summarize as stack_summarize

REPO = Path(__file__).resolve().parents[3]


def test_long_prompt_workload_arrives_open_loop_at_the_planned_rate_when_built() -> None:
    w = build("e", seed=3)
    assert (WORKLOADS["e"], w.name, len(w.requests)) == ("long-prompts", "e", 120)
    sizes = [len(r.messages[0]["content"]) // 4 for r in w.requests]
    assert set(sizes) == {8000, 300}
    assert 0.1 < sizes.count(300) / len(sizes) < 0.3
    rate = w.shape["rate_per_s"]
    # 65% of two prefill pods' 16000 tok/s over the mean prompt of 0.8 x 8000 + 0.2 x 300
    assert rate == pytest.approx(0.65 * 32000 / 6460)
    gaps = [b.at - a.at for a, b in zip(w.requests, w.requests[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.25)
    assert {r.max_tokens for r in w.requests} == {512}
    assert len({r.session for r in w.requests}) == 120  # no conversation: nothing to reuse
    assert (w.pd_roles, w.extra_targets) == (PD_ROLES, ("epp-pd",))
    assert [r.body() for r in build("e", seed=3).requests] == [r.body() for r in w.requests]
    full = build("e", scale="full")
    assert (len(full.requests), max(len(r.messages[0]["content"]) // 4 for r in full.requests)) == (
        240,
        16000,
    )


def test_pd_fleet_adds_roles_and_transfer_cost_when_the_workload_has_one() -> None:
    w = build("e")
    assert w.fleet.pod_roles == () and "--pod-role" not in w.fleet.sim_args()
    assert "pod_roles" not in w.fleet.as_json()
    pd = w.pd_fleet
    assert pd is not None and pd.pods == w.fleet.pods
    args = pd.sim_args()
    assert args[args.index("--pod-role") + 1] == "prefill,prefill,decode,decode"
    assert args[args.index("--kv-transfer-ms-per-block") + 1] == "0.08"
    assert pd.as_json()["pod_roles"] == list(PD_ROLES)
    assert pd.role_labels() == {
        f"pod-{i}": {"llm-d.ai/role": role} for i, role in enumerate(PD_ROLES)
    }


@pytest.mark.parametrize("name", ["a", "b", "b-foreign", "b-pressure", "c", "d"])
def test_earlier_workloads_keep_their_fleet_and_targets_when_built(name: str) -> None:
    w = build(name)
    assert w.pd_fleet is None and w.extra_targets == ()
    assert "--pod-role" not in w.fleet.sim_args()
    assert "--kv-transfer-ms-per-block" not in w.fleet.sim_args()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"pods": 2, "pod_roles": ("prefill",)}, "one value per pod", id="count"),
        pytest.param({"pods": 1, "pod_roles": ("encode",)}, "must be among", id="unknown"),
    ],
)
def test_fleet_spec_rejects_bad_roles_when_built(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FleetSpec(**changes)


def test_endpoints_file_labels_each_pod_with_its_role_when_the_fleet_is_pd(tmp_path: Path) -> None:
    spec = FleetSpec(pods=2, pod_roles=("prefill", "decode"))
    sim = SimProcess(spec, tmp_path)
    sim.pods = {"pod-0": "http://127.0.0.1:4001", "pod-1": "http://127.0.0.1:4002"}
    endpoints = parse_endpoints(endpoints_yaml(sim).encode())
    assert [(e.id, e.port, dict(e.labels)) for e in endpoints] == [
        ("default/pod-0", 4001, {"llm-d.ai/role": "prefill"}),
        ("default/pod-1", 4002, {"llm-d.ai/role": "decode"}),
    ]
    sim.spec = FleetSpec(pods=2)
    assert all(not e.labels for e in parse_endpoints(endpoints_yaml(sim).encode()))


def test_pd_target_is_known_and_runs_on_the_pd_fleet_when_the_workload_has_one(
    tmp_path: Path,
) -> None:
    own = tmp_path / "my-pd.yaml"
    own.write_text((REPO / "deploy/configs/pd.yaml").read_text())
    assert targets.is_known("epp-pd") and targets.is_known(f"epp-pd:{own}")
    assert not targets.is_known(f"epp-pd:{tmp_path / 'missing.yaml'}")
    assert targets.label("epp-pd") == "EPP (pd) via Envoy, P/D fleet"
    assert targets.pd_config("epp-pd") == REPO / "deploy/configs/pd.yaml"
    assert targets.pd_config(f"epp-pd:{own}") == own
    e, a = build("e"), build("a")
    assert targets.fleet_spec("epp-pd", e) == e.pd_fleet
    assert targets.fleet_spec("epp", e) == e.fleet
    with pytest.raises(targets.TargetUnavailable, match=r"workload \(a\) has no P/D fleet"):
        targets.fleet_spec("epp-pd", a)


def test_pd_target_is_unavailable_with_the_reason_when_its_config_names_unknown_plugins(
    tmp_path: Path,
) -> None:
    doc = yaml.safe_load((REPO / "deploy/configs/pd.yaml").read_text())
    doc["plugins"].append({"type": "no-such-pd-handler"})
    config = tmp_path / "pd-next.yaml"
    config.write_text(yaml.safe_dump(doc))
    assert unloadable_plugins(config.read_text()) == ["no-such-pd-handler (UnknownPluginType)"]
    with pytest.raises(targets.TargetUnavailable, match="no-such-pd-handler"):
        targets.prepare(f"epp-pd:{config}")
    # The shipped P/D config loads once its plugins are installed.
    assert unloadable_plugins((REPO / "deploy/configs/pd.yaml").read_text()) == []


def test_default_run_adds_the_workload_targets_and_skips_pd_where_it_does_not_apply(
    tmp_path: Path,
) -> None:
    e, a = build("e"), build("a")
    auto = Options(workloads=["e"], targets=["epp", "rr"], out=tmp_path, auto_targets=True)
    chosen = Options(workloads=["e"], targets=["epp"], out=tmp_path)
    assert _workload_targets(e, auto) == ["epp", "rr", "epp-pd"]
    assert _workload_targets(a, auto) == ["epp", "rr"]
    assert _workload_targets(e, chosen) == ["epp"]
    assert _skip_reason("epp-pd", a, {"epp-pd": ""}) == "workload (a) has no P/D fleet"
    assert _skip_reason("epp-pd", e, {"epp-pd": "plugins missing"}) == "plugins missing"
    assert _skip_reason("epp-pd", e, {"epp-pd": ""}) == ""


async def test_runner_skips_the_pd_target_with_the_reason_when_its_config_cannot_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(key: str) -> None:
        raise targets.TargetUnavailable("pd.yaml needs plugin types that are not available")

    monkeypatch.setattr(targets, "prepare", refuse)
    opts = Options(workloads=["e"], targets=["epp-pd"], out=tmp_path, requests=3)
    report = await run(opts)
    (workload,) = report["workloads"]
    assert workload["pd_fleet"]["pod_roles"] == list(PD_ROLES)
    assert [(r["target"], r["status"], r["reason"]) for r in workload["results"]] == [
        ("epp-pd", "skipped", "pd.yaml needs plugin types that are not available")
    ]


def _outcome(i: int, itl: float) -> Outcome:
    return Outcome(i, f"s{i}", "", 200, "pod-2", 0.0, 0.1, 1.0, 10, itl, 100, 0)


def test_summary_counts_remote_prefills_and_itl_tail_when_the_fleet_is_pd() -> None:
    outcomes = [_outcome(i, itl) for i, itl in enumerate([0.006, 0.007, 0.008, 0.02, math.nan])]
    delta = {
        "pod-0": {"requests_received": 3, "prefill_legs": 3},
        "pod-2": {"requests_received": 5, "remote_prefills": 3, "kv_transfer_blocks": 1500},
    }
    r = summarize(TargetResult("epp-pd", "P/D"), outcomes, delta, 0.0, {}, {})
    assert (r.remote_prefills, r.kv_transfer_blocks) == (3, 1500)
    assert r.remote_prefill_share == pytest.approx(3 / 5)
    assert (r.itl_p50_ms, r.itl_p90_ms) == (7.0, 20.0)


def test_report_shows_pd_latency_and_where_prefill_ran_only_when_the_workload_has_a_pd_fleet() -> (
    None
):
    result = TargetResult("epp-pd", "EPP (pd) via Envoy, P/D fleet", ok=5, remote_prefills=4)
    result.remote_prefill_share, result.itl_p90_ms, result.kv_transfer_blocks = 0.8, 6.5, 2000
    workload: dict[str, Any] = {
        "name": "e",
        "title": "t",
        "description": "d",
        "requests": 5,
        "concurrency": 8,
        "fleet": FleetSpec().as_json(),
        "oracle": {"achievable_reuse": 0.0},
        "results": [result.as_json()],
        "pd_fleet": FleetSpec(pod_roles=PD_ROLES).as_json(),
    }
    text = "\n".join(render_workload(workload))
    assert "P/D targets run on the same pods as prefill, prefill, decode, decode" in text
    assert "ITL p50 0.00 ms, p90 6.50 ms" in text
    assert "prefilled on another pod: 80.0% of requests (2,000 KV blocks pulled)" in text
    workload["pd_fleet"] = {}
    assert "prefilled on another pod" not in "\n".join(render_workload(workload))


# ---- epp stack --pd -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "prefill", "expected"),
    [
        pytest.param(4, 0, ["prefill", "prefill", "decode", "decode"], id="default-half"),
        pytest.param(3, 0, ["prefill", "decode", "decode"], id="odd"),
        pytest.param(4, 1, ["prefill", "decode", "decode", "decode"], id="given"),
    ],
)
def test_stack_pd_roles_put_prefill_pods_first_when_split(
    pods: int, prefill: int, expected: list[str]
) -> None:
    assert stack_cli.pd_roles(pods, prefill) == expected


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--pd", "--pods", "1"], id="one-pod"),
        pytest.param(["--pd", "--pods", "3", "--prefill-pods", "3"], id="no-decode-pod"),
    ],
)
def test_stack_pd_rejects_a_split_without_both_roles_when_parsing(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        stack_cli.main(argv)
    assert exc.value.code == 2
    assert "at least one of" in capsys.readouterr().err


def test_stack_pd_config_is_refused_with_the_reason_when_it_cannot_load(tmp_path: Path) -> None:
    broken = tmp_path / "pd.yaml"
    broken.write_text("plugins:\n- type: no-such-pd-handler\n")
    args = stack_cli._parser().parse_args(["--pd", "--config-file", str(broken)])
    assert stack_cli._pd_config(args) == (
        "",
        "pd.yaml needs plugin types not available here: no-such-pd-handler (UnknownPluginType)",
    )
    args = stack_cli._parser().parse_args(["--pd", "--config-file", str(tmp_path / "none.yaml")])
    assert "not found" in stack_cli._pd_config(args)[1]


def test_stack_pd_table_reads_first_content_chunk_and_itl_when_summarized() -> None:
    (wave,) = long_prompt_workload(requests=3, prompt_words=10, max_tokens=7)
    assert [(i.session, i.max_tokens) for i in wave] == [("doc-0", 7), ("doc-1", 7), ("doc-2", 7)]
    results = [
        StackResult("pod-2", 200, 0.001, 1.0, 100, 0, 0.010, 50, 0.0, "pod-0", 0.3),
        StackResult("pod-3", 200, 0.001, 2.0, 100, 0, 0.020, 50, 0.0, "pod-3", 0.5),
    ]
    summary = stack_summarize("EPP P/D (1P/1D)", results)
    assert (summary.first_token_p50_ms, summary.itl_p90_ms) == (500.0, 20.0)
    assert (summary.out_tok_per_s, summary.remote_prefills) == (50.0, 1)
    (row,) = pd_table([summary]).splitlines()[2:]
    assert row.split() == [
        "EPP", "P/D", "(1P/1D)", "2", "0", "500.0ms", "500.0ms", "20.00ms", "20.00ms", "50", "50%",
    ]  # fmt: skip

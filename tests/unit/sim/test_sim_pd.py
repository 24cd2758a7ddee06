"""P/D in the simulator, without sockets: the engine's remote prefill (KV transfer), the sidecar's
request rewriting, the roles on the command line and the deferred-waiting metric."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from epp_tools.sim.cli import build_parser, configs_from_args, main
from epp_tools.sim.config import PodConfig
from epp_tools.sim.control import Overrides
from epp_tools.sim.disagg import cached_tokens, leg_answer_params, prefill_leg_body, prefill_target
from epp_tools.sim.engine import RemoteKV
from epp_tools.sim.kvcache import BlockStored, chain_hashes
from epp_tools.sim.metrics import MetricsRenderer, parse_text
from tests.unit.sim.test_sim_engine import finished, make_engine, prompt, run

# block_size 4, prefill 1000 tok/s, decode step 10 ms + 1 ms per sequence (test_sim_engine.BASE)
TRANSFER = {"kv_transfer_ms_per_block": 2.0}


def test_remote_prefill_pulls_every_block_then_computes_only_the_last_when_nothing_is_cached() -> (
    None
):
    engine = make_engine(**TRANSFER)
    engine.add_request("d", prompt(100), 3, 0.0, remote=RemoteKV(reported_cached_tokens=40))
    assert (engine.num_waiting, engine.num_transferring, engine.num_running) == (1, 1, 0)
    assert engine.next_wakeup() == pytest.approx(25 * 0.002)  # 25 blocks x 2 ms
    events = run(engine)
    step = (10.0 + 1.0) / 1000
    # KV lands at 50 ms; the first step recomputes one block of 4 tokens (the rest is cached).
    assert events[0].time == pytest.approx(0.050 + step + 4 / 1000.0)
    assert events[-1].time == pytest.approx(events[0].time + 2 * step)
    assert {e.cached_tokens for e in events} == {40}  # the prefill pod's count, as reported
    stats = engine.stats
    assert (stats.remote_prefills, stats.kv_transfer_blocks) == (1, 25)
    assert (stats.prefix_queries, stats.prefix_hits, stats.prompt_tokens) == (100, 0, 100)
    assert stats.ttft.total == pytest.approx(events[0].time)
    # The pulled blocks stay in this pod's prefix cache and were announced as stored.
    chain = chain_hashes(prompt(100), 4, None)
    assert engine.pool.match_prefix(chain) == 25
    stored = [
        h for e in engine.drain_kv_events() if isinstance(e, BlockStored) for h in e.block_hashes
    ]
    assert stored[:25] == chain


def test_remote_prefill_pulls_only_missing_blocks_when_a_prefix_is_cached_here() -> None:
    engine = make_engine(**TRANSFER)
    engine.add_request("warm", prompt(40), 1, 0.0)
    run(engine)
    engine.add_request("d", prompt(100), 1, 1.0, remote=RemoteKV())
    assert engine.next_wakeup() == pytest.approx(1.0 + 15 * 0.002)  # 25 - 10 cached blocks
    done = finished(run(engine, 1.0))["d"]
    assert engine.stats.kv_transfer_blocks == 15
    assert engine.stats.prefix_hits == 40  # d: the 10 blocks held before the transfer
    assert done.cached_tokens == 96  # no reported count: what this pod's admission found cached


def test_decode_of_a_remote_prefill_is_not_stalled_when_a_local_prefill_would_stall_it() -> None:
    def itl_of_running_request(remote: bool) -> float:
        engine = make_engine(**TRANSFER, num_gpu_blocks=1024)
        engine.add_request("run", prompt(4), 20, 0.0)
        engine.advance(0.0)
        engine.add_request(
            "long", prompt(2000, 100), 2, 0.05, remote=RemoteKV() if remote else None
        )
        events = run(engine, 0.05)
        times = [e.time for e in events if e.request_id == "run"]
        return max(b - a for a, b in itertools.pairwise(times))

    assert itl_of_running_request(remote=False) > 2.0  # two seconds of prefill in one step
    assert itl_of_running_request(remote=True) < 0.02  # KV pulled aside, 4 tokens recomputed


def test_abort_drops_a_request_when_its_kv_is_still_being_pulled() -> None:
    engine = make_engine(**TRANSFER)
    engine.add_request("d", prompt(100), 3, 0.0, remote=RemoteKV())
    assert engine.abort_request("d")
    assert (engine.num_waiting, engine.num_transferring) == (0, 0)
    assert engine.next_wakeup() is None
    assert run(engine) == []
    assert engine.pool.used_blocks == 0


def test_waiting_by_reason_reports_transfers_as_deferred_when_kv_is_pulled() -> None:
    config = PodConfig(block_size=4, num_gpu_blocks=64, kv_transfer_ms_per_block=5.0)
    engine = make_engine(block_size=4, num_gpu_blocks=64, kv_transfer_ms_per_block=5.0)
    engine.add_request("d", prompt(40), 1, 0.0, remote=RemoteKV())
    engine.add_request("w", prompt(8), 1, 0.0)
    text = MetricsRenderer(config).render(engine, Overrides(), 100.0)
    series = {
        lab["reason"]: v
        for n, lab, v in parse_text(text)
        if n == "vllm:num_requests_waiting_by_reason"
    }
    assert series == {"capacity": 1.0, "deferred": 1.0}
    waiting = [v for n, _, v in parse_text(text) if n == "vllm:num_requests_waiting"]
    assert waiting == [2.0]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([], "", id="absent"),
        pytest.param(["10.0.0.1:8000"], "10.0.0.1:8000", id="one"),
        pytest.param([" 10.0.0.1:8000 , 10.0.0.2:8000"], "10.0.0.1:8000", id="comma-list-first"),
        pytest.param(["10.0.0.2:8000", "10.0.0.1:8000"], "10.0.0.2:8000", id="several-headers"),
        pytest.param([""], "", id="empty"),
        pytest.param(["[fd00::1]:8000"], "[fd00::1]:8000", id="ipv6"),
    ],
)
def test_prefill_target_is_the_first_entry_when_read_as_the_sidecar_does(
    values: list[str], expected: str
) -> None:
    assert prefill_target(values) == expected


def test_prefill_leg_caps_tokens_and_asks_for_remote_decode_when_built_for_chat() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    leg = prefill_leg_body(body, "chat")
    assert leg == {
        "model": "m",
        "messages": body["messages"],
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "min_tokens": 1,
        "stream": False,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert body["stream"] is True and "stream_options" in body  # the client's body is kept
    responses = prefill_leg_body({"model": "m", "input": "hi", "max_output_tokens": 9}, "responses")
    assert (responses["max_output_tokens"], "max_tokens" in responses) == (1, False)


def test_leg_answer_names_this_pod_and_its_blocks_when_prefill_is_done() -> None:
    config = PodConfig(name="pod-p", host="127.0.0.1", block_size=16)
    params = leg_answer_params(config, 8123, 33)
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [0, 1, 2],
        "remote_engine_id": "pod-p",
        "remote_host": "127.0.0.1",
        "remote_port": 8123,
        "tp_size": 1,
    }


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param({"usage": {"prompt_tokens_details": {"cached_tokens": 48}}}, 48, id="set"),
        pytest.param({"usage": {"prompt_tokens_details": None}}, 0, id="null-details"),
        pytest.param({"usage": {"input_tokens_details": {"cached_tokens": 9}}}, 0, id="responses"),
        pytest.param({}, 0, id="no-usage"),
    ],
)
def test_cached_tokens_are_read_from_prompt_details_when_the_prefill_answers(
    answer: dict[str, Any], expected: int
) -> None:
    assert cached_tokens(answer) == expected


def test_roles_and_transfer_cost_follow_flags_when_given() -> None:
    args = [
        "--pods",
        "3",
        "--pod-role",
        "prefill, decode,both",
        "--kv-transfer-ms-per-block",
        "0.5",
    ]
    configs = configs_from_args(build_parser().parse_args(args))
    assert [c.role for c in configs] == ["prefill", "decode", "both"]
    assert {c.kv_transfer_ms_per_block for c in configs} == {0.5}
    same = configs_from_args(build_parser().parse_args(["--pods", "2", "--role", "decode"]))
    assert [c.role for c in same] == ["decode", "decode"]
    default = configs_from_args(build_parser().parse_args([]))
    assert (default[0].role, default[0].kv_transfer_ms_per_block) == ("both", 0.08)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--pods", "2", "--pod-role", "prefill"], id="count"),
        pytest.param(["--pods", "2", "--pod-role", "prefill,encode"], id="unknown-role"),
        pytest.param(["--kv-transfer-ms-per-block", "-1"], id="negative-transfer"),
    ],
)
def test_main_exits_with_usage_error_when_pd_flags_are_invalid(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "epp sim: error:" in capsys.readouterr().err


def test_pod_config_rejects_an_unknown_role_when_built() -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        PodConfig(role="encode")  # type: ignore[arg-type]

from __future__ import annotations

import pytest

from epp_tools.sim.cli import build_parser, configs_from_args, main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["--kv-events-endpoint", "tcp://*:5557"],
            ["tcp://*:5557", "tcp://*:5558", "tcp://*:5559"],
            id="bind-offsets-ports",
        ),
        pytest.param(
            ["--kv-events-endpoint", "tcp://10.0.0.1:5557"],
            ["tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5559"],
            id="connect-offsets-ports",
        ),
        pytest.param(
            ["--kv-events-endpoint", "tcp://10.0.0.1:5557", "--kv-events-shared"],
            ["tcp://10.0.0.1:5557"] * 3,
            id="connect-shared",
        ),
        pytest.param([], [None] * 3, id="disabled"),
    ],
)
def test_kv_endpoint_per_pod_follows_flags_when_several_pods(
    argv: list[str], expected: list[str | None]
) -> None:
    configs = configs_from_args(build_parser().parse_args(["--pods", "3", *argv]))
    assert [c.kv_events_endpoint for c in configs] == expected


def test_configs_number_ports_and_names_when_pods_requested() -> None:
    args = build_parser().parse_args(
        ["--pods", "2", "--port", "9000", "--pod-name-prefix", "vllm-", "--lora", "a, b"]
    )
    configs = configs_from_args(args)
    assert [(c.name, c.port) for c in configs] == [("vllm-0", 9000), ("vllm-1", 9001)]
    assert configs[0].lora_adapters == ("a", "b")


def test_each_pod_gets_its_own_kv_blocks_when_listed() -> None:
    args = ["--pods", "3", "--num-gpu-blocks", "500", "--pod-num-gpu-blocks", "40, 50,20"]
    configs = configs_from_args(build_parser().parse_args(args))
    assert [c.num_gpu_blocks for c in configs] == [40, 50, 20]
    same = configs_from_args(build_parser().parse_args(["--pods", "2", "--num-gpu-blocks", "7"]))
    assert [c.num_gpu_blocks for c in same] == [7, 7]


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--pods", "0"], id="no-pods"),
        pytest.param(["--block-size", "0"], id="bad-engine-param"),
        pytest.param(["--port", "65535", "--pods", "2"], id="port-overflow"),
        pytest.param(["--pods", "2", "--pod-num-gpu-blocks", "10"], id="pod-blocks-count"),
        pytest.param(["--pods", "2", "--pod-num-gpu-blocks", "10,x"], id="pod-blocks-nan"),
        pytest.param(["--pods", "2", "--pod-num-gpu-blocks", "10,0"], id="pod-blocks-zero"),
    ],
)
def test_main_exits_with_usage_error_when_arguments_are_invalid(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "epp sim: error:" in capsys.readouterr().err

"""``--enable-grpc-stream-metrics``: upstream's ``llm_d_epp_extproc_*`` families, recorded by
the real ext_proc server for each stream by how it ended."""

from __future__ import annotations

import socket
from typing import Any

import grpc
import pytest

from tests.conftest import body_msg, exchange, headers_msg, metrics_text

H = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
FAMILIES = (
    "llm_d_epp_extproc_streams_inflight",
    "llm_d_epp_extproc_stream_duration_seconds",
    "llm_d_epp_extproc_streams_total",
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


async def test_streams_are_counted_by_code(start_app: Any) -> None:
    app = await start_app([closed_port()], ready=False, enable_grpc_stream_metrics=True)
    await exchange(app, [headers_msg({":path": "/v1/models"}, end_of_stream=True)])
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a body before headers: misuse
        await exchange(app, [body_msg(b"{}")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    text = await metrics_text(app)
    assert value(text, 'llm_d_epp_extproc_streams_total{code="OK"}') == 1
    assert value(text, 'llm_d_epp_extproc_streams_total{code="InvalidArgument"}') == 1
    assert value(text, "llm_d_epp_extproc_streams_inflight") == 0
    assert value(text, "llm_d_epp_extproc_stream_duration_seconds_count") == 2


async def test_off_by_default(start_app: Any) -> None:
    app = await start_app([closed_port()], ready=False)
    await exchange(app, [headers_msg(H), body_msg(b"{}")])
    text = await metrics_text(app)
    assert not any(f in text for f in FAMILIES)

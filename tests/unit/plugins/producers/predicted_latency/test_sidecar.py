"""The latency-predictor sidecar client against a local server speaking the sidecar's protocol
(``tests.latency_sidecar``): configuration from the environment, predictions (coalesced, split,
failed), buffered training."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.plugins.producers.predicted_latency.sidecar import (
    SidecarClient,
    SidecarConfig,
    SidecarError,
    stratified_sample,
)
from tests.latency_sidecar import SidecarServer

LOG = logging.getLogger("test")


def _row(tokens: int = 100, waiting: int = 0, running: int = 0) -> dict[str, Any]:
    return {
        "kv_cache_percentage": 0.1, "input_token_length": tokens, "num_request_waiting": waiting,
        "num_request_running": running, "num_tokens_generated": 1, "prefix_cache_score": 0.0,
        "encoder_input_size": 0, "encoder_matched_size": 0, "prefill_tokens_in_flight": 0,
        "decode_tokens_in_flight": 0,
    }  # fmt: skip


@pytest.fixture
async def server() -> AsyncIterator[SidecarServer]:
    async with SidecarServer() as s:
        yield s


def _config(server: SidecarServer, **kw: Any) -> SidecarConfig:
    return SidecarConfig(training_url=server.url, prediction_urls=(server.url,), **kw)


async def _client(config: SidecarConfig) -> SidecarClient:
    client = SidecarClient(config, LOG)
    await client.start()
    return client


def test_no_sidecar_without_its_urls() -> None:
    assert SidecarConfig.from_env({}) is None
    assert SidecarConfig.from_env({"PREDICTION_SERVER_URL": " , "}) is None


def test_environment_as_llm_d_sets_it() -> None:
    env = {
        "PREDICTION_SERVER_URL": "http://localhost:8001, http://localhost:8002/",
        "TRAINING_SERVER_URL": "http://localhost:8000",
        "LATENCY_MAX_SAMPLE_SIZE": "200",
        "LATENCY_FLUSH_INTERVAL_SEC": "2",
        "LATENCY_HTTP_TIMEOUT_SEC": "abc",  # invalid: the default stays
        "LATENCY_MAX_BULK_SIZE": "500",  # above 100: the default stays
        "LATENCY_COALESCE_WINDOW_MS": "0",
        "LATENCY_MAX_CONCURRENT_DISPATCHES": "-3",
    }
    config = SidecarConfig.from_env(env)
    assert config == SidecarConfig(
        training_url="http://localhost:8000",
        prediction_urls=("http://localhost:8001", "http://localhost:8002"),
        max_sample_size=200,
        flush_interval=2.0,
        coalesce_window=0.0,
    )


def test_one_url_alone_gets_upstreams_default_for_the_other() -> None:
    config = SidecarConfig.from_env({"TRAINING_SERVER_URL": "http://t:1"})
    assert config is not None and config.prediction_urls == ("http://localhost:8001",)


async def test_predictions_come_back_in_row_order(server: SidecarServer) -> None:
    client = await _client(_config(server, coalesce_window=0.0))
    try:
        answers = await client.predict([_row(100), _row(300, waiting=2), _row(50, running=4)])
    finally:
        await client.stop()
    assert answers == [(60.0, 10.0), (120.0, 10.0), (55.0, 14.0)]
    assert server.predict_calls[0][1]["num_request_waiting"] == 2
    assert set(server.gets) == {"/status", "/model/download/info"}  # refreshed at start
    assert client.state()["modelType"] == "xgboost" and client.state()["ready"]


async def test_concurrent_requests_share_one_call_in_the_window(server: SidecarServer) -> None:
    client = await _client(_config(server, coalesce_window=0.02))
    try:
        answers = await asyncio.gather(*(client.predict([_row(10 * i)]) for i in range(1, 6)))
    finally:
        await client.stop()
    assert len(server.predict_calls) == 1 and len(server.predict_calls[0]) == 5
    assert [a[0][0] for a in answers] == [51.0, 52.0, 53.0, 54.0, 55.0]


async def test_row_cap_sends_a_batch_before_the_window(server: SidecarServer) -> None:
    client = await _client(_config(server, coalesce_window=5.0, max_coalesced_rows=2))
    try:
        async with asyncio.timeout(2.0):  # the 5 s window is never waited for
            await asyncio.gather(client.predict([_row()]), client.predict([_row()]))
    finally:
        await client.stop()
    assert [len(c) for c in server.predict_calls] == [2]


async def test_more_rows_than_the_bulk_limit_go_in_parts(server: SidecarServer) -> None:
    client = await _client(_config(server, coalesce_window=0.0, max_bulk_size=2))
    try:
        answers = await client.predict([_row(10 * i) for i in range(5)])
    finally:
        await client.stop()
    assert sorted(len(c) for c in server.predict_calls) == [1, 2, 2]
    assert [a[0] for a in answers] == [50.0, 51.0, 52.0, 53.0, 54.0]


@pytest.mark.parametrize("failure", [{"status": 503}, {"short": True}])
async def test_a_failed_or_malformed_answer_raises(
    server: SidecarServer, failure: dict[str, Any]
) -> None:
    for key, value in failure.items():
        setattr(server, key, value)
    client = await _client(_config(server))
    try:
        with pytest.raises(SidecarError):
            await asyncio.gather(client.predict([_row()]), client.predict([_row(), _row()]))
    finally:
        await client.stop()
    assert client.counts["predictFailures"] >= 1 and client.last_error


async def test_an_unreachable_sidecar_fails_fast() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    client = await _client(SidecarConfig(training_url=url, prediction_urls=(url,)))
    try:
        async with asyncio.timeout(5.0):
            with pytest.raises(SidecarError):
                await client.predict([_row()])
    finally:
        await client.stop()


async def test_a_caller_that_gives_up_leaves_the_batch_intact(server: SidecarServer) -> None:
    server.delay = 0.3
    client = await _client(_config(server, coalesce_window=0.005))
    try:
        slow = asyncio.create_task(client.predict([_row(10)]))
        patient = asyncio.create_task(client.predict([_row(20)]))
        await asyncio.sleep(0.05)
        slow.cancel()  # the Director's budget ran out for this request
        assert (await patient) == [(52.0, 10.0)]
    finally:
        await client.stop()


async def test_training_is_buffered_and_flushed(server: SidecarServer) -> None:
    client = await _client(_config(server, flush_interval=0.05))
    try:
        for i in range(3):
            client.add_training({"actual_ttft_ms": 10.0 + i, "actual_tpot_ms": 0.0})
        assert client.buffered == 3
        async with asyncio.timeout(5.0):
            while len(server.training) < 3:
                await asyncio.sleep(0.02)
    finally:
        await client.stop()
    assert [e["actual_ttft_ms"] for e in server.training] == [10.0, 11.0, 12.0]
    assert client.counts["trainingSent"] == 3


async def test_stop_sends_what_is_buffered(server: SidecarServer) -> None:
    client = await _client(_config(server, flush_interval=60.0))
    client.add_training({"actual_ttft_ms": 0.0, "actual_tpot_ms": 5.0})
    await client.stop()
    assert len(server.training) == 1


def test_training_buffer_is_bounded() -> None:
    client = SidecarClient(SidecarConfig("http://t", ("http://p",), max_sample_size=2), LOG)
    for i in range(25):
        client.add_training({"actual_ttft_ms": float(i)})
    assert client.buffered == 20 and client.counts["trainingDropped"] == 5


def test_stratified_sample_keeps_the_proportions() -> None:
    entries = [{"actual_ttft_ms": 1.0, "actual_tpot_ms": 0.0}] * 60 + [
        {"actual_ttft_ms": 0.0, "actual_tpot_ms": 1.0}
    ] * 40
    sample = stratified_sample(entries, 10, random.Random(0))
    assert len(sample) == 10
    assert sum(e["actual_ttft_ms"] > 0 for e in sample) == 6
    assert stratified_sample(entries[:5], 10, random.Random(0)) == entries[:5]

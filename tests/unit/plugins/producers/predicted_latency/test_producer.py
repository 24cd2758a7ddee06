"""``predicted-latency-producer``: what it publishes, what it learns from, and its two backends
(the in-process model, and a sidecar speaking llm-d's protocol)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from epp.plugin import (
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    Endpoint,
    InferenceRequest,
    PrefixMatchInfo,
    ProfileResult,
    RequestBody,
    ResponseInfo,
    SchedulingResult,
    TerminationCause,
    TokenizedPrompt,
    Usage,
)
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.latency import LATENCY_PREDICTION_INFO, LatencyPredictionInfo
from epp.plugin.params import decode
from epp.plugin.testing import check_hooks, check_producer
from epp.plugins.producers.predicted_latency.producer import PredictedLatencyProducer
from tests.builders import FakeHandle, make_endpoint, make_request
from tests.latency_sidecar import SidecarServer

KEY = LATENCY_PREDICTION_INFO.key("predicted-latency-producer")
PREFIX = PREFIX_MATCH_INFO.key("approx-prefix-cache-producer")
LOAD = INFLIGHT_LOAD.key("inflight-load-producer")
TOKENS = TOKENIZED_PROMPT.key("token-producer")
EPS = [make_endpoint(i, kv=0.2, running=2) for i in range(3)]


@pytest.fixture(autouse=True)
def no_sidecar(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PREDICTION_SERVER_URL", raising=False)
    monkeypatch.delenv("TRAINING_SERVER_URL", raising=False)
    yield


def _producer(h: FakeHandle | None = None, **params: Any) -> PredictedLatencyProducer:
    return PredictedLatencyProducer(
        name="predicted-latency-producer",
        params=decode(PredictedLatencyProducer.Params, params),
        handle=h or FakeHandle(),
    )


def _request(
    rid: str,
    tokens: int,
    *,
    cached: dict[int, float] | None = None,
    in_flight: dict[int, int] | None = None,
    headers: dict[str, str] | None = None,
    endpoints: Sequence[Endpoint] = EPS,
) -> InferenceRequest:
    """A request of ``tokens`` prompt tokens; ``cached[i]`` is the share endpoint i caches,
    ``in_flight[i]`` the prompt tokens this EPP has in flight there."""
    blocks = max(1, tokens // 16)
    prefix = {
        e.id: PrefixMatchInfo(round((cached or {}).get(i, 0.0) * blocks), blocks, 16)
        for i, e in enumerate(endpoints)
    }
    loads = {e.id: InFlightLoad(1, (in_flight or {}).get(i, 0)) for i, e in enumerate(endpoints)}
    prompt = TokenizedPrompt.from_token_ids([[7] * tokens])
    return make_request(
        request_id=rid,
        headers=headers or {},
        incoming_model="m",
        target_model="m",
        body=RequestBody(kind="chat", payload={}, raw=b"", stream=True, max_output_tokens=32),
        attributes={PREFIX: prefix, LOAD: loads, TOKENS: prompt},
    )


def _routed(*targets: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    results = {"decode": ProfileResult(targets=targets)}
    if prefill is not None:
        results["prefill"] = ProfileResult(targets=(prefill,))
    return SchedulingResult(results, "decode")


def _serve(
    producer: PredictedLatencyProducer,
    h: FakeHandle,
    request: InferenceRequest,
    target: Endpoint,
    *,
    ttft: float,
    e2e: float,
    tokens: int = 11,
    status: int = 200,
    cause: TerminationCause = TerminationCause.NATURAL,
    prefill: Endpoint | None = None,
) -> None:
    """Dispatch an already produced request to ``target``, answer its first chunk after
    ``ttft`` seconds and its end after ``e2e``."""
    producer.pre_request(request, _routed(target, prefill=prefill))
    response = ResponseInfo(request.request_id, {}, status=status, streaming=True)
    h.now += ttft
    producer.response_streaming(request, response)
    h.now += e2e - ttft
    response.usage = Usage(completion_tokens=tokens)
    response.end_of_stream = True
    response.termination_cause = cause
    producer.response_complete(request, response)


def _true_ttft_ms(tokens: int, cached: float, queued: int, slow: bool) -> float:
    """The synthetic server: 30 ms plus 0.1 ms per uncached token of the request and 0.05 per
    token of prefill queued ahead of it, 1.5x on the slow pod."""
    ms = 30.0 + 0.1 * tokens * (1.0 - cached) + 0.05 * queued
    return ms * (1.5 if slow else 1.0)


async def _queue_prefill(
    producer: PredictedLatencyProducer, rid: str, tokens: int, at: Endpoint
) -> InferenceRequest:
    """Dispatch a request of ``tokens`` uncached tokens to ``at`` that has no first token yet."""
    blocker = _request(rid, tokens)
    await producer.produce(blocker, EPS)
    producer.pre_request(blocker, _routed(at))
    return blocker


def _drop(producer: PredictedLatencyProducer, request: InferenceRequest) -> None:
    """End a request without anything to learn (a failed answer)."""
    producer.response_complete(request, ResponseInfo(request.request_id, {}, status=500))


async def _teach(producer: PredictedLatencyProducer, h: FakeHandle, n: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for k in range(n):
        i = rng.randrange(len(EPS))
        tokens, cached = rng.randint(100, 3000), rng.choice([0.0, 0.5, 0.9])
        queued = rng.choice([0, 0, 1000, 4000])
        blocker = await _queue_prefill(producer, f"b{k}", queued, EPS[i]) if queued else None
        request = _request(f"t{k}", tokens, cached={i: cached})
        await producer.produce(request, EPS)
        ttft = _true_ttft_ms(tokens, cached, queued, slow=i == 2) / 1000.0
        _serve(producer, h, request, EPS[i], ttft=ttft, e2e=ttft + 10 * 0.008)
        if blocker is not None:
            _drop(producer, blocker)
        if k % 20 == 19:  # what the training task does every trainingInterval
            producer.train_now()
    producer.train_now()


async def test_publishes_nothing_until_it_has_learned() -> None:
    producer = _producer(modelMinSamples=5)
    request = _request("r", 500)
    await check_producer(producer, request, EPS, must_publish=False)
    assert KEY not in request.attributes


async def test_learns_ttft_and_tpot_from_completions_and_predicts_each_endpoint() -> None:
    h = FakeHandle()
    producer = _producer(h, streamingMode=True)
    await _teach(producer, h, 300)
    await _queue_prefill(producer, "blocker", 2000, EPS[1])
    request = _request("q", 2000, cached={0: 0.5})
    await check_producer(producer, request, EPS)
    infos = request.attributes[KEY]
    expected = [_true_ttft_ms(2000, 0.5, 0, False), _true_ttft_ms(2000, 0.0, 2000, False),
                _true_ttft_ms(2000, 0.0, 0, True)]  # fmt: skip
    for endpoint, want in zip(EPS, expected, strict=True):
        assert infos[endpoint.id].ttft == pytest.approx(want, rel=0.1)
    # every answer streamed 10 tokens after the first in 80 ms: TPOT 8 ms
    assert infos[EPS[0].id].tpot == pytest.approx(8.0, rel=0.05)
    error = producer.dump_state()["predictionError"]
    assert error["ttft"]["n"] > 250 and error["tpot"]["n"] > 250  # graded once it predicted
    assert error["ttft"]["mape"] < 0.1


async def test_headroom_against_the_slo_headers() -> None:
    h = FakeHandle()
    producer = _producer(h, streamingMode=True, sloBufferFactor=0.5)
    await _teach(producer, h, 200)
    slo = {"x-llm-d-slo-ttft-ms": "200", "x-slo-tpot-ms": "20"}
    request = _request("q", 1000, headers=slo)
    await producer.produce(request, EPS)
    info: LatencyPredictionInfo = request.attributes[KEY][EPS[0].id]
    assert info.ttft_headroom == pytest.approx(200.0 - info.ttft)
    assert info.ttft_valid == (info.ttft < 200.0)
    assert info.tpot_headroom == pytest.approx(10.0 - info.tpot)  # 20 ms x buffer 0.5
    assert info.tpot_valid


async def test_tpot_budget_is_the_tightest_slo_running_there() -> None:
    h = FakeHandle()
    producer = _producer(h, streamingMode=True)
    await _teach(producer, h, 200)
    strict = _request("strict", 100, headers={"x-llm-d-slo-tpot-ms": "6"})
    await producer.produce(strict, EPS)
    producer.pre_request(strict, _routed(EPS[1]))  # still running on pod-1
    request = _request("q", 100, headers={"x-llm-d-slo-tpot-ms": "50"})
    await producer.produce(request, EPS)
    infos = request.attributes[KEY]
    assert infos[EPS[0].id].tpot_headroom == pytest.approx(50.0 - infos[EPS[0].id].tpot)
    assert infos[EPS[1].id].tpot_headroom == pytest.approx(6.0 - infos[EPS[1].id].tpot)
    assert not infos[EPS[1].id].tpot_valid
    assert [infos[e.id].dispatched_request_count for e in EPS] == [0, 1, 0]


async def test_non_streaming_mode_learns_the_whole_request_and_leaves_tpot_out() -> None:
    h = FakeHandle()
    producer = _producer(h)
    assert not producer.needs_response_body(make_request(), ResponseInfo("r", {}))
    await _teach(producer, h, 200)
    request = _request("q", 1000, headers={"x-llm-d-slo-tpot-ms": "1"})
    await producer.produce(request, EPS)
    info = request.attributes[KEY][EPS[0].id]
    assert info.ttft == pytest.approx(_true_ttft_ms(1000, 0, 0, False) + 80.0, rel=0.1)
    assert (info.tpot_valid, info.tpot_headroom, info.tpot) == (True, 0.0, 0.0)
    assert producer.dump_state()["predictionError"]["tpot"] == {"n": 0}


async def test_prefill_endpoints_have_neutral_tpot() -> None:
    h = FakeHandle()
    role = "llm-d.ai/role"
    eps = [make_endpoint(0, labels={role: "prefill"}), make_endpoint(1, labels={role: "decode"})]
    producer = _producer(h, streamingMode=True, endpointRoleLabel=role, modelMinSamples=1)
    first = _request("a", 100, endpoints=eps)
    await producer.produce(first, eps)
    _serve(producer, h, first, eps[1], prefill=eps[0], ttft=0.05, e2e=0.1)
    producer.train_now()
    request = _request("b", 100, endpoints=eps, headers={"x-llm-d-slo-tpot-ms": "1"})
    await producer.produce(request, eps)
    infos = request.attributes[KEY]
    assert infos[eps[0].id].tpot_headroom == 0.0 and infos[eps[0].id].tpot_valid
    assert infos[eps[1].id].tpot_headroom < 0
    # TTFT is learned on the prefill endpoint, TPOT on the decode one
    assert list(producer._model.ttft.endpoints) == [eps[0].id]
    assert list(producer._model.tpot.endpoints) == [eps[1].id]
    assert producer._features(first, eps)[eps[0].id].pod_type == "prefill"


@pytest.mark.parametrize(
    ("status", "cause"),
    [
        (500, TerminationCause.NATURAL),
        (200, TerminationCause.CLIENT_DISCONNECT),
        (200, TerminationCause.ERROR),
    ],
)
async def test_failed_or_cancelled_requests_are_not_learned(
    status: int, cause: TerminationCause
) -> None:
    h = FakeHandle()
    producer = _producer(h, streamingMode=True)
    request = _request("r", 100)
    await producer.produce(request, EPS)
    _serve(producer, h, request, EPS[0], ttft=0.1, e2e=0.2, status=status, cause=cause)
    assert producer.train_now() == 0
    assert producer.dump_state()["trackedRequests"] == 0  # its running entry is gone anyway


async def test_predict_in_produce_off_still_learns() -> None:
    h = FakeHandle()
    producer = _producer(h, predictInProduce=False, modelMinSamples=1)
    for k in range(3):
        request = _request(f"r{k}", 100)
        await producer.produce(request, EPS)
        assert KEY not in request.attributes
        _serve(producer, h, request, EPS[0], ttft=0.05, e2e=0.1)
    assert producer.train_now() == 3


async def test_metrics_and_slo_violations_are_recorded() -> None:
    h = FakeHandle()
    producer = _producer(h, streamingMode=True, modelMinSamples=1)
    await _teach(producer, h, 5)
    request = _request("q", 100, headers={"x-llm-d-slo-ttft-ms": "10"})
    await producer.produce(request, EPS)
    _serve(producer, h, request, EPS[0], ttft=0.5, e2e=0.6)
    model = {"model_name": "m", "target_model_name": "m"}
    plugin = {
        "plugin_name": "predicted-latency-producer",
        "plugin_type": "predicted-latency-producer",
    }
    sample = h.registry.get_sample_value
    assert sample("llm_d_epp_request_slo_violation_total", {**plugin, **model, "type": "ttft"}) == 1
    assert sample("inference_objective_request_slo_violation_total", {**model, "type": "ttft"}) == 1
    assert sample("llm_d_epp_request_predicted_ttft_seconds_count", {**plugin, **model}) == 1
    assert sample("inference_objective_request_ttft_seconds_count", model) == 6
    gauge = {**plugin, **model, "type": "ttft"}
    assert sample("llm_d_epp_inference_request_metric", gauge) == pytest.approx(0.5)


async def test_expired_running_requests_are_dropped_by_the_training_task() -> None:
    h = FakeHandle()
    producer = _producer(h, contextTTL="1s", trainingInterval="10ms")
    request = _request("r", 100)
    await producer.produce(request, EPS)
    producer.pre_request(request, _routed(EPS[0]))
    assert producer.dump_state()["trackedRequests"] == 1
    await producer.start()
    try:
        h.now += 2.0
        async with asyncio.timeout(5.0):
            while producer.dump_state()["trackedRequests"]:
                await asyncio.sleep(0.01)
    finally:
        await producer.stop()


async def test_context_ttl_accepts_go_nanoseconds() -> None:
    params = decode(PredictedLatencyProducer.Params, {"contextTTL": 90_000_000_000})
    assert params.context_ttl_seconds == 90.0
    with pytest.raises(Exception, match="sloBufferFactor"):
        decode(PredictedLatencyProducer.Params, {"sloBufferFactor": 0})


async def test_hooks_contract() -> None:
    producer = _producer(streamingMode=True)
    request = _request("r", 100)
    await producer.produce(request, EPS)
    check_hooks(producer, request, _routed(EPS[0]))


# ---- the sidecar backend ----------------------------------------------------------------------


async def test_sidecar_predictions_are_published_and_completions_sent_to_train(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with SidecarServer() as server:
        monkeypatch.setenv("PREDICTION_SERVER_URL", server.url)
        monkeypatch.setenv("TRAINING_SERVER_URL", server.url)
        monkeypatch.setenv("LATENCY_FLUSH_INTERVAL_SEC", "1")
        h = FakeHandle()
        producer = _producer(h, streamingMode=True)
        await producer.start()
        try:
            request = _request("q", 1000, cached={0: 0.5}, headers={"x-llm-d-slo-ttft-ms": "100"})
            await check_producer(producer, request, EPS)
            infos = request.attributes[KEY]
            assert [infos[e.id].ttft for e in EPS] == [100.0, 150.0, 150.0]  # 50 + 0.1/token
            assert [infos[e.id].ttft_valid for e in EPS] == [False, False, False]
            assert server.predict_calls[0][0]["num_request_running"] == 1  # in-flight count
            _serve(producer, h, request, EPS[0], ttft=0.2, e2e=0.3, tokens=11)
            async with asyncio.timeout(5.0):
                while len(server.training) < 2:
                    await asyncio.sleep(0.05)
        finally:
            await producer.stop()
    ttft_entry, tpot_entry = sorted(server.training, key=lambda e: -e["actual_ttft_ms"])
    assert ttft_entry["actual_ttft_ms"] == pytest.approx(200.0)
    assert ttft_entry["prefix_cache_score"] == 0.5 and ttft_entry["input_token_length"] == 1000
    assert tpot_entry["actual_tpot_ms"] == pytest.approx(10.0)
    assert ttft_entry["timestamp"].endswith("Z")
    state = producer.dump_state()
    assert state["mode"] == "sidecar" and state["predictionError"]["ttft"]["n"] == 1


async def test_sidecar_down_means_no_predictions_and_no_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with SidecarServer(status=503) as server:
        monkeypatch.setenv("PREDICTION_SERVER_URL", server.url)
        producer = _producer()
        await producer.start()
        try:
            request = _request("q", 100)
            await check_producer(producer, request, EPS, must_publish=False)
            assert KEY not in request.attributes
            assert producer.dump_state()["sidecar"]["predictFailures"] == 1
        finally:
            await producer.stop()

"""``predicted-latency-producer``: predicted TTFT and TPOT of the request on every candidate
endpoint, and its headroom against the request's SLOs.

Before scheduling it captures each candidate's features (``features``) and publishes
``LatencyPredictionInfo/<name>`` (``epp.plugin.latency``), read by ``latency-scorer``,
``slo-headroom-tier-filter``, ``latency-slo-admitter`` and ``prefix-cache-affinity-filter``. Per
candidate, with SLOs from ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms`` (0 when absent)::

    ttft_headroom = ttft_slo - predicted_ttft                ttft_valid = predicted_ttft < ttft_slo
    tpot_slo'     = tpot_slo * sloBufferFactor, lowered to min_running * sloBufferFactor where
                    min_running (the tightest TPOT SLO among this EPP's requests running there) > 0
    tpot_headroom = tpot_slo' - predicted_tpot               tpot_valid = predicted_tpot < tpot_slo'

TPOT is neutral (``tpot_valid`` true, headroom 0) outside ``streamingMode``, on an endpoint whose
``endpointRoleLabel`` is ``prefill``, and while the in-process model has no TPOT yet.
``dispatched_request_count`` is the number of this EPP's requests running there. Predictions
are all or nothing: when one candidate cannot be predicted (sidecar down or late, model still
learning, ``predictInProduce: false``) nothing is published and the consumers fall back.

Where predictions come from:

- **the latency-predictor sidecar** when ``TRAINING_SERVER_URL`` or ``PREDICTION_SERVER_URL`` is
  set, as llm-d's Helm chart sets them (``sidecar``: its HTTP JSON protocol, timeouts, coalescing);
  a prediction call is bounded by the producer's budget (the Director's 400 ms);
- **an in-process online model** otherwise (``online``: per-endpoint recursive least squares on
  the same features, trained on this EPP's own completed requests, bounded in memory). It
  publishes nothing until it has learned from ``modelMinSamples`` completions.

What is learned (both backends), at the request's completion (a natural end, a 2xx status):
``streamingMode: false`` (upstream's default): TTFT is the whole request, dispatch to the end of
the response, and no TPOT is learned; ``streamingMode: true``: TTFT is dispatch to the first
response chunk, and TPOT ``(e2e - TTFT) / (output tokens - 1)`` (the usage's completion tokens,
else the chunk count). The features are the chosen endpoint's as captured before scheduling (the
prefill endpoint's for TTFT when disaggregated). Completion only queues the observation; the
training task (every ``trainingInterval``) or the sidecar client's flush learns from it.

Hooks: PreRequest (the chosen endpoint, the dispatch time, the running-request count),
ResponseStreaming (first chunk time; the body is read only in ``streamingMode``),
ResponseComplete (observations, metrics, prediction error), a Lifecycle task, and ``dump_state``:
running requests per endpoint, the model or sidecar state, and ``predictionError`` (MAE, bias,
MAPE and percentiles of the chosen endpoint's prediction against the measurement).

Parameters: see ``epp.plugins.producers.predicted_latency.params`` (upstream's, and
``modelMinSamples``, ``modelForgettingFactor``, ``trainingInterval``,
``maxPendingObservations``, ``maxModelledEndpoints`` of the in-process model). Metrics:
``epp.plugins.producers.predicted_latency.metrics``.

YAML (llm-d's latency-predictor profile)::

    plugins:
      - type: predicted-latency-producer
        parameters: {streamingMode: true}
      - type: slo-headroom-tier-filter
      - type: latency-scorer
      - type: weighted-random-picker
      - type: latency-slo-admitter
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: slo-headroom-tier-filter
          - pluginRef: latency-scorer
          - pluginRef: weighted-random-picker
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

from epp.plugin import (
    ENCODER_CACHE_MATCH_INFO,
    MM_EMBEDDINGS_CACHE_PRODUCER,
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    EncoderCacheMatchInfo,
    Endpoint,
    Handle,
    InferenceRequest,
    Metrics,
    PluginBase,
    PrefixMatchInfo,
    ResponseInfo,
    SchedulingResult,
    TerminationCause,
    TokenizedPrompt,
)
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.latency import (
    LATENCY_PREDICTION_INFO,
    PREDICTED_LATENCY_PRODUCER,
    SLO_TPOT_HEADERS,
    SLO_TTFT_HEADERS,
    LatencyPredictionInfo,
    prefix_score,
    slo_ms,
)
from epp.plugins.producers.predicted_latency.features import (
    E2E_DIM,
    TPOT_DIM,
    TTFT_DIM,
    Features,
)
from epp.plugins.producers.predicted_latency.metrics import LatencyMetrics
from epp.plugins.producers.predicted_latency.online import Observation, OnlineModel
from epp.plugins.producers.predicted_latency.params import PredictedLatencyParams
from epp.plugins.producers.predicted_latency.sidecar import (
    SidecarClient,
    SidecarConfig,
    SidecarError,
)
from epp.plugins.producers.predicted_latency.tracking import (
    ErrorStats,
    RequestContext,
    RunningRequests,
)

PREFILL_PROFILE: Final = "prefill"
"""The profile whose pick is the prefill endpoint in disaggregated serving (upstream's)."""
MAX_DUMPED_ENDPOINTS: Final = 100


class PredictedLatencyProducer(PluginBase):
    TYPE: ClassVar[str] = PREDICTED_LATENCY_PRODUCER

    @dataclass(frozen=True)
    class Params(PredictedLatencyParams):
        """See ``epp.plugins.producers.predicted_latency.params``."""

    params: PredictedLatencyParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        self._log = handle.logger(self.typed_name)
        self._key = LATENCY_PREDICTION_INFO.key(self.typed_name.name)
        self._ctx_key = f"{self.TYPE}:{self.typed_name.name}:request"  # private scratch
        self._prefix_key = PREFIX_MATCH_INFO.key(
            p.prefix_match_info_producer_name or "approx-prefix-cache-producer"
        )
        self._load_key = INFLIGHT_LOAD.key(
            p.in_flight_load_producer_name or "inflight-load-producer"
        )
        self._tokens_key = TOKENIZED_PROMPT.key("token-producer")
        self._mm_key = ENCODER_CACHE_MATCH_INFO.key(
            p.encoder_cache_match_info_producer_name or MM_EMBEDDINGS_CACHE_PRODUCER
        )
        if p.sampling_mean != 1000.0 or p.max_decode_token_samples_for_prediction != 0:
            self._log.info(
                "samplingMean and maxDecodeTokenSamplesForPrediction are ignored, as upstream "
                "ignores them since mid-stream TPOT predictions were removed"
            )
        sidecar = SidecarConfig.from_env(os.environ)
        self._sidecar = SidecarClient(sidecar, self._log) if sidecar is not None else None
        self._model = OnlineModel(
            ttft_dim=TTFT_DIM if p.streaming_mode else E2E_DIM,
            tpot_dim=TPOT_DIM,
            lam=p.model_forgetting_factor,
            min_samples=p.model_min_samples,
            max_endpoints=p.max_modelled_endpoints,
            max_pending=p.max_pending_observations,
        )
        self._running = RunningRequests()
        self._errors = {"ttft": ErrorStats(), "tpot": ErrorStats()}
        self._metrics = LatencyMetrics(handle.registry, self.typed_name)
        self._task: asyncio.Task[None] | None = None

    # ---- declarations ------------------------------------------------------------------------

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def consumes(self) -> frozenset[DataKey[Any]]:
        keys: set[DataKey[Any]] = {self._prefix_key, self._load_key, self._tokens_key}
        if self.params.use_encoder_cache_features:
            keys.add(self._mm_key)
        return frozenset(keys)

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        """Only streaming mode times the first chunk; otherwise the end of the response is
        enough."""
        return self.params.streaming_mode

    # ---- before scheduling -------------------------------------------------------------------

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        headers = request.headers
        ctx = RequestContext(
            ttft_slo=slo_ms(headers, SLO_TTFT_HEADERS),
            tpot_slo=slo_ms(headers, SLO_TPOT_HEADERS),
            features=self._features(request, endpoints),
        )
        request.attributes[self._ctx_key] = ctx
        if not self.params.predict_in_produce or not endpoints:
            return
        started = self.handle.clock()
        predictions = await self._predict(ctx, endpoints)
        if predictions is None:
            return
        seconds = max(0.0, self.handle.clock() - started)
        # one call predicts both, and upstream records it as both durations
        self._metrics.ttft_prediction_duration(
            request.incoming_model, request.target_model, seconds
        )
        self._metrics.tpot_prediction_duration(
            request.incoming_model, request.target_model, seconds
        )
        ctx.predictions = predictions
        request.attributes[self._key] = {
            e.id: self._info(ctx, e, predictions[e.id]) for e in endpoints
        }

    def _features(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> dict[str, Features]:
        attrs = request.attributes
        prefix: Mapping[str, PrefixMatchInfo] | None = attrs.get(self._prefix_key)
        loads: Mapping[str, InFlightLoad] = attrs.get(self._load_key) or {}
        prompt: TokenizedPrompt | None = attrs.get(self._tokens_key)
        tokens = prompt.token_count if prompt is not None else 0
        output = (request.body.max_output_tokens or 0) if request.body is not None else 0
        media: Mapping[str, EncoderCacheMatchInfo] = (
            attrs.get(self._mm_key) or {} if self.params.use_encoder_cache_features else {}
        )
        role_label = self.params.endpoint_role_label
        out = {}
        for e in endpoints:
            m = e.metrics or Metrics()
            load = loads.get(e.id)
            mm = media.get(e.id)
            out[e.id] = Features(
                kv_cache_percentage=m.kv_cache_usage_percent,
                input_token_length=tokens,
                num_request_waiting=m.waiting_queue_size,
                num_request_running=load.requests if load is not None else m.running_requests_size,
                prefix_cache_score=prefix_score(prefix, e.id),
                prefill_tokens_in_flight=load.tokens if load is not None else 0,
                output_tokens=output,
                pending_prefill_tokens=self._running.pending_prefill(e.id),
                encoder_input_size=mm.total_size if mm is not None else 0,
                encoder_matched_size=mm.matched_size if mm is not None else 0,
                pod_type=e.labels.get(role_label, "") if role_label else "",
            )
        return out

    async def _predict(
        self, ctx: RequestContext, endpoints: Sequence[Endpoint]
    ) -> dict[str, tuple[float, float]] | None:
        """(TTFT ms, TPOT ms; NaN when unknown) per candidate, or ``None`` when any candidate
        cannot be predicted."""
        if self._sidecar is not None:
            if not self._sidecar.started:
                return None
            rows = [ctx.features[e.id].as_json(tokens_generated=1) for e in endpoints]
            try:
                answers = await self._sidecar.predict(rows)
            except SidecarError as exc:
                self._log.debug("latency prediction failed: %s", exc)
                return None
            return {e.id: answer for e, answer in zip(endpoints, answers, strict=True)}
        streaming = self.params.streaming_mode
        out = {}
        for e in endpoints:
            f = ctx.features[e.id]
            ttft = self._model.ttft.predict(e.id, f.ttft_vector() if streaming else f.e2e_vector())
            if ttft is None:
                return None
            tpot = self._model.tpot.predict(e.id, f.tpot_vector()) if streaming else None
            out[e.id] = (ttft, math.nan if tpot is None else tpot)
        return out

    def _info(
        self, ctx: RequestContext, endpoint: Endpoint, prediction: tuple[float, float]
    ) -> LatencyPredictionInfo:
        ttft, tpot = prediction
        tpot_valid, tpot_headroom = True, 0.0
        role_label = self.params.endpoint_role_label
        prefill = bool(role_label) and endpoint.labels.get(role_label) == "prefill"
        if self.params.streaming_mode and not prefill and not math.isnan(tpot):
            factor = self.params.slo_buffer_factor
            budget = ctx.tpot_slo * factor
            tightest = self._running.min_tpot_slo(endpoint.id)
            if tightest > 0:
                budget = min(budget, tightest * factor)
            tpot_valid, tpot_headroom = tpot < budget, budget - tpot
        return LatencyPredictionInfo(
            ttft_valid=ttft < ctx.ttft_slo,
            tpot_valid=tpot_valid,
            ttft_headroom=ctx.ttft_slo - ttft,
            tpot_headroom=tpot_headroom,
            ttft=ttft,
            tpot=0.0 if math.isnan(tpot) else tpot,
            dispatched_request_count=self._running.count(endpoint.id),
        )

    # ---- request hooks -----------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        ctx: RequestContext | None = request.attributes.get(self._ctx_key)
        primary = result.profile_results.get(result.primary_profile)
        if ctx is None or primary is None or not primary.targets:
            return
        target = primary.targets[0].id
        prefill = result.profile_results.get(PREFILL_PROFILE)
        ctx.target = target
        ctx.ttft_endpoint = prefill.targets[0].id if prefill and prefill.targets else target
        ctx.dispatched_at = self.handle.clock()
        features = ctx.features.get(target)
        pending = 0  # the prompt this endpoint computes (none when a prefill endpoint does)
        if features is not None and ctx.ttft_endpoint == target:
            pending = round(features.input_token_length * (1.0 - features.prefix_cache_score))
        self._running.add(target, request.request_id, ctx.tpot_slo, ctx.dispatched_at, pending)

    def response_streaming(self, request: InferenceRequest, response: ResponseInfo) -> None:
        ctx: RequestContext | None = request.attributes.get(self._ctx_key)
        if ctx is None or not ctx.target:
            return
        ctx.chunks += 1
        if not ctx.first_chunk_at and not response.end_of_stream:
            ctx.first_chunk_at = self.handle.clock()
            self._running.prefilled(request.request_id)

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        ctx: RequestContext | None = request.attributes.pop(self._ctx_key, None)
        if ctx is None or not ctx.target:
            return
        self._running.remove(request.request_id)
        if response.termination_cause not in (None, TerminationCause.NATURAL):
            return
        if not 200 <= response.status < 300:
            return
        e2e_ms = (self.handle.clock() - ctx.dispatched_at) * 1000.0
        ttft_ms: float | None = e2e_ms
        tpot_ms: float | None = None
        if self.params.streaming_mode:
            ttft_ms = (
                (ctx.first_chunk_at - ctx.dispatched_at) * 1000.0 if ctx.first_chunk_at else None
            )
            tokens = response.usage.completion_tokens or ctx.chunks
            if ttft_ms is not None and tokens > 1:
                tpot_ms = max(0.0, e2e_ms - ttft_ms) / (tokens - 1)
        model = (request.incoming_model, request.target_model)
        if ttft_ms is not None:
            self._grade("ttft", ctx, ctx.ttft_endpoint, model, ttft_ms, ctx.ttft_slo)
        if tpot_ms is not None:
            self._grade("tpot", ctx, ctx.target, model, tpot_ms, ctx.tpot_slo)

    def _grade(
        self,
        target: str,
        ctx: RequestContext,
        endpoint_id: str,
        model: tuple[str, str],
        measured_ms: float,
        slo: float,
    ) -> None:
        """Record one measurement: metrics, prediction error, and an observation to learn."""
        metrics = self._metrics
        measured, predicted_of, slo_of = (
            (metrics.ttft, metrics.predicted_ttft, metrics.ttft_slo)
            if target == "ttft"
            else (metrics.tpot, metrics.predicted_tpot, metrics.tpot_slo)
        )
        measured(*model, measured_ms / 1000.0)
        if slo > 0:
            slo_of(*model, measured_ms / 1000.0, slo / 1000.0)
        prediction = ctx.predictions.get(endpoint_id)
        predicted = None if prediction is None else prediction[0 if target == "ttft" else 1]
        if predicted is not None and not math.isnan(predicted):
            predicted_of(*model, predicted / 1000.0)
            self._errors[target].add(predicted, measured_ms)
        features = ctx.features.get(endpoint_id)
        if features is None:
            return
        if self._sidecar is not None:
            self._sidecar.add_training(_training_entry(features, target, measured_ms))
            return
        if target == "ttft":
            x = features.ttft_vector() if self.params.streaming_mode else features.e2e_vector()
        else:
            x = features.tpot_vector()
        self._model.observe(Observation(target, endpoint_id, x, measured_ms))

    # ---- lifecycle and state -----------------------------------------------------------------

    async def start(self) -> None:
        if self._sidecar is not None:
            await self._sidecar.start()
        self._task = asyncio.create_task(self._train(), name=f"{self.typed_name}-training")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sidecar is not None:
            await self._sidecar.stop()

    async def _train(self) -> None:
        """The in-process model's training, and the expiry of requests never completed."""
        interval = self.params.training_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                self._model.drain()
                self._running.expire(self.handle.clock(), self.params.context_ttl_seconds)
            except Exception:  # a bad observation must not end training
                self._log.exception("latency model training failed")

    def train_now(self) -> int:
        """Learn from every queued observation now (what the training task does); how many."""
        return self._model.drain()

    def dump_state(self) -> Mapping[str, Any]:
        state: dict[str, Any] = {
            "mode": "sidecar" if self._sidecar is not None else "in-process",
            "streamingMode": self.params.streaming_mode,
            "endpoints": self._running.state(MAX_DUMPED_ENDPOINTS),
            "trackedRequests": len(self._running),
            "predictionError": {k: v.state() for k, v in self._errors.items()},
        }
        if self._sidecar is not None:
            state["sidecar"] = self._sidecar.state()
        else:
            state["model"] = self._model.state()
        return state


def _training_entry(features: Features, target: str, measured_ms: float) -> dict[str, Any]:
    """A sidecar ``TrainingEntry``: the features, and the measured TTFT or TPOT (the other 0)."""
    entry = features.as_json(tokens_generated=0)
    entry["actual_ttft_ms"] = measured_ms if target == "ttft" else 0.0
    entry["actual_tpot_ms"] = measured_ms if target == "tpot" else 0.0
    entry["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return entry

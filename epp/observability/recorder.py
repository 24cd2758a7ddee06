"""Records request-path events into ``EppMetrics`` (kept out of the protocol code).

Label values from client-chosen strings are bounded (``epp.observability.labels``): model names go
through the metrics' ``ModelLabels`` (a name the pool does not serve reads ``unknown``), fairness
ids through a ``LabelCap`` of ``FAIRNESS_LABEL_CAP`` (64) values of at most 128 characters (later
or longer ones read ``other``). Labels are worked out when each event is recorded, so a request
whose model was confirmed by its own 2xx response (``on_response_status``) has its completion
metrics under the model's name. Two exceptions: ``llm_d_epp_request_running`` is decremented with
the labels it was incremented with, and a response's inter-token latencies all take the labels of
its first inter-token event (the histogram's child is looked up once per response, not per token).
"""

from __future__ import annotations

import time
from typing import Any, Final

from epp.observability.labels import FAIRNESS_LABEL_CAP, MAX_FAIRNESS_CHARS, LabelCap, ModelSource
from epp.observability.metrics import EppMetrics
from epp.plugin import InferenceRequest, ResponseInfo, SchedulingResult

_RUNNING_LABELS: Final = "epp.stats.running-labels"
"""``InferenceRequest.attributes`` key: the labels ``running`` was incremented with."""
_CHUNKS: Final = "epp.stats.chunk-times"
"""``InferenceRequest.attributes`` key: the request's ``_ChunkTimes``."""


class _ChunkTimes:
    """TTFT, the clock reading of the last response chunk, and the inter-token histogram's
    labelled child, looked up at the response's first inter-token event and kept: a streamed
    response has one chunk per token, and the lookup cost more than the observation."""

    __slots__ = ("itl", "last", "ttft")

    def __init__(self, ttft: float, last: float) -> None:
        self.ttft = ttft
        self.last = last
        self.itl: Any = None


class RequestStats:
    def __init__(self, metrics: EppMetrics, *, fairness_cap: int = FAIRNESS_LABEL_CAP) -> None:
        self.m = metrics
        self.models = metrics.model_labels
        self._fairness_cap = LabelCap(fairness_cap, max_chars=MAX_FAIRNESS_CHARS)

    def serve_models_from(self, source: ModelSource) -> None:
        """``source()`` lists model names the pool serves (see ``ModelLabels``)."""
        self.models.add_source(source)

    def _models(self, request: InferenceRequest | None) -> tuple[str, str]:
        if request is None:
            return ("", "")
        return self.m.models(request.incoming_model, request.target_model)

    def on_scheduled(self, req: InferenceRequest, result: SchedulingResult) -> None:
        model, target = self._models(req)
        prio = str(req.priority)
        self.m.request_total.inc(
            (model, target, self._fairness_cap(req.fairness_id), prio), (model, target, prio)
        )
        self.m.request_size.observe((model, target), (model, target), req.size_bytes)
        self.m.running.inc((model, target), (model, target))
        req.attributes[_RUNNING_LABELS] = (model, target)
        for ep in result.primary.targets[:1]:
            labels = ("success", target, ep.name, ep.namespace, str(ep.port))
            self.m.scheduler_attempts.inc(labels, labels)

    def on_response_status(self, request: InferenceRequest, status: int) -> None:
        """A model server answered ``status``: a 2xx confirms the target model is served."""
        if 200 <= status < 300 and request.target_model:
            self.models.learn(request.target_model)

    def on_error(self, request: InferenceRequest | None, code: str) -> None:
        model, target = self._models(request)
        self.m.request_errors.inc((model, target, code), (model, target, code))

    def on_protocol_error(self, reason: str) -> None:
        self.m.protocol_errors.labels(reason).inc()

    def on_chunk(self, request: InferenceRequest, streaming: bool, started: float) -> None:
        """A response body chunk: the first one gives TTFT (from ``started``, the clock reading
        at the request headers); in a streamed response each later one the inter-token latency
        (the time since the previous chunk), as upstream. The inter-token labels are those of
        the response's second chunk (its model confirmed or not by then) for all its chunks."""
        now = time.monotonic()
        times = request.attributes.get(_CHUNKS)
        if not isinstance(times, _ChunkTimes):
            request.attributes[_CHUNKS] = _ChunkTimes(now - started, now)
            model, target = self._models(request)
            streamed = "true" if streaming else "false"
            self.m.ttft.labels(model, target, streamed).observe(now - started)
            return
        if streaming:
            itl = times.itl
            if itl is None:
                model, target = self._models(request)
                fair = self._fairness_cap(request.fairness_id)
                itl = times.itl = self.m.streaming_itl.labels(
                    model, target, fair, str(request.priority)
                )
            itl.observe(now - times.last)
        times.last = now

    def on_complete(
        self,
        request: InferenceRequest,
        info: ResponseInfo,
        seconds: float,
        response_bytes: int | None,
    ) -> None:
        """``response_bytes`` is ``None`` for a body the EPP did not read: no response size."""
        labels = self._models(request)
        running = request.attributes.pop(_RUNNING_LABELS, None)
        running = running if isinstance(running, tuple) else labels
        self.m.running.inc(running, running, -1)
        self.m.request_duration.observe(labels, labels, seconds)
        if response_bytes is not None:
            self.m.response_size.observe(labels, labels, response_bytes)
        usage = info.usage
        if usage.prompt_tokens:
            self.m.input_tokens.observe(labels, labels, usage.prompt_tokens)
        if usage.completion_tokens:
            self.m.output_tokens.observe(labels, labels, usage.completion_tokens)
            self.m.ntpot.observe(labels, labels, seconds / usage.completion_tokens)
        times = request.attributes.get(_CHUNKS)
        if info.streaming and usage.completion_tokens > 1 and isinstance(times, _ChunkTimes):
            fair = (*labels, self._fairness_cap(request.fairness_id), str(request.priority))
            tpot = (seconds - times.ttft) / (usage.completion_tokens - 1)
            self.m.streaming_tpot.labels(*fair).observe(max(tpot, 0.0))
        if usage.cached_tokens:
            self.m.cached_tokens.observe(labels, labels, usage.cached_tokens)

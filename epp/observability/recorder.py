"""Records request-path events into ``EppMetrics`` (kept out of the protocol code)."""

from __future__ import annotations

from epp.observability.metrics import EppMetrics, LabelCap
from epp.plugin import InferenceRequest, ResponseInfo, SchedulingResult


class RequestStats:
    def __init__(self, metrics: EppMetrics) -> None:
        self.m = metrics
        self._fairness_cap = LabelCap()

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
        for ep in result.primary.targets[:1]:
            self.m.scheduler_attempts.labels(
                "success", target, ep.name, ep.namespace, str(ep.port)
            ).inc()

    def on_error(self, request: InferenceRequest | None, code: str) -> None:
        model, target = self._models(request)
        self.m.request_errors.inc((model, target, code), (model, target, code))

    def on_first_byte(
        self, request: InferenceRequest | None, seconds: float, streaming: bool
    ) -> None:
        model, target = self._models(request)
        self.m.ttft.labels(model, target, "true" if streaming else "false").observe(seconds)

    def on_complete(
        self, request: InferenceRequest, info: ResponseInfo, seconds: float, response_bytes: int
    ) -> None:
        model, target = self._models(request)
        labels = (model, target)
        self.m.running.inc(labels, labels, -1)
        self.m.request_duration.observe(labels, labels, seconds)
        self.m.response_size.observe(labels, labels, response_bytes)
        usage = info.usage
        if usage.prompt_tokens:
            self.m.input_tokens.observe(labels, labels, usage.prompt_tokens)
        if usage.completion_tokens:
            self.m.output_tokens.observe(labels, labels, usage.completion_tokens)
            self.m.ntpot.observe(labels, labels, seconds / usage.completion_tokens)
        if usage.cached_tokens:
            self.m.cached_tokens.observe(labels, labels, usage.cached_tokens)

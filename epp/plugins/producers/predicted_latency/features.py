"""What a prediction is made from: the features of one request on one endpoint.

``Features`` carries the fields of the latency-predictor sidecar's ``PredictionRequest`` and
``TrainingEntry`` (JSON names in ``as_json``). They are captured once per candidate when the
request is produced for, and the chosen endpoint's are the ones trained on when it completes, so a
prediction and the observation that grades it see the same inputs:

- ``kv_cache_percentage``, ``num_request_waiting``: the endpoint's last scrape (``Metrics``);
- ``num_request_running``: this EPP's requests in flight there (``InFlightLoad.requests``), the
  scrape's running count when no in-flight producer ran;
- ``prefill_tokens_in_flight``: the uncached prompt tokens of those requests still prefilling
  (``InFlightLoad.tokens``; 0 without it);
- ``input_token_length``: the prompt's tokens (``TokenizedPrompt``); ``prefix_cache_score``: the
  share of its blocks the endpoint caches (``PrefixCacheMatchInfo``);
- ``pending_prefill_tokens`` (the in-process model's, not sent to a sidecar): the uncached prompt
  tokens of this EPP's requests there without a first token yet (``tracking.RunningRequests``);
- ``encoder_input_size`` / ``encoder_matched_size``: the request's media items and those the
  endpoint holds encoded (only with ``useEncoderCacheFeatures``);
- ``pod_type``: the endpoint's ``endpointRoleLabel`` value (``prefill``, ``decode``, "").

The in-process model (``epp.plugins.producers.predicted_latency.online``) regresses on vectors
derived from them, scaled to similar magnitudes (thousands of tokens, request counts, fractions)::

    ttft:  1, uncached/1000, cached/1000, pending_prefill_tokens/1000, waiting, running, kv
    tpot:  1, running, waiting, pending_prefill_tokens/1000, kv, input/1000
    e2e:   the ttft vector, then output/100 and running * output/1000   (non-streaming mode)

with ``uncached = input * (1 - prefix_cache_score)``, ``cached`` the rest and ``output`` the
request's own output-token limit (``max_tokens``, 0 when it sets none): a request's prefill work
is its uncached tokens, its wait the prefill ahead of it, and a decode step grows with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Features:
    kv_cache_percentage: float
    input_token_length: int
    num_request_waiting: int
    num_request_running: int
    prefix_cache_score: float
    prefill_tokens_in_flight: int
    output_tokens: int = 0
    pending_prefill_tokens: int = 0
    encoder_input_size: int = 0
    encoder_matched_size: int = 0
    pod_type: str = ""

    def as_json(self, *, tokens_generated: int) -> dict[str, Any]:
        """The sidecar's ``PredictionRequest`` (and the feature part of a ``TrainingEntry``),
        with every value inside the range the sidecar validates."""
        out: dict[str, Any] = {
            "kv_cache_percentage": min(1.0, max(0.0, self.kv_cache_percentage)),
            "input_token_length": max(0, self.input_token_length),
            "num_request_waiting": max(0, self.num_request_waiting),
            "num_request_running": max(0, self.num_request_running),
            "num_tokens_generated": max(0, tokens_generated),
            "prefix_cache_score": min(1.0, max(0.0, self.prefix_cache_score)),
            "encoder_input_size": max(0, self.encoder_input_size),
            "encoder_matched_size": min(
                max(0, self.encoder_matched_size), max(0, self.encoder_input_size)
            ),
            "prefill_tokens_in_flight": max(0, self.prefill_tokens_in_flight),
            "decode_tokens_in_flight": 0,
        }
        if self.pod_type:
            out["pod_type"] = self.pod_type
        return out

    def ttft_vector(self) -> tuple[float, ...]:
        uncached = self.input_token_length * (1.0 - self.prefix_cache_score)
        cached = self.input_token_length - uncached
        return (
            1.0,
            uncached / 1000.0,
            cached / 1000.0,
            self.pending_prefill_tokens / 1000.0,
            float(self.num_request_waiting),
            float(self.num_request_running),
            self.kv_cache_percentage,
        )

    def tpot_vector(self) -> tuple[float, ...]:
        return (
            1.0,
            float(self.num_request_running),
            float(self.num_request_waiting),
            self.pending_prefill_tokens / 1000.0,
            self.kv_cache_percentage,
            self.input_token_length / 1000.0,
        )

    def e2e_vector(self) -> tuple[float, ...]:
        output = float(self.output_tokens)
        return (
            *self.ttft_vector(),
            output / 100.0,
            self.num_request_running * output / 1000.0,
        )


TTFT_DIM = 7
TPOT_DIM = 6
E2E_DIM = 9

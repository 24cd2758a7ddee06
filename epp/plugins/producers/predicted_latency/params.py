"""Parameters of ``predicted-latency-producer``: upstream's, and those of the in-process model.

Upstream's: ``samplingMean`` (1000) and ``maxDecodeTokenSamplesForPrediction`` (0), accepted and
ignored as upstream ignores them today; ``sloBufferFactor`` (1.0, > 0); ``contextTTL`` (``5m``: a
Go duration string, or integer nanoseconds as Go's JSON gives); ``streamingMode`` (false);
``endpointRoleLabel`` (""); ``predictInProduce`` (true); ``prefixMatchInfoProducerName``,
``inFlightLoadProducerName``, ``encoderCacheMatchInfoProducerName`` ("": the default producers);
``useEncoderCacheFeatures`` (false).

The in-process model's (ours): ``modelMinSamples`` (32, >= 1): completed requests the model must
have learned from before it predicts; ``modelForgettingFactor`` (0.998, in (0.9, 1]): the weight
each older observation keeps per new one (1 = never forget); ``trainingInterval`` (``100ms``,
> 0): how often the training task drains the observations; ``maxPendingObservations`` (4096,
>= 1) and ``maxModelledEndpoints`` (1024, >= 1): the memory bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.plugin.units import parse_duration


@dataclass(frozen=True)
class PredictedLatencyParams:
    sampling_mean: float = 1000.0
    max_decode_token_samples_for_prediction: int = 0
    slo_buffer_factor: float = field(default=1.0, metadata={"yaml": "sloBufferFactor"})
    context_ttl: str | int = field(default="5m", metadata={"yaml": "contextTTL"})
    streaming_mode: bool = False
    endpoint_role_label: str = ""
    predict_in_produce: bool = True
    prefix_match_info_producer_name: str = ""
    in_flight_load_producer_name: str = ""
    use_encoder_cache_features: bool = False
    encoder_cache_match_info_producer_name: str = ""
    model_min_samples: int = 32
    model_forgetting_factor: float = 0.998
    training_interval: str = "100ms"
    max_pending_observations: int = 4096
    max_modelled_endpoints: int = 1024
    context_ttl_seconds: float = field(init=False, default=300.0)
    training_interval_seconds: float = field(init=False, default=0.1)

    def __post_init__(self) -> None:
        if not self.slo_buffer_factor > 0:
            raise ValueError(f"sloBufferFactor must be > 0, got {self.slo_buffer_factor}")
        ttl = (
            self.context_ttl / 1e9
            if isinstance(self.context_ttl, int)
            else parse_duration(self.context_ttl)
        )
        if ttl <= 0:
            raise ValueError(f"contextTTL must be > 0, got {self.context_ttl!r}")
        object.__setattr__(self, "context_ttl_seconds", ttl)
        interval = parse_duration(self.training_interval)
        if interval <= 0:
            raise ValueError(f"trainingInterval must be > 0, got {self.training_interval!r}")
        object.__setattr__(self, "training_interval_seconds", interval)
        if self.model_min_samples < 1:
            raise ValueError(f"modelMinSamples must be >= 1, got {self.model_min_samples}")
        if not 0.9 < self.model_forgetting_factor <= 1.0:
            raise ValueError(
                f"modelForgettingFactor must be in (0.9, 1], got {self.model_forgetting_factor}"
            )
        for name in ("max_pending_observations", "max_modelled_endpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

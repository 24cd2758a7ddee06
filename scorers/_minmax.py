"""Min-max normalisation shared by the load-distribution scorers (lower value = higher score)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from epp.plugin import Endpoint, Metrics


def lower_is_better(
    endpoints: Sequence[Endpoint], value: Callable[[Metrics], float]
) -> Mapping[str, float]:
    """``(max - v) / (max - min)`` over endpoints with metrics; all equal -> 1.0.

    Endpoints without metrics score 0 and do not take part in min/max: an endpoint that was
    never scraped must not look like the idlest one, nor stretch the range of the others.
    """
    values = {ep.id: float(value(ep.metrics)) for ep in endpoints if ep.metrics is not None}
    scores = dict.fromkeys((ep.id for ep in endpoints), 0.0)
    if not values:
        return scores
    low, high = min(values.values()), max(values.values())
    span = high - low
    for endpoint_id, v in values.items():
        scores[endpoint_id] = 1.0 if span == 0 else (high - v) / span
    return scores

"""The in-process latency model: recursive least squares per endpoint, bounded in memory."""

from __future__ import annotations

import math
import random

import pytest

from epp.plugins.producers.predicted_latency.online import (
    RLS,
    Observation,
    OnlineModel,
    TargetModels,
)


def _linear(x: tuple[float, ...]) -> float:
    return 40.0 + 12.0 * x[1] + 3.0 * x[2]


def _samples(n: int, seed: int = 1) -> list[tuple[float, ...]]:
    rng = random.Random(seed)
    return [(1.0, rng.uniform(0, 8), rng.uniform(0, 20)) for _ in range(n)]


def test_rls_recovers_linear_coefficients() -> None:
    model = RLS(3, 1.0)
    for x in _samples(200):
        model.update(x, _linear(x))
    assert model.w == pytest.approx([40.0, 12.0, 3.0], abs=0.05)
    assert model.predict((1.0, 2.0, 5.0)) == pytest.approx(79.0, abs=0.1)


def test_rls_with_forgetting_follows_a_change() -> None:
    model = RLS(3, 0.98)
    for x in _samples(300):
        model.update(x, _linear(x))
    for x in _samples(300, seed=2):  # the server got twice as slow per token
        model.update(x, _linear(x) + 12.0 * x[1])
    assert model.w[1] == pytest.approx(24.0, abs=0.5)


def test_rls_prediction_is_never_negative() -> None:
    model = RLS(2, 1.0)
    for i in range(50):
        model.update((1.0, float(i)), 10.0 - i)
    assert model.predict((1.0, 100.0)) == 0.0


def test_rls_starts_again_when_its_numbers_break() -> None:
    model = RLS(2, 1.0)
    model.update((1.0, 1.0), 5.0)
    model.update((1.0, 1e308), 1e308)
    assert all(math.isfinite(w) for w in model.w)


def test_models_predict_nothing_until_min_samples() -> None:
    models = TargetModels(3, 1.0, min_samples=10, max_endpoints=8)
    for x in _samples(9):
        models.update("a", x, _linear(x))
        assert models.predict("a", x) is None
    x = (1.0, 1.0, 1.0)
    models.update("a", x, _linear(x))
    assert models.predict("a", x) == pytest.approx(_linear(x), abs=1.0)
    assert models.predict("never-seen", x) == pytest.approx(_linear(x), abs=1.0)  # pooled


def test_endpoint_model_starts_from_the_pool_and_learns_its_own_speed() -> None:
    """pod-slow serves the same work 1.5x slower than the others: its own model learns that,
    while the pooled model (and a new endpoint) stays near the fleet's average."""
    models = TargetModels(3, 0.995, min_samples=20, max_endpoints=8)
    rng = random.Random(3)
    for _ in range(600):
        x = (1.0, rng.uniform(0, 8), rng.uniform(0, 20))
        endpoint = rng.choice(["pod-0", "pod-1", "pod-2", "pod-slow"])
        y = _linear(x) * (1.5 if endpoint == "pod-slow" else 1.0)
        models.update(endpoint, x, y)
    x = (1.0, 4.0, 10.0)  # 118 ms on a normal pod
    assert models.predict("pod-0", x) == pytest.approx(118.0, rel=0.05)
    assert models.predict("pod-slow", x) == pytest.approx(177.0, rel=0.05)
    pooled = models.predict("pod-new", x)
    assert pooled is not None and 118.0 < pooled < 177.0


def test_least_recently_trained_endpoint_is_dropped_past_the_bound() -> None:
    models = TargetModels(3, 1.0, min_samples=1, max_endpoints=2)
    x = (1.0, 1.0, 1.0)
    for endpoint in ("a", "b", "a", "c"):
        models.update(endpoint, x, 1.0)
    assert list(models.endpoints) == ["a", "c"]


def test_observations_queue_is_bounded_and_drained_off_the_request_path() -> None:
    model = OnlineModel(ttft_dim=3, tpot_dim=3, lam=1.0, min_samples=1, max_endpoints=4,
                        max_pending=5)  # fmt: skip
    for i in range(8):
        model.observe(Observation("ttft", "a", (1.0, float(i), 0.0), 10.0 + i))
    assert len(model.pending) == 5 and model.dropped == 3
    assert model.ttft.pooled.samples == 0  # observing does not train
    assert model.drain(limit=2) == 2
    assert model.drain() == 3
    model.observe(Observation("tpot", "a", (1.0, 2.0, 0.0), 7.0))
    model.drain()
    assert model.state() == {
        "learned": 6, "pending": 0, "dropped": 3, "ttftSamples": 5, "tpotSamples": 1,
        "endpoints": 1,
    }  # fmt: skip

from __future__ import annotations

import textwrap

import pytest

from epp.config.loader import load_config
from epp.plugin import (
    DataProducer,
    ProfileResult,
    SchedulingResult,
    Scorer,
    ScorerCategory,
)
from epp.plugin.inflight import InFlightLoad
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_plugin_class, check_scorer, sample_endpoints, sample_request
from epp.plugins.producers.inflight import InflightLoadProducer
from scorers.estimated_load import EstimatedLoadScorer
from tests.builders import NOW, handle, make_cycle, make_endpoint, make_request

EPS = [make_endpoint(i) for i in range(3)]
ESTIMATE = "LoadEstimate/inflight-load-producer"
INFLIGHT = "InFlightLoad/inflight-load-producer"


def scorer(**params: object) -> EstimatedLoadScorer:
    return EstimatedLoadScorer(
        name="load", params=decode(EstimatedLoadScorer.Params, params), handle=handle()
    )


def scores(loads: list[float], key: str = ESTIMATE) -> list[float]:
    req = make_request()
    if key == ESTIMATE:
        req.attributes[key] = {e.id: v for e, v in zip(EPS, loads, strict=True)}
    else:
        req.attributes[key] = {
            e.id: InFlightLoad(int(v), 0) for e, v in zip(EPS, loads, strict=True)
        }
    got = scorer().score(make_cycle(), req, EPS)
    return [got[e.id] for e in EPS]


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        pytest.param([0, 0, 0], [1.0, 1.0, 1.0], id="all-idle"),
        pytest.param([3, 0, 10], [0.7, 1.0, 0.0], id="proportional-to-the-busiest"),
        pytest.param([100, 101, 100], [1 / 101, 0.0, 1 / 101], id="busy-pods-stay-close"),
        pytest.param([4, 4, 4], [0.0, 0.0, 0.0], id="all-equally-busy"),
        pytest.param([-1, 2, 0], [1.0, 0.0, 1.0], id="negative-clamped"),
    ],
)
def test_formula(loads: list[float], expected: list[float]) -> None:
    assert scores(loads) == pytest.approx(expected)


def test_falls_back_to_in_flight_requests_without_an_estimate() -> None:
    assert scores([2, 0, 4], key=INFLIGHT) == pytest.approx([0.5, 1.0, 0.0])


def test_no_data_at_all_scores_everything_one() -> None:
    assert scorer().score(make_cycle(), make_request(), EPS) == dict.fromkeys(
        (e.id for e in EPS), 1.0
    )


def test_endpoint_missing_from_the_estimate_counts_as_idle() -> None:
    req = make_request()
    req.attributes[ESTIMATE] = {EPS[0].id: 2.0}
    got = scorer().score(make_cycle(), req, EPS)
    assert [got[e.id] for e in EPS] == [0.0, 1.0, 1.0]


def test_reads_the_named_producer() -> None:
    req = make_request()
    req.attributes["LoadEstimate/mine"] = {EPS[0].id: 2.0}
    req.attributes[ESTIMATE] = {EPS[1].id: 2.0}
    s = scorer(inFlightLoadProducerName="mine")
    assert s.consumes() == {"InFlightLoad/mine"}
    got = s.score(make_cycle(), req, EPS)
    assert [got[e.id] for e in EPS] == [0.0, 1.0, 1.0]


async def test_foreign_queues_steer_requests_from_an_idle_epp() -> None:
    """Pods report queues of 3, 0 and 10 from traffic this EPP never saw; four requests from
    an idle EPP never go to the pod with 10 waiting (in-flight counts alone would all tie)."""
    h = handle()
    p = InflightLoadProducer(
        name="inflight-load-producer", params=InflightLoadProducer.Params(), handle=h
    )
    s = EstimatedLoadScorer(name="load", params=EstimatedLoadScorer.Params(), handle=h)
    eps = [make_endpoint(i, queue=q, update_time=NOW) for i, q in enumerate((3, 0, 10))]
    h.now = NOW + 0.01
    picked = []
    for n in range(4):
        req = make_request(request_id=f"r{n}")
        await p.produce(req, eps)
        got = s.score(make_cycle(now=h.now), req, eps)
        best = max(eps, key=lambda e: got[e.id])  # ties: the first in order
        p.pre_request(req, SchedulingResult({"default": ProfileResult((best,))}, "default"))
        picked.append(best.name)
    assert picked == ["pod-1", "pod-1", "pod-1", "pod-0"]  # estimates 3/0/10 → 3/3/10


def test_loader_creates_the_producer_that_publishes_the_estimate() -> None:
    text = textwrap.dedent("""\
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        plugins:
        - type: estimated-load-scorer
        - type: prefix-cache-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: estimated-load-scorer
            weight: 2
          - pluginRef: prefix-cache-scorer
            weight: 3
        """)
    for _ in range(5):  # consumed keys are a set: the outcome must not depend on its order
        pipeline = load_config(text, registry=PluginRegistry.from_entry_points(), handle_for=handle)
        producers = {p.typed_name.type: p for p in pipeline.producers}
        assert "inflight-load-producer" in producers
        produced = producers["inflight-load-producer"]
        assert isinstance(produced, DataProducer)
        assert ESTIMATE in produced.produces()


def test_params_and_category() -> None:
    check_plugin_class(EstimatedLoadScorer, "estimated-load-scorer")
    s = scorer()
    assert isinstance(s, Scorer)
    assert s.category is ScorerCategory.DISTRIBUTION
    assert s.consumes() == {INFLIGHT}
    with pytest.raises(ParamError, match="inFlightLoadProducerName must not be empty"):
        decode(EstimatedLoadScorer.Params, {"inFlightLoadProducerName": ""})


async def test_contract_with_and_without_estimates() -> None:
    s = scorer()
    p = InflightLoadProducer(
        name="inflight-load-producer", params=InflightLoadProducer.Params(), handle=handle()
    )
    for n in (0, 1, 7, 50):
        eps = sample_endpoints(n, seed=n)
        check_scorer(s, eps)
        req = sample_request()
        await p.produce(req, eps)
        check_scorer(s, eps, req)

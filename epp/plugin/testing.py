"""Contract checks plugin authors run in their own test suites, one per role: filters, scorers,
pickers (here); parsers, producers, screeners, admitters, saturation detectors, profile handlers,
deciders and hooks (``testing_request``); flow policies and the data layer (``testing_flow``).
Each first applies the rules start-up enforces for the role (``epp.plugin.conformance``, the one
definition both use), then exercises the role with a small realistic input.

Each ``check_*`` function raises ``AssertionError`` with a message naming the plugin and the broken
rule. Example::

    from epp.plugin.testing import check_plugin_class, check_scorer, sample_endpoints

    def test_my_scorer_honours_the_contract():
        check_plugin_class(MyScorer, "my-scorer")
        scorer = MyScorer(name="s", params=MyScorer.Params(), handle=None)
        check_scorer(scorer, sample_endpoints(5))
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import random
from collections.abc import Sequence
from typing import Any

from epp.plugin.capabilities import ListScorer
from epp.plugin.params import ParamError, decode
from epp.plugin.protocols import Filter, Picker, Scorer
from epp.plugin.testing_flow import (
    check_data_source,
    check_discovery,
    check_endpoint_listener,
    check_eviction_filter_policy,
    check_eviction_ordering_policy,
    check_extractor,
    check_fairness_policy,
    check_notification_listener,
    check_ordering_policy,
    check_priority_adjuster,
    check_replica_syncer,
    check_shared_state,
    check_usage_limit_policy,
    sample_eviction_items,
    sample_queue,
)
from epp.plugin.testing_request import (
    check_admitter,
    check_decider,
    check_hooks,
    check_parser,
    check_producer,
    check_profile_handler,
    check_role,
    check_saturation_detector,
    check_screener,
)
from epp.plugin.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ScoredEndpoint,
)

__all__ = [
    "check_admitter",
    "check_data_source",
    "check_decider",
    "check_discovery",
    "check_endpoint_listener",
    "check_eviction_filter_policy",
    "check_eviction_ordering_policy",
    "check_extractor",
    "check_fairness_policy",
    "check_filter",
    "check_hooks",
    "check_notification_listener",
    "check_ordering_policy",
    "check_parser",
    "check_picker",
    "check_plugin_class",
    "check_priority_adjuster",
    "check_producer",
    "check_profile_handler",
    "check_replica_syncer",
    "check_role",
    "check_saturation_detector",
    "check_score_list",
    "check_scorer",
    "check_screener",
    "check_shared_state",
    "check_usage_limit_policy",
    "sample_endpoints",
    "sample_eviction_items",
    "sample_queue",
    "sample_request",
]


def sample_endpoints(n: int, *, seed: int = 0) -> list[Endpoint]:
    """``n`` endpoints with varied, realistic metrics (loopback addresses)."""
    rng = random.Random(seed)
    return [
        Endpoint(
            id=f"default/pod-{i}-rank-0",
            name=f"pod-{i}",
            namespace="default",
            address=f"127.0.0.{i % 250 + 1}",
            port=8000 + i // 250,
            labels={"llm-d.ai/engine-type": "vllm", "zone": f"z{i % 3}"},
            metrics=Metrics(
                waiting_queue_size=rng.randint(0, 20),
                running_requests_size=rng.randint(0, 64),
                kv_cache_usage_percent=rng.random(),
                active_models=frozenset({"lora-a"}) if i % 2 else frozenset(),
                max_active_models=2,
                cache_block_size=16,
                cache_num_blocks=1000,
                update_time=1000.0,
            ),
        )
        for i in range(n)
    ]


def sample_request(**overrides: Any) -> InferenceRequest:
    base: dict[str, Any] = {
        "request_id": "contract-check",
        "headers": {"content-type": "application/json"},
        "incoming_model": "m",
        "target_model": "m",
        "received_at": 1000.0,
    }
    base.update(overrides)
    return InferenceRequest(**base)


def _cycle(seed: int = 0) -> CycleState:
    return CycleState(now=1000.0, rng=random.Random(seed))


def check_plugin_class(cls: type[Any], type_name: str) -> None:
    """``TYPE`` matches the registered name; ``Params`` is a frozen dataclass decoded strictly."""
    assert getattr(cls, "TYPE", None) == type_name, f"{cls.__name__}.TYPE != {type_name!r}"
    params: Any = getattr(cls, "Params", None)
    assert isinstance(params, type) and dataclasses.is_dataclass(params), (
        f"{type_name}: Params must be a dataclass"
    )
    assert vars(params)["__dataclass_params__"].frozen, f"{type_name}: Params must be frozen"
    try:
        decode(params, {"__notAField__": 1})
    except ParamError:
        pass
    else:
        raise AssertionError(f"{type_name}: unknown parameter keys must be rejected")


def check_scorer(
    scorer: Scorer, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> None:
    """A scorer as start-up requires (``check_role``); it scores every given endpoint and no
    other, each score a number in [0, 1]; deterministic and synchronous; the endpoints are not
    mutated; an empty list is accepted. A ``ListScorer``'s ``score_list`` returns one score per
    endpoint, each exactly the one ``score`` gives it (``check_score_list``)."""
    check_role(scorer, "scorer")
    request = request or sample_request()
    name = str(scorer.typed_name)
    before = copy.deepcopy(list(endpoints))
    first = scorer.score(_cycle(), request, endpoints)
    assert not inspect.isawaitable(first), f"{name}: score() must be synchronous"
    ids = {e.id for e in endpoints}
    assert set(first) <= ids, f"{name}: scored unknown endpoints {set(first) - ids}"
    assert set(first) >= ids, f"{name}: did not score endpoints {sorted(ids - set(first))}"
    for eid, value in first.items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (
            f"{name}: score of {eid} is not a number"
        )
        assert 0.0 <= value <= 1.0, f"{name}: score {value} of {eid} outside [0, 1]"
    again = scorer.score(_cycle(), request, endpoints)
    assert dict(first) == dict(again), f"{name}: scores differ between identical calls"
    assert list(endpoints) == before, f"{name}: score() mutated its input"
    scorer.score(_cycle(), request, [])
    if isinstance(scorer, ListScorer):
        check_score_list(scorer, endpoints, request)


def check_score_list(
    scorer: Scorer, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> None:
    """A ``ListScorer``: ``score_list`` is synchronous, returns one value per endpoint, and
    ``score_list(...)[i]`` equals ``score(...)[endpoints[i].id]`` (0 where ``score`` leaves the
    endpoint out); for no endpoints, an empty list. Endpoint ids
    must be unique here (with duplicates a mapping holds one score per id)."""
    name = str(scorer.typed_name)
    assert isinstance(scorer, ListScorer), f"{name}: has no score_list()"
    request = request or sample_request()
    by_id = scorer.score(_cycle(), request, endpoints)
    listed = scorer.score_list(_cycle(), request, endpoints)
    assert not inspect.isawaitable(listed), f"{name}: score_list() must be synchronous"
    assert len(listed) == len(endpoints), (
        f"{name}: score_list() returned {len(listed)} scores for {len(endpoints)} endpoints"
    )
    for e, value in zip(endpoints, listed, strict=True):
        expected = by_id.get(e.id, 0.0)
        assert isinstance(value, (int, float)) and value == expected, (
            f"{name}: score_list() gives {e.id} {value!r}, score() gives it {expected!r}"
        )
    assert len(scorer.score_list(_cycle(), request, [])) == 0, (
        f"{name}: score_list() of no endpoints is not empty"
    )


def check_filter(
    flt: Filter, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> None:
    """A filter as start-up requires (``check_role``); the result is a subset of the input,
    deterministic, and the input is not mutated."""
    check_role(flt, "filter")
    request = request or sample_request()
    name = str(flt.typed_name)
    before = list(endpoints)
    out = flt.filter(_cycle(), request, endpoints)
    assert not inspect.isawaitable(out), f"{name}: filter() must be synchronous"
    ids = {e.id for e in endpoints}
    assert all(e.id in ids for e in out), f"{name}: filter() returned endpoints not given to it"
    assert [e.id for e in flt.filter(_cycle(), request, endpoints)] == [e.id for e in out], (
        f"{name}: filter() is not deterministic"
    )
    assert list(endpoints) == before, f"{name}: filter() mutated its input"
    flt.filter(_cycle(), request, [])


def check_picker(picker: Picker, endpoints: Sequence[Endpoint]) -> None:
    """Targets come from the scored candidates; a non-empty candidate list yields a target."""
    check_role(picker, "picker")
    name = str(picker.typed_name)
    scored = [ScoredEndpoint(e, (i % 7) / 7) for i, e in enumerate(endpoints)]
    result = picker.pick(_cycle(), scored)
    assert not inspect.isawaitable(result), f"{name}: pick() must be synchronous"
    ids = {e.id for e in endpoints}
    assert all(t.id in ids for t in result.targets), f"{name}: picked an unknown endpoint"
    if scored:
        assert result.targets, f"{name}: no target from a non-empty candidate list"
    assert len({t.id for t in result.targets}) == len(result.targets), f"{name}: duplicate targets"

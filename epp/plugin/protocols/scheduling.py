"""Scheduling (llm-d's ``framework/interface/scheduling``): a profile's filters, scorers and
picker (``Profile``), the ``ProfileHandler`` that chooses which profiles run and combines their
results, and the ``Decider`` that says whether a disaggregated stage runs. Filters, scorers,
pickers and deciders are synchronous and pure over the request and the endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from epp.plugin.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    PickResult,
    ProfileResult,
    SchedulingResult,
    ScoredEndpoint,
    ScorerCategory,
    TypedName,
)


@runtime_checkable
class Filter(Protocol):
    typed_name: TypedName

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    typed_name: TypedName
    category: ClassVar[ScorerCategory]

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]: ...


@runtime_checkable
class Picker(Protocol):
    typed_name: TypedName

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult: ...


@dataclass(frozen=True)
class Profile:
    """A scheduling profile as the framework runs it (built by the config loader)."""

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[tuple[Scorer, float], ...]
    picker: Picker


@runtime_checkable
class ProfileHandler(Protocol):
    typed_name: TypedName

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, Profile]: ...

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult: ...


@runtime_checkable
class Decider(Protocol):
    """Decides per request whether a disaggregated stage (prefill or encode) runs, for the
    ``disagg-profile-handler`` (``deciders.prefill``, ``deciders.encode``). ``endpoint`` is the
    decode pick when decode ran first, ``None`` otherwise (``prefill-first`` order). Synchronous
    and pure over the request, like a filter; it reads only request attributes that producers
    published before scheduling. Upstream's ``deciderPlugin``."""

    typed_name: TypedName

    def disaggregate(
        self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool: ...

"""A small world for the disaggregation handler tests: role-labelled endpoints, one profile per
stage (role filter + max-score picker), a handle that knows other plugins by name, stub deciders
and the real scheduler loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epp.plugin import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NoParams,
    Profile,
    ProfileHandler,
    SchedulingResult,
    TypedName,
)
from epp.plugin.roles import ROLE_LABEL
from epp.plugins.pickers.common import PickerParams
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.scheduling.scheduler import Scheduler
from filters.decode import DecodeFilter
from filters.encode import EncodeFilter
from filters.prefill import PrefillFilter
from tests.builders import FakeHandle, make_cycle, make_endpoint

DECODE_EP = make_endpoint(0, labels={ROLE_LABEL: "decode"})
PREFILL_EP = make_endpoint(1, labels={ROLE_LABEL: "prefill"})
ENCODE_EP = make_endpoint(2, labels={ROLE_LABEL: "encode"})
ENDPOINTS = (DECODE_EP, PREFILL_EP, ENCODE_EP)


@dataclass
class PluginsHandle(FakeHandle):
    """A handle whose ``plugin(name)`` finds the plugins in ``plugins`` (KeyError otherwise)."""

    plugins: dict[str, Any] = field(default_factory=dict)

    def plugin(self, name: str) -> Any:
        return self.plugins[name]


class StubDecider:
    """Answers ``answer`` and records the endpoint of each call."""

    def __init__(self, answer: bool, name: str = "stub") -> None:
        self.typed_name = TypedName("stub-decider", name)
        self.answer = answer
        self.calls: list[Endpoint | None] = []

    def disaggregate(
        self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool:
        self.calls.append(endpoint)
        return self.answer


def profile(name: str, flt: type[Any]) -> Profile:
    h = FakeHandle()
    picker = MaxScorePicker(name="max-score-picker", params=PickerParams(), handle=h)
    return Profile(name, (flt(name=flt.TYPE, params=NoParams(), handle=h),), (), picker)


PROFILES = {
    "decode": profile("decode", DecodeFilter),
    "prefill": profile("prefill", PrefillFilter),
    "encode": profile("encode", EncodeFilter),
}


def schedule(
    handler: ProfileHandler,
    request: InferenceRequest,
    endpoints: tuple[Endpoint, ...] = ENDPOINTS,
    profiles: dict[str, Profile] | None = None,
) -> tuple[SchedulingResult, list[str]]:
    """Run the real scheduler loop; also return the order in which profiles ran."""
    ran: list[str] = []

    class Recording:
        typed_name = handler.typed_name

        def pick_profiles(self, *args: Any) -> Any:
            chosen = handler.pick_profiles(*args)
            ran.extend(chosen)
            return chosen

        def process_results(self, *args: Any) -> Any:
            return handler.process_results(*args)

    scheduler = Scheduler(
        profiles=PROFILES if profiles is None else profiles,
        handler=Recording(),  # type: ignore[arg-type]
        observe=lambda *_: None,
        count_error=lambda *_: None,
    )
    return scheduler.schedule(make_cycle(), request, endpoints), ran


class SpanSink:
    """Records the spans a traced request's plugins add (``epp.plugin.spans``)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int, dict[str, Any]]] = []

    def add_span(self, name: str, start_ns: int, end_ns: int, attributes: Any) -> None:
        self.spans.append((name, start_ns, end_ns, dict(attributes)))

    def named(self, name: str) -> list[dict[str, Any]]:
        assert all(0 < start <= end for _, start, end, _ in self.spans)
        return [attrs for n, _, _, attrs in self.spans if n == name]

"""Screeners in the Director (``Scheduler.screen``): every screener sees the same candidates and
the request keeps those every one kept, in candidate order, before producers, admitters and the
profiles; nothing kept is a 503, a screener that raises a 500; explain (dry run) and header-only
requests are screened too; each call is timed under the ``Screener`` extension point."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from epp.plugin import (
    CycleState,
    DropReason,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    Profile,
)
from epp.requestcontrol.director import Director
from epp.requestcontrol.objectives import ObjectiveStore
from epp.scheduling.scheduler import Scheduler
from tests.unit.requestcontrol.test_director import (
    BODY,
    EPS,
    HEADERS,
    Best,
    Highest,
    Hook,
    Journal,
    Named,
    One,
    pipeline,
)


class Keep(Named):
    """Keeps the candidates at ``positions`` (of those it is given) and notes what it was given."""

    def __init__(self, name: str, positions: Sequence[int], seen: list[Any]) -> None:
        super().__init__("screener", name)
        self.positions, self.seen = positions, seen

    def screen(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        self.seen.append(
            (self.typed_name.name, [e.id for e in endpoints], dict(request.attributes))
        )
        return [endpoints[i] for i in self.positions if i < len(endpoints)][::-1]


class Broken(Named):
    def screen(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        raise RuntimeError("screener broke")


def director(screeners: list[Any], **kw: Any) -> tuple[Director, list[tuple[str, ...]]]:
    timed: list[tuple[str, ...]] = []
    scheduler = Scheduler(
        profiles={"p": Profile("p", (), ((Highest("scorer"), 1.0),), Best("picker"))},
        handler=One("handler"),
        observe=lambda point, t, n, _s: timed.append((point, t, n)),
        count_error=lambda point, t, n: timed.append(("error", point, t, n)),
    )
    d = Director(
        pipeline=pipeline(screeners=screeners, **kw),
        scheduler=scheduler,
        endpoints=lambda: list(EPS),
        objectives=ObjectiveStore(),
        clock=lambda: 42.0,
    )
    return d, timed


async def test_the_request_keeps_what_every_screener_kept_in_candidate_order() -> None:
    seen: list[Any] = []
    d, timed = director([Keep("a", (0, 2), seen), Keep("b", (1, 2, 0), seen)])
    decision = await d.decide(d.new_request(HEADERS), BODY, {})
    ids = [e.id for e in EPS]
    assert [s[1] for s in seen] == [ids, ids]  # both were given every candidate
    assert [e.id for e in decision.candidates] == [ids[0], ids[2]]
    assert decision.destination == EPS[2].hostport  # scheduled over the screened candidates
    assert ("Screener", "screener", "a") in timed and ("Screener", "screener", "b") in timed


async def test_screeners_run_before_producers_and_admitters() -> None:
    journal, seen = Journal(), []
    hook = Hook(journal, "h")
    d, _ = director(
        [Keep("a", (1,), seen)], producers=[hook], producer_timeouts=[1.0], admitters=[hook]
    )
    decision = await d.decide(d.new_request(HEADERS), BODY, {})
    assert seen[0][2] == {}  # no producer had run yet
    assert journal.calls == [("h", "produce"), ("h", "admit", 1)]
    assert decision.request.attributes["produced"] == 1  # the producer saw the screened pool


async def test_nothing_kept_is_a_503_with_the_no_endpoints_reason() -> None:
    d, _ = director([Keep("a", (0,), []), Keep("b", (1,), [])])
    with pytest.raises(InferenceError) as info:
        await d.decide(d.new_request(HEADERS), BODY, {})
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert info.value.drop_reason == DropReason.NO_ENDPOINTS
    assert info.value.message == "screeners eliminated all endpoint candidates"


async def test_a_screener_that_raises_fails_the_request(caplog: Any) -> None:
    d, timed = director([Broken("screener", "broken")])
    with caplog.at_level(logging.ERROR), pytest.raises(InferenceError) as info:
        await d.decide(d.new_request(HEADERS), BODY, {})
    assert info.value.code is ErrorCode.INTERNAL
    assert "screener broken/screener failed: screener broke" in info.value.message
    assert ("error", "Screener", "screener", "broken") in timed


async def test_explain_and_header_only_requests_are_screened() -> None:
    d, _ = director([Keep("a", (1,), [])])
    decision = await d.decide(d.new_request(HEADERS), BODY, {}, dry_run=True)
    assert decision.destination == EPS[1].hostport
    request = d.new_request(HEADERS)
    assert {d.pick_random({}, request).id for _ in range(20)} == {EPS[1].id}
    empty, _ = director([Keep("a", (), [])])
    with pytest.raises(InferenceError) as info:
        empty.pick_random({}, empty.new_request(HEADERS))
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE


async def test_without_screeners_the_candidates_pass_unchanged() -> None:
    d, timed = director([])
    decision = await d.decide(d.new_request(HEADERS), BODY, {})
    assert decision.candidates == EPS
    assert not [t for t in timed if t[0] == "Screener"]

"""The list → watch loop (Reflector) over a scripted target: no threads, no real time."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3

from epp.k8s.meta import DecodeError
from epp.k8s.watch import Backoff, Gone, Reflector
from tests.unit.k8s.fakes import Clock, ScriptedTarget, event, obj


def decode(raw: Any) -> str:
    value = raw.get("value")
    if not isinstance(value, str):
        raise DecodeError("value must be a string")
    return value


def run(target: ScriptedTarget, iterations: int, **kw: Any) -> tuple[Reflector[str], list[Any]]:
    changes: list[dict[str, str]] = []
    sleeps: list[float] = []
    clock = kw.pop("clock", Clock())

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)

    reflector = Reflector(
        target, decode, changes.append, clock=clock, sleep=sleep, max_iterations=iterations, **kw
    )
    reflector.run()
    return reflector, [changes, sleeps]


def test_cache_follows_events_when_the_watch_streams() -> None:
    target = ScriptedTarget(
        lists=[([obj("a", "1", value="A")], "5")],
        watches=[
            [
                event("ADDED", "b", "6", value="B"),
                event("MODIFIED", "a", "7", value="A2"),
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
                event("DELETED", "b", "10"),
            ]
        ],
    )
    reflector, (changes, sleeps) = run(target, 2, short_watch=0.0)
    assert changes == [
        {"default/a": "A"},
        {"default/a": "A", "default/b": "B"},
        {"default/a": "A2", "default/b": "B"},
        {"default/a": "A2"},
    ]
    assert reflector.resource_version == "10"
    assert target.calls == [("list", ""), ("watch", "5")]
    assert sleeps == []
    assert reflector.synced


def test_watch_resumes_from_the_bookmark_when_the_stream_ends_cleanly() -> None:
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}}
    target = ScriptedTarget(lists=[([], "5")], watches=[[bookmark], []])
    clock = Clock()
    reflector, (changes, _) = run(target, 3, clock=clock, short_watch=0.0)
    assert target.calls == [("list", ""), ("watch", "5"), ("watch", "42")]
    assert reflector.resource_version == "42"
    assert changes == [{}]  # a bookmark changes nothing


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param([Gone("too old")], id="410-raised"),
        pytest.param(
            [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
            id="410-error-event",
        ),
    ],
)
def test_relist_deletes_what_vanished_when_the_watch_gets_410(failure: list[Any]) -> None:
    target = ScriptedTarget(
        lists=[
            ([obj("a", "1", value="A"), obj("b", "2", value="B")], "5"),
            ([obj("b", "2", value="B")], "8"),
        ],
        watches=[failure],
    )
    reflector, (changes, sleeps) = run(target, 3)
    assert changes[-1] == {"default/b": "B"}
    assert target.calls == [("list", ""), ("watch", "5"), ("list", "")]
    assert reflector.stats.gone == 1
    assert sleeps == []  # a relist needs no back-off
    assert reflector.resource_version == "8"


def test_backoff_grows_then_resets_when_calls_fail_then_succeed() -> None:
    broken = urllib3.exceptions.ProtocolError("Response ended prematurely")
    target = ScriptedTarget(
        lists=[RuntimeError("500"), RuntimeError("500"), ([], "5")],
        watches=[[event("ADDED", "a", "6", value="A"), broken], [broken]],
    )
    reflector, (changes, sleeps) = run(target, 5, backoff=Backoff(initial=0.5, maximum=1.5))
    assert sleeps == [0.5, 1.0, 0.5, 1.0]
    assert target.calls == [
        ("list", ""),
        ("list", ""),
        ("list", ""),
        ("watch", "5"),
        ("watch", "6"),  # resumes from the last event, no relist
    ]
    assert reflector.stats.errors == 4
    assert changes[-1] == {"default/a": "A"}


def test_bad_objects_are_skipped_when_they_do_not_decode() -> None:
    target = ScriptedTarget(
        lists=[([obj("a", "1", value="A"), obj("bad", "2", value=7), {"no": "metadata"}], "5")],
        watches=[
            [
                event("ADDED", "c", "6", value=["x"]),
                event("MODIFIED", "a", "7", value=None),  # a known object turns bad: dropped
                {"type": "ADDED", "object": "not an object"},
                event("ADDED", "d", "8", value="D"),
            ]
        ],
    )
    reflector, (changes, sleeps) = run(target, 2, short_watch=0.0)
    assert changes == [{"default/a": "A"}, {}, {"default/d": "D"}]
    assert reflector.stats.decode_errors == 5
    assert reflector.resource_version == "8"
    assert sleeps == []


def test_watch_backs_off_when_the_server_closes_it_at_once() -> None:
    target = ScriptedTarget(lists=[([], "5")], watches=[[], [], []])
    reflector, (_, sleeps) = run(target, 4, backoff=Backoff(initial=0.1, maximum=10))
    assert sleeps == [0.1, 0.2, 0.4]
    assert reflector.stats.watches == 3


def test_loop_ends_when_stopped() -> None:
    target = ScriptedTarget(lists=[([], "5")], watches=[])
    changes: list[Any] = []
    reflector: Reflector[str] = Reflector(target, decode, changes.append, max_iterations=100)
    reflector.stop()
    reflector.run()
    assert target.calls == []
    assert target.stopped

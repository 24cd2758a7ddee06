"""The label policies that keep client-chosen strings from growing the metrics."""

from __future__ import annotations

from epp.observability.labels import OTHER, UNKNOWN, LabelCap, ModelLabels


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_label_cap_folds_values_beyond_the_cap_or_too_long_into_other() -> None:
    cap = LabelCap(3, max_chars=5)
    assert [cap(v) for v in ("a", "b", "toolong", "c", "d", "a")] == [
        "a",
        "b",
        OTHER,
        "c",
        OTHER,
        "a",
    ]


def test_a_name_no_source_reports_and_no_server_confirmed_is_unknown() -> None:
    labels = ModelLabels()
    labels.add_source(lambda: ["base", "lora-a"])
    assert [labels(n) for n in ("base", "lora-a", "made-up", "")] == ["base", "lora-a", UNKNOWN, ""]


def test_sources_are_read_at_most_once_per_refresh_and_their_names_are_remembered() -> None:
    clock = Clock()
    calls: list[int] = []
    running: list[str] = []

    def source() -> list[str]:
        calls.append(1)
        return list(running)

    labels = ModelLabels(clock=clock, refresh=1.0)
    labels.add_source(source)
    assert labels("lora-a") == UNKNOWN
    running.append("lora-a")
    for i in range(100):
        assert labels(f"x-{i}") == UNKNOWN  # a flood of unknown names: no extra source reads
    assert labels("lora-a") == UNKNOWN and len(calls) == 1
    clock.now = 1.0
    assert labels("lora-b") == UNKNOWN and len(calls) == 2  # refreshed: lora-a is now seen
    running.clear()  # the adapter stops running; it was seen, so it stays a served name
    clock.now = 5.0
    assert labels("lora-a") == "lora-a"


def test_learned_names_are_few_and_short() -> None:
    labels = ModelLabels(learned_cap=2, max_chars=8)
    labels.learn("base")
    labels.learn("x" * 9)  # too long: never learned
    labels.learn("second")
    labels.learn("third")  # over the learned cap
    assert [labels(n) for n in ("base", "second", "third", "x" * 9)] == [
        "base",
        "second",
        UNKNOWN,
        UNKNOWN,
    ]


def test_admitted_names_are_capped_then_read_other() -> None:
    labels = ModelLabels(cap=2)
    labels.add_source(lambda: ["a", "b", "c"])
    assert [labels(n) for n in ("a", "b", "c", "a")] == ["a", "b", OTHER, "a"]
    assert labels.admitted() == {"a", "b"}


def test_a_failing_source_leaves_names_unknown() -> None:
    def broken() -> list[str]:
        raise RuntimeError("boom")

    labels = ModelLabels()
    labels.add_source(broken)
    assert labels("m") == UNKNOWN


def test_an_alias_counts_only_when_a_source_serves_it() -> None:
    labels = ModelLabels()
    labels.add_source(lambda: ["rewritten-by-an-object"])
    labels.learn("learned-a")
    labels.learn("learned-b")
    assert labels("learned-a") == "learned-a"
    assert labels.alias("learned-a") == UNKNOWN  # a client cannot pair two learned names
    assert labels.alias("rewritten-by-an-object") == "rewritten-by-an-object"
    assert labels.alias("") == ""

"""The misuse log: each reason at most once every 30 s, with the number of occurrences between."""

from __future__ import annotations

import logging

import pytest

from epp.server.misuse import MisuseLog, ProtocolError

LOGGER = "test.misuse"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    out = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == LOGGER)
    caplog.clear()
    return out


def test_a_reason_is_logged_once_per_30_s_with_the_count_in_between(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    report = MisuseLog(logging.getLogger(LOGGER), clock)
    err = ProtocolError("no_request", "ProcessingRequest sets none of ...")
    assert (err.reason, err.message, str(err)) == ("no_request", err.message, err.message)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report(err)
        assert lines(caplog) == [
            "ext_proc protocol error (no_request), stream ended with INVALID_ARGUMENT: "
            "ProcessingRequest sets none of ..."
        ]
        for step in (1.0, 28.9):  # 29.9 s after the report: still quiet
            clock.now += step
            report(err)
        assert lines(caplog) == []
        clock.now += 0.1  # 30 s after the report
        report(err)
        assert lines(caplog) == [
            "ext_proc protocol error (no_request), stream ended with INVALID_ARGUMENT: "
            "ProcessingRequest sets none of ... (2 more since the last report)"
        ]
        clock.now += 30.0  # nothing suppressed since: no count
        report(err)
        assert lines(caplog)[0].endswith("sets none of ...")


def test_reasons_are_rate_limited_independently(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    report = MisuseLog(logging.getLogger(LOGGER), clock)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report(ProtocolError("no_request", "a"))
        clock.now += 5
        report(ProtocolError("undecodable", "b"))
        report(ProtocolError("no_request", "c"))
        report(ProtocolError("undecodable", "d"))
        assert [line.rsplit(": ", 1)[1] for line in lines(caplog)] == ["a", "b"]
        clock.now += 25
        report(ProtocolError("no_request", "e"))
        report(ProtocolError("undecodable", "f"))  # only 25 s after its report
        assert [line.rsplit(": ", 1)[1] for line in lines(caplog)] == [
            "e (1 more since the last report)"
        ]

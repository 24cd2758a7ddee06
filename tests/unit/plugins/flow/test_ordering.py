from __future__ import annotations

import math

import pytest

from epp.plugin.flow import QueuedRequest
from tests.builders import handle
from tests.unit.flowcontrol.flow_builders import build_plugin, request


def _item(
    seq: int,
    *,
    enqueued: float = 100.0,
    ttl: float = 0.0,
    received: float = 100.0,
    slo: str | None = None,
    header: str = "x-llm-d-slo-ttft-ms",
) -> QueuedRequest:
    headers = {header: slo} if slo is not None else {}
    req = request(f"r{seq}", headers=headers, received_at=received)
    return QueuedRequest(req, list, "f", 0, enqueued, ttl, 0, seq)


def _key(type_name: str, item: QueuedRequest) -> tuple[float, ...]:
    return tuple(build_plugin(handle(), type_name).order_key(item))


@pytest.mark.parametrize(
    ("type_name", "item", "expected"),
    [
        pytest.param("fcfs-ordering-policy", _item(3, enqueued=5.0), (5.0, 3.0), id="fcfs"),
        pytest.param(
            "edf-ordering-policy", _item(1, enqueued=5.0, ttl=30.0), (35.0, 5.0, 1.0), id="edf"
        ),
        pytest.param(
            "edf-ordering-policy",
            _item(1, enqueued=5.0, ttl=0.0),
            (math.inf, 5.0, 1.0),
            id="edf-no-ttl-far-future",
        ),
        pytest.param(
            "slo-deadline-ordering-policy",
            _item(2, received=10.0, slo="250"),
            (10.25, 10.0, 2.0),
            id="slo-header",
        ),
        pytest.param(
            "slo-deadline-ordering-policy",
            _item(2, received=10.0, slo="1500", header="x-slo-ttft-ms"),
            (11.5, 10.0, 2.0),
            id="slo-deprecated-alias",
        ),
        pytest.param(
            "slo-deadline-ordering-policy",
            _item(2, received=10.0, slo=" +40 "),
            (10.04, 10.0, 2.0),
            id="slo-plus-sign-and-spaces",
        ),
    ],
)
def test_order_key_follows_formula_when_policy_given(
    type_name: str, item: QueuedRequest, expected: tuple[float, ...]
) -> None:
    assert _key(type_name, item) == pytest.approx(expected)


@pytest.mark.parametrize(
    "slo",
    [
        pytest.param(None, id="missing"),
        pytest.param("", id="empty"),
        pytest.param("-5", id="negative"),
        pytest.param("1.5", id="not-integer"),
        pytest.param("abc", id="garbage"),
        pytest.param("++5", id="double-sign"),
        pytest.param(str(2**62), id="overflows-go-duration"),
    ],
)
def test_slo_deadline_is_far_future_when_header_invalid(slo: str | None) -> None:
    key = _key("slo-deadline-ordering-policy", _item(0, slo=slo))
    assert key[0] == math.inf


@pytest.mark.parametrize(
    ("type_name", "items", "expected_order"),
    [
        pytest.param(
            "fcfs-ordering-policy",
            [_item(0, enqueued=3.0), _item(1, enqueued=1.0), _item(2, enqueued=1.0)],
            ["r1", "r2", "r0"],
            id="fcfs-arrival-then-seq",
        ),
        pytest.param(
            "edf-ordering-policy",
            [
                _item(0, enqueued=1.0, ttl=0.0),
                _item(1, enqueued=2.0, ttl=10.0),
                _item(2, enqueued=5.0, ttl=1.0),
            ],
            ["r2", "r1", "r0"],
            id="edf-earliest-deadline-no-ttl-last",
        ),
        pytest.param(
            "slo-deadline-ordering-policy",
            [
                _item(0, received=1.0),
                _item(1, received=2.0, slo="5000"),
                _item(2, received=3.0, slo="100"),
                _item(3, received=0.5),
            ],
            ["r2", "r1", "r3", "r0"],
            id="slo-bound-first-then-received-order",
        ),
    ],
)
def test_items_sort_by_key_when_several_queued(
    type_name: str, items: list[QueuedRequest], expected_order: list[str]
) -> None:
    ordered = sorted(items, key=lambda it: _key(type_name, it))
    assert [it.request.request_id for it in ordered] == expected_order

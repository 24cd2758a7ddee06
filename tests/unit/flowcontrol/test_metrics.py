"""FlowControlMetrics' recording helpers: queue labels kept from enqueue to outcome."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from epp.flowcontrol.metrics import FlowControlMetrics
from epp.flowcontrol.outcomes import DISPATCHED, REJECTED_CAPACITY
from epp.plugin.flow import QueuedRequest
from tests.builders import make_request


def _item(seq: int, *, priority: int = 0, size: int = 10, enqueued: float = 1.0) -> QueuedRequest:
    request = make_request(incoming_model="m", target_model="t", size_bytes=size)
    return QueuedRequest(
        request=request,
        candidates=list,
        fairness_id="f",
        priority=priority,
        enqueue_time=enqueued,
        ttl=0.0,
        size_bytes=size,
        seq=seq,
    )


def _env() -> tuple[FlowControlMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return FlowControlMetrics(registry, "pool"), registry


QUEUED = {
    "fairness_id": "f",
    "priority": "0",
    "inference_pool": "pool",
    "model_name": "m",
    "target_model_name": "t",
}


def test_queue_gauges_follow_enter_and_leave_on_both_twins() -> None:
    m, reg = _env()
    item = _item(1, size=10)
    m.enter_queue(item, m.queue_labels(item))
    for prefix in ("llm_d_epp", "inference_extension"):
        assert reg.get_sample_value(f"{prefix}_flow_control_queue_size", QUEUED) == 1
        assert reg.get_sample_value(f"{prefix}_flow_control_queue_bytes", QUEUED) == 10
    m.leave_queue(item)
    m.leave_queue(_item(2))  # never entered: nothing to undo
    assert reg.get_sample_value("llm_d_epp_flow_control_queue_size", QUEUED) == 0
    assert reg.get_sample_value("llm_d_epp_flow_control_queue_bytes", QUEUED) == 0


def test_finished_uses_the_labels_kept_at_enqueue_once() -> None:
    m, reg = _env()
    item = _item(1, enqueued=1.0)
    m.enter_queue(item, m.queue_labels(item))
    m.leave_queue(item)
    item.outcome = DISPATCHED
    m.finished(item, 3.5)
    m.finished(item, 4.0)  # labels were dropped: counted again, no second duration sample
    duration = {**QUEUED, "outcome": DISPATCHED}
    name = "llm_d_epp_flow_control_request_queue_duration_seconds"
    assert reg.get_sample_value(f"{name}_count", duration) == 1
    assert reg.get_sample_value(f"{name}_sum", duration) == 2.5
    total = {"outcome": DISPATCHED, "priority": "0", "inference_pool": "pool"}
    assert reg.get_sample_value("llm_d_epp_flow_control_requests_total", total) == 2


def test_a_rejected_item_is_finished_with_explicit_labels() -> None:
    m, reg = _env()
    item = _item(1, enqueued=2.0)
    item.outcome = REJECTED_CAPACITY
    m.finished(item, 2.0, m.queue_labels(item))
    duration = {**QUEUED, "outcome": REJECTED_CAPACITY}
    name = "inference_extension_flow_control_request_queue_duration_seconds"
    assert reg.get_sample_value(f"{name}_count", duration) == 1


def test_queue_labels_follow_the_apps_model_policy_and_bound_fairness_ids() -> None:
    from epp.observability.metrics import EppMetrics

    registry = CollectorRegistry()
    policy = EppMetrics(registry)
    policy.model_labels.add_source(lambda: ["t"])
    m = FlowControlMetrics(registry, "pool", policy.models)
    item = _item(1)  # incoming "m" (not served: a client's choice), target "t" (served)
    assert m.queue_labels(item)[3:] == ("unknown", "t")
    item.fairness_id = "x" * 129  # longer than any fairness label
    assert m.queue_labels(item)[0] == "other"

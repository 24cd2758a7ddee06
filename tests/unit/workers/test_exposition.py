"""The union of the workers' /metrics pages: a single process's families, labelled by worker."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.observability.metrics import EppMetrics
from epp.workers.exposition import labelled, union


def _page(requests: int) -> str:
    m = EppMetrics()
    for _ in range(requests):
        m.request_total.inc(("m", "m", "f", "0"), ("m", "m", "0"))
    m.scheduler_e2e.observe((), (), 0.001)
    m.ready_endpoints.set(("default",), ("default",), 2)
    return generate_latest(m.registry).decode()


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_the_union_has_exactly_a_single_process_families_help_and_types() -> None:
    single = _page(1)
    merged = union({0: _page(2), 1: _page(3)})
    assert _families(merged) == _families(single)
    headers = [line for line in merged.splitlines() if line.startswith("#")]
    assert headers == [line for line in single.splitlines() if line.startswith("#")]


def test_every_sample_names_its_worker_and_values_pass_through() -> None:
    merged = union({0: _page(2), 1: _page(3)})
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(merged):
        for sample in family.samples:
            assert sample.labels["worker"] in ("0", "1"), sample
            if sample.name == "llm_d_epp_request_total":
                totals[sample.labels["worker"]] = sample.value
    assert totals == {"0": 2.0, "1": 3.0}


def test_each_family_is_one_block_with_each_worker_contiguous_inside() -> None:
    merged = union({0: _page(1), 1: _page(1)})
    names = [f.name for f in text_string_to_metric_families(merged)]
    assert len(names) == len(set(names))  # a family split in two would parse as two
    block = [
        line
        for line in merged.splitlines()
        if line.startswith("llm_d_epp_scheduler_e2e_duration_seconds_")
        and not line.startswith("llm_d_epp_scheduler_e2e_duration_seconds_created")
    ]
    workers = [line.split('worker="')[1][0] for line in block]
    assert workers == sorted(workers) and set(workers) == {"0", "1"}


def test_a_worker_that_did_not_answer_is_simply_absent() -> None:
    merged = union({1: _page(1)})
    workers = {
        s.labels["worker"] for f in text_string_to_metric_families(merged) for s in f.samples
    }
    assert workers == {"1"}
    assert union({}) == ""


def test_labelled_puts_the_worker_label_first_in_every_sample_form() -> None:
    label = 'worker="3"'
    assert labelled("up 1", label) == 'up{worker="3"} 1'
    assert labelled('up{a="b"} 1', label) == 'up{worker="3",a="b"} 1'
    assert labelled("up{} 1 1700000000", label) == 'up{worker="3"} 1 1700000000'
    assert labelled('h_bucket{le="+Inf",x="a b}"} 2.0', label) == (
        'h_bucket{worker="3",le="+Inf",x="a b}"} 2.0'
    )

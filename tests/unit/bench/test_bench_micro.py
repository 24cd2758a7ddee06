from __future__ import annotations

from epp.bench.micro import ENDPOINT_COUNTS, Row, chat_body, endpoints, measure, table


async def test_micro_measures_every_hot_path_step_when_run_once() -> None:
    rows = await measure(runs=1)
    steps = [(r.step, r.size) for r in rows]
    assert steps[:2] == [
        ("openai-parser parse_request", "10 KB body"),
        ("openai-parser parse_request", "800 KB body"),
    ]
    producers = [s for s, _ in steps[2 : -len(ENDPOINT_COUNTS)]]
    assert sorted(producers) == [
        "approx-prefix-cache-producer",
        "inflight-load-producer",
        "token-producer",
    ]
    assert steps[-len(ENDPOINT_COUNTS) :] == [
        ("Scheduler.schedule (default profile)", f"{n} endpoints") for n in ENDPOINT_COUNTS
    ]
    assert all(r.median_us > 0 and r.ratio > 0 for r in rows)


def test_micro_table_prints_one_line_per_row_when_rendered() -> None:
    rows = [Row("step-a", "10 KB body", 12.5, 1.25, "µs/KB")]
    text = table(rows, runs=7)
    assert text.splitlines()[0] == "EPP hot path, median of 7 runs"
    assert text.splitlines()[-1].split() == ["step-a", "10", "KB", "body", "12.5", "1.250", "µs/KB"]


def test_micro_inputs_have_the_requested_sizes_when_built() -> None:
    assert 190_000 <= len(chat_body(195_000)) // 4 <= 200_000
    eps = endpoints(1000)
    assert len({e.id for e in eps}) == 1000
    assert all(e.metrics is not None and e.metrics.cache_block_size == 16 for e in eps)

from __future__ import annotations

import pytest

from epp.config.loader import load_config
from epp.plugin.registry import PluginRegistry
from epp_tools.bench.micro.cli import ENDPOINT_COUNTS, Row, chat_body, endpoints, measure, table
from tests.builders import handle


async def test_micro_measures_every_hot_path_step_when_run_once() -> None:
    rows = await measure(runs=1)
    steps = [(r.step, r.size) for r in rows]
    assert steps[:2] == [
        ("openai-parser parse_request", "10 KB body"),
        ("openai-parser parse_request", "800 KB body"),
    ]
    producers = sorted(step for step, size in steps if size.endswith("K tokens"))
    assert producers == ["approx-prefix-cache-producer", "inflight-load-producer", "token-producer"]
    assert [x for x in steps if x[0].startswith("Scheduler")] == [
        ("Scheduler.schedule (default profile)", f"{n} endpoints") for n in ENDPOINT_COUNTS
    ]
    sharing = [r.step for r in rows if r.step.startswith("prefix sharing")]
    assert sharing == [
        "prefix sharing: export",
        "prefix sharing: encode and decode",
        "prefix sharing: apply, a turn (known)",
        "prefix sharing: apply, a fresh prompt",
    ]
    lookups = [r for r in rows if r.step == "prefix index match"]
    assert len(lookups) == 5 and all(r.unit == "ns/matched block" for r in lookups)
    (memory,) = [r for r in rows if r.step == "prefix index memory"]
    assert 5 < memory.ratio < 2000  # long chains: past the dense head one entry per 8 blocks
    assert all(r.ratio > 0 for r in rows)


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


def test_wire_rows_measure_each_server_when_every_stream_is_answered() -> None:
    from epp_tools.bench.micro import wire

    variants = [
        wire.Variant("epp", "epp"),
        wire.Variant("empty", "empty-aio"),
        wire.Variant("tls", "epp", tls=True),
        wire.Variant("lockstep", "epp", lockstep=True),  # every reply read before the next write
    ]
    costs = wire.measure(variants, chunks=3, requests=wire.STREAMS)
    assert [c.variant.label for c in costs] == ["epp", "empty", "tls", "lockstep"]
    assert all(c.per_request_us >= 0 and c.per_chunk_us >= 0 for c in costs)


def test_idle_cost_reads_the_epp_process_cpu_and_the_scrapes_the_pods_answered() -> None:
    from epp_tools.bench.micro.idle import idle_cost

    cost = idle_cost(2, seconds=1.0, warmup=0.5)
    assert 0.0 < cost.share < 2.0  # a share of one core; at most the machine's two
    assert 0.0 < cost.scrapes_per_s <= 2 * cost.expected_per_s
    assert cost.expected_per_s == 40.0


def test_scrape_rows_put_the_previous_parse_beside_the_current_one() -> None:
    from epp_tools.bench.micro.cli import scrape_rows

    rows = scrape_rows(3)
    assert [r.step for r in rows] == [
        "scrape: parse (before: promtext.parse)",
        "scrape: parse (now: LineCache)",
        "scrape: core-metrics-extractor (before)",
        "scrape: core-metrics-extractor (now)",
    ]
    assert all(r.median_us > 0 and r.unit == "µs/scrape" for r in rows)


def test_round_trip_rows_time_each_phase_when_the_server_answers_every_step() -> None:
    from epp_tools.bench.micro import wire, wirelat

    variants = [wire.Variant("epp", "epp"), wire.Variant("empty", "empty-aio")]
    trips = wirelat.measure(variants, n=3)
    assert [t.variant.label for t in trips] == ["epp", "empty"]
    for t in trips:
        assert list(t.median_us) == list(wirelat.PHASES)
        assert all(0.0 < us < 30e6 for us in t.median_us.values())


def test_in_process_chunk_cost_is_measured_on_a_routed_stream() -> None:
    from epp_tools.bench.micro import chunkcost

    assert 0.0 <= chunkcost.measure(chunks=400) < 10_000.0


def test_in_process_long_request_cost_is_measured_on_whole_turns() -> None:
    from epp_tools.bench.micro import chunkcost

    # each turn must be routed and its stream ended, or the harness raises
    assert 0.0 <= chunkcost.measure_long(requests=2) < 10_000_000.0


def test_micro_help_names_the_default_profile_the_hot_path_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from epp_tools.bench.micro import cli as micro

    with pytest.raises(SystemExit):
        micro.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    # what HotPath loads: the built-in default, through the normal loader
    pipeline = load_config(None, registry=PluginRegistry.from_entry_points(), handle_for=handle)
    (profile,) = pipeline.profiles.values()
    loaded = [f.typed_name.name for f in profile.filters]
    loaded += [f"{s.typed_name.name} {weight:g}" for s, weight in profile.scorers]
    assert f"The built-in default profile: {', '.join(loaded)}." in help_text


def test_wakeup_rows_time_one_chunk_and_the_fixed_loop_after_each_sleep() -> None:
    from epp_tools.bench.micro import wakeup

    costs = wakeup.measure(gaps=(0.0, 0.001), samples=5)
    assert [c.gap_s for c in costs] == [0.0, 0.001]
    for cost in costs:
        # a chunk is a few µs in process; 0 would mean no work was timed
        assert 0.0 < cost.chunk_us < 100_000.0 and 0.0 < cost.loop_us < 100_000.0, cost

"""``epp bench rate``: the arrival schedules, histogram differences and percentiles, a step row."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import socket
import statistics

import orjson
import pytest

from epp_tools.bench.rate.cli import build_parser
from epp_tools.bench.rate.load import PATH, Shot, bodies, open_loop, runqueue_wait_seconds
from epp_tools.bench.rate.stats import Histogram, arrivals, format_ms, parse_histogram
from epp_tools.bench.rate.summary import PICK, PROCESSING, Reading, report_md, step_row


def _text(a: float, b: float, c: float, d: float, s: float) -> str:
    return (
        f"# HELP {PICK} Scheduling latency\n# TYPE {PICK} histogram\n"
        f'{PICK}_bucket{{le="0.001"}} {a}\n{PICK}_bucket{{le="0.002"}} {b}\n'
        f'{PICK}_bucket{{le="0.005"}} {c}\n{PICK}_bucket{{le="+Inf"}} {d}\n'
        f"{PICK}_count {d}\n{PICK}_sum {s}\n{PICK}_created 1.7e9\n"
    )


def test_uniform_arrivals_are_evenly_spaced_when_generated() -> None:
    times = arrivals(500, 2.0, "uniform")
    assert len(times) == 1000
    assert times[0] == 0.0 and times[-1] == pytest.approx(1.998)
    assert {round(b - a, 9) for a, b in itertools.pairwise(times)} == {0.002}


def test_poisson_arrivals_have_the_rate_and_exponential_gaps_when_generated() -> None:
    times = arrivals(500, 20.0, "poisson", seed=3)
    assert times[0] > 0.0 and times[-1] < 20.0
    assert times == sorted(times)
    assert len(times) == pytest.approx(10_000, rel=0.03)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.002, rel=0.03)
    # exponential gaps: standard deviation equals the mean (uniform spacing would have 0)
    assert statistics.pstdev(gaps) == pytest.approx(0.002, rel=0.05)
    assert arrivals(500, 20.0, "poisson", seed=3) == times
    assert arrivals(500, 20.0, "poisson", seed=4) != times


def test_arrivals_refuse_a_bad_rate_or_kind_when_asked() -> None:
    for bad in ((0, 1.0, "poisson"), (10, 0.0, "uniform"), (10, 1.0, "bursty")):
        with pytest.raises(ValueError):
            arrivals(*bad)


def test_histogram_difference_keeps_only_what_the_step_added_when_subtracted() -> None:
    before = parse_histogram(_text(10, 10, 10, 10, 0.005), PICK)
    after = parse_histogram(_text(10, 60, 100, 110, 0.4), PICK)
    step = after.minus(before)
    assert step.count == 100
    assert step.buckets == ((0.001, 0.0), (0.002, 50.0), (0.005, 90.0), (math.inf, 100.0))
    assert step.total == pytest.approx(0.395)
    assert step.mean == pytest.approx(0.00395)


def test_quantile_interpolates_inside_the_bucket_when_asked() -> None:
    h = Histogram(((0.001, 0.0), (0.002, 50.0), (0.005, 90.0), (math.inf, 100.0)), 100.0)
    assert h.quantile(0.5) == pytest.approx(0.002)
    assert h.quantile(0.25) == pytest.approx(0.0015)
    assert h.quantile(0.7) == pytest.approx(0.002 + 0.003 * 20 / 40)
    assert math.isinf(h.quantile(0.95))  # past the largest bound: no upper limit is known
    assert format_ms(h.quantile(0.95), h.top) == "> 5"
    first = Histogram(((0.001, 10.0), (math.inf, 10.0)), 10.0)
    assert first.quantile(0.5) == pytest.approx(0.0005)  # the first bucket starts at 0
    assert math.isnan(Histogram((), 0.0).quantile(0.5))
    assert format_ms(math.nan) == "-"


def test_parse_histogram_sums_label_sets_and_ignores_other_families_when_read() -> None:
    text = (
        f'{PROCESSING}_bucket{{le="0.01",pod="a"}} 2\n'
        f'{PROCESSING}_bucket{{pod="b",le="0.01"}} 3\n'
        f'{PROCESSING}_bucket{{le="+Inf",pod="a"}} 4\n'
        f'{PROCESSING}_count{{pod="a"}} 4\n{PROCESSING}_count{{pod="b"}} 3\n'
        f'{PICK}_bucket{{le="0.01"}} 99\n'
    )
    h = parse_histogram(text, PROCESSING)
    assert h.buckets == ((0.01, 5.0), (math.inf, 4.0)) and h.count == 7
    assert parse_histogram("", PICK) == Histogram((), 0.0, 0.0)


def test_step_row_reports_rate_picks_cpu_and_errors_when_a_step_ends() -> None:
    before = Reading(_text(0, 0, 0, 0, 0), {"epp": 1.0, "client": 0.0}, 100.0)
    after = Reading(_text(80, 95, 100, 100, 0.1), {"epp": 1.5, "client": 0.2}, 102.0, 0.5)
    shots = [Shot(0.001, 200, 0.010) for _ in range(100)] + [Shot(0.001, 0, 0, "client cap")]
    row = step_row("epp", 50, 2.0, shots, 2.0, before, after, idle_cores=0.05)
    assert (row["sent"], row["ok"], row["errors"]) == (101, 100, 1)
    assert row["error_kinds"] == {"client cap": 1}
    assert row["achieved_rate"] == 50.0 and not row["reached"]  # an error: not reached
    assert row["picks"] == 100
    assert row["pick_ms"]["p50"] == "0.62" and row["pick_ms"]["p95"] == "2.00"
    assert row["cpu_ms_per_req"]["epp"] == 5.0
    assert row["epp_net_ms_per_req"] == 4.0  # 0.5 s less 0.05 cores x 2 s, over 100
    assert row["cores"]["epp"] == 0.25
    assert row["epp_cpu_wait_s_per_s"] == 0.25
    clean = step_row("epp", 50, 2.0, shots[:100], 2.6, before, after, 0.0)
    assert clean["reached"] and clean["achieved_rate"] == 50.0  # the answers' tail is no loss
    slow = step_row("epp", 60, 2.0, shots[:100], 2.0, before, after, 0.0)
    assert not slow["reached"]  # 50/s is below 95% of 60/s
    md = report_md({"run": _RUN, "servers": [{"server": "epp", "status": "ok", "steps": [row]}]})
    assert "| epp | 50 | 50 (not reached) | 1 | 0.62 / 2.00 / 4.40 |" in md
    assert "| 0.25 | - / - / 0.10 | 1.0 | 0.25 | - |" in md


_RUN = {
    "started": "now", "pods": 10, "config": "c.yaml", "arrivals": "poisson", "duration_s": 2.0,
    "epp_cpu": [1], "other_cpus": [0], "max_tokens": 100, "stream": False,
    "load_average": [1.0, 1.0, 1.0],
}  # fmt: skip


def test_bodies_are_small_chat_requests_sharing_system_prompts_when_built() -> None:
    out = [orjson.loads(b) for b in bodies(10, groups=4, max_tokens=7)]
    assert {b["max_tokens"] for b in out} == {7} and not any(b["stream"] for b in out)
    assert out[0]["messages"][0] == out[4]["messages"][0] != out[1]["messages"][0]
    assert len({b["messages"][1]["content"] for b in out}) == 10
    assert len(out[0]["messages"][1]["content"].split()) == 100


def test_parser_reads_rates_and_refuses_bad_ones_when_parsed() -> None:
    args = build_parser().parse_args(["--rates", "100,500", "--no-isolate"])
    assert args.rates == (100.0, 500.0) and not args.isolate
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rates", "100,-5"])


def test_runqueue_wait_reads_this_process_schedstat_when_asked() -> None:
    assert runqueue_wait_seconds(os.getpid()) >= 0.0
    assert runqueue_wait_seconds(0) == 0.0


async def test_open_loop_sends_on_schedule_and_counts_the_client_cap_when_behind() -> None:
    from aiohttp import web

    arrived, release = asyncio.Event(), asyncio.Event()
    seen: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.read())
        arrived.set()
        await release.wait()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post(PATH, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()

    async def let_go() -> None:
        await arrived.wait()
        release.set()

    helper = asyncio.create_task(let_go())
    try:
        shots, wall = await open_loop(
            f"http://127.0.0.1:{port}", [b"a", b"b"], [0.0, 0.0, 0.0], max_in_flight=1
        )
        assert [s.ok for s in shots] == [True, False, False]
        assert [s.error for s in shots[1:]] == ["client cap", "client cap"]
        assert seen == [b"a"] and wall > 0
        shots, _ = await open_loop(f"http://127.0.0.1:{port}", [b"c"], [0.0, 0.01, 0.02])
        assert all(s.ok for s in shots) and seen[1:] == [b"c", b"c", b"c"]
    finally:
        await helper
        await runner.cleanup()
